"""Property 2: outputs match the oracle on every rank; ranks run together equal each alone."""

from hypothesis import given
from hypothesis import strategies as st

from harness.properties import (
    check_every_rank_matches_oracle,
    check_matches_oracle,
    check_ranks_together_equal_alone,
)
from suites.conformance.conftest import check, conformance_settings, draw_ranks, draw_scenario


@conformance_settings
@given(data=st.data())
def test_outputs_match_oracle(backend_entry, data) -> None:
    check(check_matches_oracle, backend_entry, draw_scenario(data, backend_entry))


@conformance_settings
@given(data=st.data())
def test_every_rank_matches_oracle(backend_entry, data) -> None:
    check(
        check_every_rank_matches_oracle,
        backend_entry,
        draw_ranks(data, backend_entry),
    )


@conformance_settings
@given(data=st.data())
def test_ranks_together_equal_each_alone(backend_entry, data) -> None:
    check(
        check_ranks_together_equal_alone,
        backend_entry,
        draw_ranks(data, backend_entry),
    )
