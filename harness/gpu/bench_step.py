"""The GPU script's bench step, in its own process: each case timed, the file saved after each.

``harness.gpu.check`` starts it with the command ``bench_command`` builds,
under the step's time limit; ``bench_main`` reads that command line and
``run_bench_step`` takes the workloads' cases in turn, one ``run_benchmarks``
call each (the first probes the device ceilings), rewriting the results file
after every case, so a step cut short keeps every case it finished. No case
starts within ``BENCH_LAST_START_S`` of the limit.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.bench.runner import BenchConfig
    from harness.bench.workloads import Workload
    from harness.core.registry import BackendEntry
    from harness.results.store import RunRecord

BENCH_CASE_TIMEOUT_S = 60.0  # per (case, backend), check and timing: a first compile fits
BENCH_BUDGET_S = 0.5  # wall clock for timing one forward
BENCH_LAST_START_S = 20.0  # no bench case starts closer than this to the step's limit


def _interleaved(workloads: Sequence[Workload], size: str) -> list[tuple[int, int]]:
    """``(workload index, case index)``, the workloads' cases taken in turn."""
    columns = [[(w, c) for c in range(len(wl.cases(size)))] for w, wl in enumerate(workloads)]
    rows = itertools.zip_longest(*columns)
    return [pair for row in rows for pair in row if pair is not None]


def _remeasured(part: RunRecord, ceilings: dict[str, Any]) -> None:
    """Metrics and flags of ``part`` against ``ceilings`` (the first case's probe)."""
    from harness.bench.ceilings import RunCeilings
    from harness.bench.runner import case_metrics
    from harness.bench.workloads import CaseSpec

    run_ceilings = RunCeilings.from_json(ceilings)
    peer = next((c for c in part.cases if c.role == "peer" and c.valid), None)
    for case in part.cases:
        if not case.valid or case.forward is None:
            continue
        peer_forward = None if peer is None or case is peer else peer.forward
        spec = CaseSpec.from_json(case.spec)
        case.metrics, flags = case_metrics(spec, case.forward, run_ceilings, peer_forward)
        case.flags = list(flags)
    part.ceilings = ceilings


def run_bench_step(
    path: Path,
    entries: Sequence[BackendEntry],
    workloads: Sequence[Workload],
    config: BenchConfig,
    *,
    deadline_s: float,
    command: Sequence[str] = (),
) -> RunRecord | None:
    """Every case of ``workloads``, one ``run_benchmarks`` call each, saved after each.

    The first call probes the ceilings; later ones reuse them (their metrics
    are recomputed against the first's), so every case is measured against
    one ceiling. No case is started past ``deadline_s``.
    """
    from harness.bench.runner import run_benchmarks
    from harness.results.store import save_results

    size = config.workload_size
    started = time.monotonic()
    record: RunRecord | None = None
    parts: dict[tuple[int, int], list[Any]] = {}
    plan = _interleaved(workloads, size)
    for done, (w, c) in enumerate(plan):
        workload = workloads[w]
        spec = workload.cases(size)[c]
        if time.monotonic() - started > deadline_s:
            print(f"out of time: {len(plan) - done} cases not started", flush=True)
            break
        print(f"[{done + 1}/{len(plan)}] {workload.key}/{spec.name}", flush=True)
        single = replace(workload, cpu=(spec,), gpu=(spec,))
        part = run_benchmarks(
            entries,
            [single],
            replace(config, probe_ceilings=config.probe_ceilings and record is None),
            command=list(command),
        )
        if record is None:
            record = part
        else:
            _remeasured(part, record.ceilings)
        for case in part.cases:
            shown = case.error or (
                f"{case.forward.summary().median / 1e3:.1f} us" if case.forward else ""
            )
            kernel = f" [SDPA {case.sdpa_kernel}]" if case.sdpa_kernel else ""
            print(f"    {case.backend:24} {case.status:20} {shown}{kernel}", flush=True)
        parts[(w, c)] = part.cases
        record.cases = [case for key in sorted(parts) for case in parts[key]]
        record.partial = done + 1 < len(plan)  # valid at every save; partial until the last
        record.workloads = [
            {
                "name": wl.name,
                "version": wl.version,
                "size": size,
                "kind": wl.kind,
                "description": wl.description,
            }
            for wl in workloads
        ]
        save_results(record, path)
    return record


def bench_main(argv: Sequence[str] | None = None) -> int:
    """The bench step's own command line (run by ``main`` as a subprocess)."""
    import torch

    parser = argparse.ArgumentParser(prog="gpu_check bench step")
    parser.add_argument("out", type=Path)
    parser.add_argument("--workload", action="append", required=True)
    parser.add_argument("--backend", action="append", required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--deadline", type=float, required=True)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"no CUDA device is available (torch {torch.__version__}); nothing benchmarked")
        return 2
    if args.device == "cpu":  # Triton kernels on CPU tensors need its interpreter, chosen now
        from harness.core.triton_mode import interpret_triton_here

        interpret_triton_here()
    from harness.bench import runner as bench
    from harness.bench.runner import BenchConfig
    from harness.bench.timing import TimingConfig
    from harness.bench.workloads import get_workload
    from harness.core.registry import default_registry

    entries = [default_registry().resolve(name) for name in args.backend]
    config = BenchConfig(
        device=args.device,
        timing=TimingConfig(budget_s=BENCH_BUDGET_S),
        case_timeout_s=BENCH_CASE_TIMEOUT_S,
    )
    record = run_bench_step(
        args.out,
        entries,
        [get_workload(name) for name in args.workload],
        config,
        deadline_s=args.deadline,
        command=["python", "-m", "harness.gpu.check", *(argv or [])],
    )
    if record is None:
        return 1
    return 1 if bench.failed(record) else 0


def bench_command(
    out: Path,
    backends: Sequence[str],
    workloads: Sequence[str],
    limit: float,
    device: str = "cuda",
) -> list[str]:
    command = [
        sys.executable,
        "-c",
        "import sys; from harness.gpu.bench_step import bench_main; "
        "sys.exit(bench_main(sys.argv[1:]))",
        str(out / f"bench-{device}.json"),
        "--device",
        device,
        "--deadline",
        f"{max(limit - BENCH_LAST_START_S, 1.0):.0f}",
    ]
    for workload in workloads:
        command += ["--workload", workload]
    for backend in backends:
        command += ["--backend", backend]
    return command
