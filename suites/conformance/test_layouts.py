"""Property 7: the per-rank and shared pool layouts give the same outputs."""

from hypothesis import given
from hypothesis import strategies as st

from harness.conformance.properties import check_layouts_agree
from suites.conformance.conftest import check, conformance_settings, draw_scenario


@conformance_settings
@given(data=st.data())
def test_per_rank_and_shared_layouts_agree(backend_entry, data) -> None:
    check(check_layouts_agree, backend_entry, draw_scenario(data, backend_entry))
