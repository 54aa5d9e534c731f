"""Each threshold mutant is exact just below its threshold and far off just past it.

This proves each planted bug is detectable at a shape the conformance suite
can draw: the oracle check fails by orders of magnitude, not by rounding.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from harness import PoolLayout
from harness.conformance.large_pool import large_pool_scenario, unavailable_reason
from harness.conformance.properties import check_large_pool_step
from harness.core.errors import PropertyFailure
from harness.core.registry import BackendEntry
from harness.numerics.scenario import Scenario, backend_for, check_outputs, run_scenario
from harness.numerics.tolerance import Comparison
from reference_backends.reference import ReferenceBackend
from suites.mutants import backends
from suites.mutants import thresholds as t
from suites.mutants.kill_matrix import mutant_specs

FAR_OFF = 100.0  # a triggered bug's worst error / bound: far beyond rounding
FAR_OFF_ONE_KEY_OF_4K = 10.0
"""One key of 4097 dropped in fp32 (``SplitKvMaxPartitions``): a weight of 1/4097 against
a bound that charges fp32 sums over 4097 keys ``3 sqrt(4097) u32``; measured 18.2x (50x
while the sums were charged once)."""

BASE = Scenario(num_heads=4, num_kv_heads=2, head_dim=16, page_size=16, num_layers=1)
DECODE_LONG = replace(BASE, num_heads=2, num_kv_heads=1, head_dim=8, page_size=256)


def decode(length: int, **kwargs) -> Scenario:
    """One long decode row (cheap: the oracle computes a single query)."""
    pages = length // DECODE_LONG.page_size + 2
    return replace(
        DECODE_LONG, context_lens=(length,), query_lens=(1,), total_pages=pages, **kwargs
    )


def prefill(length: int, **kwargs) -> Scenario:
    return replace(BASE, context_lens=(length,), query_lens=(length,), **kwargs)


def batch(rows: int) -> Scenario:
    return replace(BASE, context_lens=(3,) * rows, query_lens=(1,) * rows, total_pages=rows + 8)


def int16_pages(length: int, total_pages: int, layout: PoolLayout = PoolLayout.SHARED) -> Scenario:
    """Rank 1 of 2 with pages of one token: its first page is ``total_pages // 2``."""
    return replace(
        DECODE_LONG,
        layout=layout,
        page_size=1,
        total_pages=total_pages,
        dp_size=2,
        dp_rank=1,
        context_lens=(length,),
        query_lens=(1,),
    )


def dp(size: int, rank: int, layout: PoolLayout = PoolLayout.SHARED) -> Scenario:
    return replace(
        BASE,
        page_size=4,
        total_pages=11 * size + 3,  # does not divide by dp_size
        dp_size=size,
        dp_rank=rank,
        layout=layout,
        context_lens=(9, 14),
        query_lens=(1, 6),
    )


# mutant: (scenarios just below its threshold, scenarios just past it)
CASES: dict[type, tuple[list[Scenario], list[Scenario]]] = {
    t.SplitKvNoRescale: (
        [decode(256), prefill(256)],
        [decode(257), prefill(257)],
    ),
    t.SplitKvFloorPartitions: (
        [decode(256), decode(512)],
        [decode(257), decode(511)],
    ),
    t.SplitKvMaxPartitions: (
        [decode(4096)],
        [decode(4097)],
    ),
    t.QueryTileCausalOffset: (
        [prefill(64), replace(BASE, context_lens=(100,), query_lens=(64,))],
        [prefill(65), replace(BASE, context_lens=(100,), query_lens=(65,))],
    ),
    t.QueryTileCap128: (
        [prefill(128)],
        [prefill(129), replace(BASE, context_lens=(200,), query_lens=(129,))],
    ),
    t.HardcodedBlock16: (
        [replace(BASE, page_size=16, context_lens=(40, 33), query_lens=(1, 33))],
        [replace(BASE, page_size=17, context_lens=(17,), query_lens=(1,))],
    ),
    t.HeadDimCap128: (
        [replace(BASE, head_dim=128)],
        [replace(BASE, head_dim=129)],
    ),
    t.GqaPack8: (
        [replace(BASE, num_heads=16, num_kv_heads=2)],
        [replace(BASE, num_heads=18, num_kv_heads=2), replace(BASE, num_heads=32, num_kv_heads=1)],
    ),
    t.GridCap64: (
        [batch(64)],
        [batch(65)],
    ),
    t.SeqLenInt16: (
        [decode(32767)],
        [decode(32768)],
    ),
    t.PageIdInt16: (
        [int16_pages(8, 65518), int16_pages(8, 65518, PoolLayout.PER_RANK)],  # 32759..32766
        [int16_pages(10, 65518), int16_pages(10, 65518, PoolLayout.PER_RANK)],  # ..32768
    ),
    t.ElementOffsetInt32: (  # past its threshold only on a pool of 2^31+ elements: see below
        [decode(4097), int16_pages(10, 65518)],
        [],
    ),
    t.DpRank3Bits: (
        [dp(8, 7), dp(8, 7, PoolLayout.PER_RANK)],
        [dp(9, 8), dp(16, 9, PoolLayout.PER_RANK)],
    ),
}


