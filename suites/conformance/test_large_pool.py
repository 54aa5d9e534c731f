"""A pool past 2^31 elements per K/V tensor, its top pages in use: where int32 offsets wrap.

Runs by default wherever the machine can hold the pool's untouched virtual
memory (each tensor 4 GiB in a 2-byte dtype), and says why where it cannot;
see ``harness.conformance.large_pool``.
"""

import pytest

from harness.conformance.large_pool import large_pool_scenario, unavailable_reason
from harness.conformance.properties import check_large_pool_step
from suites.conformance.conftest import check, current_device


def test_pool_past_32bit_offsets(backend_entry) -> None:
    scenario = large_pool_scenario(backend_entry.capabilities, current_device())
    if scenario is None:
        pytest.skip(
            f"{backend_entry.name} claims no shape this test can use (FP8-only, short contexts, "
            "or caches capped below 2^31 elements)"
        )
    reason = unavailable_reason(scenario)
    if reason is not None:
        pytest.skip(f"pool past 2^31 elements not run on this machine: {reason}")
    check(check_large_pool_step, backend_entry, scenario)
