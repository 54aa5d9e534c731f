"""Property 3: after a step, only the slots in ``slot_mapping`` changed, in that layer, anywhere."""

from hypothesis import given
from hypothesis import strategies as st

from harness.conformance.properties import check_only_mapped_slots_change
from suites.conformance.conftest import check, conformance_settings, draw_scenario


@conformance_settings
@given(data=st.data())
def test_only_mapped_slots_change(backend_entry, data) -> None:
    check(
        check_only_mapped_slots_change,
        backend_entry,
        draw_scenario(data, backend_entry),
    )