def build(cls: type, s: Scenario) -> ReferenceBackend:
    return backend_for(BackendEntry(cls.__name__, cls, "spec"), s)


def run(cls: type, scenario: Scenario) -> list[Comparison]:
    inputs, outputs = run_scenario(lambda s: build(cls, s), scenario)
    return check_outputs(inputs, outputs)


def test_every_threshold_mutant_has_cases_and_is_in_the_catalogue():
    assert set(CASES) == set(t.THRESHOLD_MUTANTS)
    assert set(t.THRESHOLD_MUTANTS) <= set(backends.MUTANTS)
    specs = mutant_specs()
    for cls in t.THRESHOLD_MUTANTS:
        assert f"suites.mutants.thresholds:{cls.__name__}" in specs
        assert getattr(backends, cls.__name__) is cls  # the old spec form resolves too


@pytest.mark.parametrize("cls", list(CASES), ids=lambda c: c.__name__)
def test_exact_just_below_threshold(cls):
    for scenario in CASES[cls][0]:
        for check in run(cls, scenario):
            assert check.checked_tokens > 0
            assert check.passed, f"{scenario.describe()}: {check.describe()}"


@pytest.mark.parametrize("cls", list(CASES), ids=lambda c: c.__name__)
def test_far_off_just_past_threshold(cls):
    for scenario in CASES[cls][1]:
        checks = run(cls, scenario)
        assert not all(c.passed for c in checks), scenario.describe()
        worst = max(c.worst_ratio for c in checks)
        far = FAR_OFF_ONE_KEY_OF_4K if cls is t.SplitKvMaxPartitions else FAR_OFF
        assert worst > far, f"{scenario.describe()}: only {worst:.1f}x the bound"


SMALL = [
    replace(BASE, context_lens=(7, 12, 1, 20), query_lens=(1, 1, 1, 1)),
    replace(BASE, page_size=3, total_pages=60, context_lens=(9, 16, 11), query_lens=(4, 5, 2)),
    replace(BASE, page_size=5, context_lens=(5, 12, 3), query_lens=(5, 12, 3), dp_size=3),
    replace(dp(3, 2, PoolLayout.PER_RANK), num_layers=2, shuffle_pages=True),
    replace(BASE, num_heads=8, num_kv_heads=1, head_dim=13, causal=False),
]


@pytest.mark.parametrize("cls", t.THRESHOLD_MUTANTS, ids=lambda c: c.__name__)
def test_bit_identical_to_reference_on_small_shapes(cls):
    """Below every threshold a mutant is the reference, bit for bit."""
    for scenario in SMALL:
        _, expected = run_scenario(lambda s: build(ReferenceBackend, s), scenario)
        _, actual = run_scenario(lambda s: build(cls, s), scenario)
        for a, b in zip(actual, expected, strict=True):
            assert torch.equal(a, b), scenario.describe()


def test_int32_element_offsets_fail_only_past_2_31_elements():
    """``ElementOffsetInt32`` on the large-pool test's pool (untouched virtual memory)."""
    scenario = large_pool_scenario(ReferenceBackend.capabilities(), "cpu")
    assert scenario is not None
    reason = unavailable_reason(scenario)
    if reason is not None:
        pytest.skip(f"pool past 2^31 elements not run on this machine: {reason}")
    check_large_pool_step(BackendEntry("reference", ReferenceBackend, "builtin"), scenario)
    with pytest.raises(PropertyFailure, match="EXCEEDS bound"):
        check_large_pool_step(BackendEntry("int32", t.ElementOffsetInt32, "spec"), scenario)
