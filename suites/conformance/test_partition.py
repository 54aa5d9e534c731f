"""Property 1: the DP partition is disjoint, covering, balanced and deterministic."""

from hypothesis import given
from hypothesis import strategies as st

from harness.properties import check_partition
from suites.conformance.conftest import conformance_settings


@conformance_settings
@given(dp_size=st.integers(1, 8), extra=st.integers(0, 200))
def test_partition_is_disjoint_covering_balanced(dp_size: int, extra: int) -> None:
    check_partition(dp_size + extra, dp_size)
