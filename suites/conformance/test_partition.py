"""Property 1: the DP partition, as the backend keeps it.

Every rank of a group shares one pool and runs consecutive steps (prefill,
extend, decode), interleaved; each writes only its own slots and reads only
its own pages. (The partition function itself, ``harness.dp_page_range``, is
the harness's, and is tested in the harness's unit tests.)
"""

from hypothesis import given
from hypothesis import strategies as st

from harness.conformance.properties import check_partition_respected
from suites.conformance.conftest import check, conformance_settings, draw_ranks


@conformance_settings
@given(data=st.data())
def test_each_rank_keeps_to_its_pages(backend_entry, data) -> None:
    check(check_partition_respected, backend_entry, draw_ranks(data, backend_entry))
