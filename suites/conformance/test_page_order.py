"""Property 6: the physical order of a sequence's pages does not change its output."""

from hypothesis import given
from hypothesis import strategies as st

from harness.conformance.properties import check_page_order_irrelevant
from suites.conformance.conftest import check, conformance_settings, draw_scenario


@conformance_settings
@given(data=st.data())
def test_physical_page_order_is_irrelevant(backend_entry, data) -> None:
    check(
        check_page_order_irrelevant,
        backend_entry,
        draw_scenario(data, backend_entry),
    )
