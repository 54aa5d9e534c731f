"""MLA benchmarks: a workload times only MLA backends, checks each against the oracle first,
and counts one latent row per token; the contiguous peer serves MLA too."""

from __future__ import annotations

from harness.bench.runner import BenchConfig, run_benchmarks
from harness.bench.timing import TimingConfig
from harness.bench.workloads import MLA, CaseSpec, Workload, get_workload
from harness.core.registry import default_registry

QUICK = TimingConfig(warmup=1, min_samples=5, max_samples=5, budget_s=0.2)
SMALL = Workload(
    "mla-small",
    1,
    "decode",
    "two MLA decode cases at DeepSeek's latent width",
    cpu=(
        CaseSpec("ctx=40 x2", (40, 40), (1, 1), **MLA),
        CaseSpec("spec q=3 ctx=70", (70,), (3,), **MLA),
    ),
    gpu=(),
    attention="mla",
)


def test_an_mla_workload_times_only_mla_backends_and_they_pass():
    registry = default_registry()
    backends = [registry.resolve(n) for n in ("reference-mla", "compiled-mla", "compiled")]
    run = run_benchmarks(backends, [SMALL], BenchConfig(timing=QUICK, probe_ceilings=False))
    assert {c.backend for c in run.cases} == {"contiguous-sdpa", "reference-mla", "compiled-mla"}
    assert {c.status for c in run.cases} == {"PASSED"}
    compiled = next(c for c in run.cases if c.backend == "compiled-mla")
    spec = CaseSpec.from_json(compiled.spec)
    assert spec.work().kv_read_bytes == 80 * 576 * 4  # one float32 latent row per cached token


def test_the_mla_workloads_are_named_and_optional():
    for name in ("mla-decode-sweep", "mla-dp-scaling"):
        workload = get_workload(name)
        assert workload.attention == "mla"
        assert all(c.kv_lora_rank == 512 and c.head_dim == 576 for c in workload.cpu)
