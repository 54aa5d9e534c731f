"""Property 5: inputs (strided views too) stay unmodified; outputs finite, right shape and dtype."""

from hypothesis import given
from hypothesis import strategies as st

from harness.conformance.properties import check_inputs_unmodified
from suites.conformance.conftest import check, conformance_settings, draw_scenario


@conformance_settings
@given(data=st.data())
def test_inputs_unmodified_outputs_finite(backend_entry, data) -> None:
    check(
        check_inputs_unmodified,
        backend_entry,
        draw_scenario(data, backend_entry),
    )
