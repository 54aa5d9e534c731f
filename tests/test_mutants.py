"""The conformance suite catches every planted bug and passes every built-in."""

from __future__ import annotations

import pytest

from suites.mutants.backends import MUTANTS
from suites.mutants.kill_matrix import (
    BUILTINS,
    SUBSUMED,
    Verdict,
    exclusive_catches,
    mutant_specs,
    run_suite,
)


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
    passed = [t for t, outcome in verdict.outcomes.items() if outcome == "passed"]
    assert len(passed) >= 17  # every property actually ran


def test_every_test_catches_a_bug_of_its_own_or_says_which_test_does(verdicts):
    tests = {t for v in verdicts.values() for t in v.outcomes}
    only = exclusive_catches(verdicts, mutant_specs())
    unexplained = sorted(t for t in tests if not only.get(t) and t not in SUBSUMED)
    assert not unexplained, f"no planted bug of their own and no note: {unexplained}"


@pytest.mark.parametrize(
    ("mutant", "test"),
    [
        ("ChecksOnlySlots", "test_foreign_block_table_entry_rejected"),
        ("ChecksOnlyBlockTable", "test_foreign_slot_rejected"),
        ("RejectsStaleEntries", "test_stale_block_table_entries_ignored"),
        ("ClearsBlockTablePadding", "test_inputs_unmodified_outputs_finite"),
    ],
)
def test_loophole_mutants_are_caught_by_their_property_alone(verdicts, mutant, test):
    spec = f"suites.mutants.backends:{mutant}"
    assert verdicts[spec].failed == (test,)


def test_refusing_what_it_claims_is_caught_everywhere_dp_is_drawn(verdicts):
    failed = set(verdicts["suites.mutants.backends:RefusesDpGroups"].failed)
    assert {"test_every_rank_matches_oracle", "test_each_rank_keeps_to_its_pages"} <= failed
