"""Property 8: the same inputs give bit-identical outputs on a second run."""

from hypothesis import given
from hypothesis import strategies as st

from harness.conformance.properties import check_deterministic
from suites.conformance.conftest import check, conformance_settings, draw_scenario


@conformance_settings
@given(data=st.data())
def test_second_run_is_bit_identical(backend_entry, data) -> None:
    check(check_deterministic, backend_entry, draw_scenario(data, backend_entry))
