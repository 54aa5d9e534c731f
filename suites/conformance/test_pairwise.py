"""Pairs of dimensions at their boundaries together, reached by construction.

Each dimension reaching its edges somewhere does not make them meet (a page
size with contexts past a few thousand keys, thousands of sequences all long,
a long query under a sliding window, float16 with massive values). The steps
here are fixed, not drawn: ``harness.conformance.pair_coverage.covering_steps``
builds, for the backend's claim and the profile's cost limit, a few dozen
steps that together hold every claimed cell of every pair (``PAIRS``), extreme
counts with tiny heads (65,536+ sequences in one step among them). Each is
checked against the oracle; the coverage table counts their cells, and a run
that leaves a claimed cell unchecked fails.
"""

from attn_harness_pytest import profile_for
from harness.conformance.pair_coverage import covering_steps
from harness.conformance.properties import check_matches_oracle
from suites.conformance.conftest import check, current_device


def test_pairwise_steps_match_oracle(backend_entry) -> None:
    limit = profile_for(backend_entry).budget.production
    steps = covering_steps(backend_entry.capabilities, limit, current_device())
    assert steps, f"{backend_entry.name}'s claim leaves no pair of dimensions to check"
    for step in steps:
        check(check_matches_oracle, backend_entry, step)
