"""The conformance suite catches every planted bug and passes every built-in."""

from __future__ import annotations

import pytest

from suites.mutants.backends import MUTANTS
from suites.mutants.kill_matrix import BUILTINS, Verdict, mutant_specs, run_suite


@pytest.fixture(scope="module")
def verdicts() -> dict[str, Verdict]:
    return run_suite([*BUILTINS, *mutant_specs()], profile="kill")


def test_catalogue_has_at_least_twelve_distinct_bugs():
    assert len(MUTANTS) >= 12
    assert len({cls.__doc__ for cls in MUTANTS}) == len(MUTANTS)


@pytest.mark.parametrize("spec", mutant_specs())
def test_mutant_is_caught(verdicts, spec):
    assert verdicts[spec].caught, f"{spec} survived the conformance suite"


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_passes_everything(verdicts, name):
    verdict = verdicts[name]
    assert not verdict.failed
    assert verdict.passed >= 20  # every property actually ran
