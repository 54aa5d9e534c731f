"""A run's options change its profile as documented, and only as documented."""

from __future__ import annotations

import pytest
from hypothesis import Phase

from harness.conformance.options import ConformanceOptions
from harness.conformance.profiles import get_profile
from harness.conformance.session import ConformanceSession


def _phases(profile: str, **options: object) -> set[Phase]:
    run = ConformanceSession(ConformanceOptions(profile=profile, **options))  # type: ignore[arg-type]
    return set(run.profile().settings.phases)


def test_the_kill_profile_shrinks_only_when_max_shrinks_asks():
    assert Phase.shrink not in _phases("kill")
    assert _phases("kill", max_shrinks=40) == _phases("kill") | {Phase.shrink}


@pytest.mark.parametrize("name", ["ci", "thorough"])
def test_max_shrinks_leaves_a_shrinking_profile_as_it_is(name):
    assert _phases(name, max_shrinks=40) == set(get_profile(name).settings.phases)


def test_max_shrinks_changes_nothing_but_the_phases():
    plain = ConformanceSession(ConformanceOptions(profile="kill")).profile()
    asked = ConformanceSession(ConformanceOptions(profile="kill", max_shrinks=40)).profile()
    assert asked.settings.max_examples == plain.settings.max_examples
    assert asked.settings.derandomize == plain.settings.derandomize
    assert (asked.production_examples, asked.stateful_examples, asked.stateful_steps) == (
        plain.production_examples,
        plain.stateful_examples,
        plain.stateful_steps,
    )
