"""The GPU script's bench step, in its own process: each case timed, the file saved after each.

``harness.gpu.check`` starts it with the command ``bench_command`` builds,
under the step's time limit; ``bench_main`` reads that command line and
``run_bench_step`` runs the workloads' cases in turn through ``run_benchmarks``,
which rewrites the results file after every case (as ``attn-harness bench --out``
does), so a step cut short keeps every case it finished. No case starts within
``BENCH_LAST_START_S`` of the limit.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.bench.runner import BenchConfig
    from harness.bench.workloads import Workload
    from harness.core.registry import BackendEntry
    from harness.results.store import CaseRecord, RunRecord

BENCH_CASE_TIMEOUT_S = 60.0  # per (case, backend), check and timing: a first compile fits
BENCH_BUDGET_S = 0.5  # wall clock for timing one forward
BENCH_LAST_START_S = 20.0  # no bench case starts closer than this to the step's limit


def run_bench_step(
    path: Path,
    entries: Sequence[BackendEntry],
    workloads: Sequence[Workload],
    config: BenchConfig,
    *,
    deadline_s: float,
    command: Sequence[str] = (),
) -> RunRecord | None:
    """Every case of ``workloads``, the workloads taken in turn, saved after each.

    ``run_benchmarks`` does the work (its ``keep`` saves, marked partial until
    the last case); this prints each case's statuses as it ends, for the log.
    No case is started past ``deadline_s``. None when no case ran.
    """
    from harness.bench.runner import run_benchmarks, run_order
    from harness.results.store import save_results

    config = replace(config, interleave=True, last_start_s=deadline_s)
    planned = len(run_order(workloads, config))
    shown: set[str] = set()  # the records already printed

    def keep(record: RunRecord) -> None:
        save_results(record, path)
        new = [case for case in record.cases if case.id not in shown]
        for name in dict.fromkeys(f"{c.workload}@{c.workload_version}/{c.case}" for c in new):
            print(f"[{len(shown) // (len(entries) + 1) + 1}/{planned}] {name}", flush=True)
            for case in new:
                if f"{case.workload}@{case.workload_version}/{case.case}" == name:
                    print(_status_line(case), flush=True)
                    shown.add(case.id)

    record = run_benchmarks(entries, workloads, config, command=list(command), keep=keep)
    for flag in record.flags:
        if flag.startswith("out of time"):
            print(flag, flush=True)
    return record if record.cases else None


def _status_line(case: CaseRecord) -> str:
    timed = case.forward.summary().median / 1e3 if case.forward else None
    result = case.error or ("" if timed is None else f"{timed:.1f} us")
    kernel = f" [SDPA {case.sdpa_kernel}]" if case.sdpa_kernel else ""
    return f"    {case.backend:24} {case.status:20} {result}{kernel}"


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
    from harness.bench import run_results
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
    return 1 if run_results.failed(record) else 0


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
