"""Benchmarks with variants: work counted from the window and the cache's dtype, the peer
computing the same attention, and an FP8 backend's stores checked before any timing."""

from __future__ import annotations

import pytest

from harness.bench.metrics import AttentionWork, keys_seen
from harness.bench.runner import BenchConfig, run_benchmarks
from harness.bench.timing import TimingConfig
from harness.bench.workloads import CaseSpec, Workload, get_workload
from harness.core.registry import BackendEntry
from reference_backends.reference import ReferenceBackend
from reference_backends.sdpa import SdpaBackend
from suites.mutants.variants import Fp8ScaleInvertedOnWrite


def _brute_keys(q: int, length: int, causal: bool, window: int | None) -> int:
    total = 0
    for p in range(length - q, length):
        for key in range(length):
            if causal and key > p:
                continue
            if window is not None and key <= p - window:
                continue
            total += 1
    return total


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [None, 1, 2, 5, 16, 40])
@pytest.mark.parametrize(("q", "length"), [(1, 1), (1, 30), (7, 30), (30, 30), (3, 4)])
def test_keys_seen_matches_counting_by_hand(q, length, causal, window):
    assert keys_seen(q, length, causal, window) == _brute_keys(q, length, causal, window)


def test_a_window_and_an_fp8_cache_shrink_the_bytes_an_ideal_kernel_moves():
    plain = AttentionWork(
        num_heads=32, num_kv_heads=8, head_dim=128, element_bytes=2,
        query_lens=(1,), seq_lens=(16384,),
    )  # fmt: skip
    windowed = AttentionWork(**{**plain.__dict__, "sliding_window": 4096})
    fp8 = AttentionWork(**{**plain.__dict__, "kv_element_bytes": 1})
    assert windowed.kv_read_bytes * 4 == plain.kv_read_bytes
    assert windowed.flops * 4 == plain.flops
    assert fp8.kv_read_bytes * 2 == plain.kv_read_bytes
    assert fp8.query_bytes == plain.query_bytes


def test_the_variants_workload_has_the_mistral_window_and_fp8_decode():
    workload = get_workload("variants")
    gpu = {c.name: c for c in workload.gpu}
    mistral = next(c for c in gpu.values() if c.sliding_window == 4096)
    assert max(mistral.context_lens) == 16384
    assert any(c.kv_cache_dtype == "fp8_e4m3" for c in workload.cpu + workload.gpu)
    spec = next(c for c in workload.cpu if c.kv_cache_dtype != "auto")
    assert spec.work().kv_element_bytes == 1
    assert CaseSpec.from_json(spec.to_json()) == spec


def test_a_bad_variant_in_a_case_spec_is_refused():
    with pytest.raises(ValueError, match="sliding_window"):
        CaseSpec("bad", (8,), (1,), sliding_window=0)


FAST = TimingConfig(warmup=1, min_samples=5, max_samples=5, cold_cache=False)
CONFIG = BenchConfig(timing=FAST, prepare_timing=FAST, probe_ceilings=False)


def _run(spec: CaseSpec, backends: list[type]) -> dict[str, str]:
    workload = Workload("tiny-variants", 1, "decode", "test", (spec,), (spec,))
    entries = [BackendEntry(cls.__name__, cls, "test") for cls in backends]
    record = run_benchmarks(entries, [workload], CONFIG)
    return {c.backend: c.status for c in record.cases}


FP8 = dict(kv_cache_dtype="fp8_e4m3", k_scale=0.05, v_scale=0.02)
SMALL = dict(num_heads=4, num_kv_heads=2, head_dim=16, page_size=4)


def test_fp8_and_window_cases_pass_for_correct_backends_and_their_peer():
    spec = CaseSpec("w", (300, 90), (1, 1), sliding_window=64, **SMALL, **FP8)
    statuses = _run(spec, [ReferenceBackend, SdpaBackend])
    assert len(statuses) == 3, statuses
    assert set(statuses.values()) == {"PASSED"}, statuses


def test_an_fp8_backend_storing_with_the_scale_inverted_is_incorrect_not_timed():
    spec = CaseSpec("w", (40,), (1,), **SMALL, **FP8)
    statuses = _run(spec, [Fp8ScaleInvertedOnWrite, ReferenceBackend])
    assert statuses["Fp8ScaleInvertedOnWrite"] == "INCORRECT_NUMERICAL"
    assert statuses["ReferenceBackend"] == "PASSED"  # after it, from caches as built
