"""``attn-harness bench``: argument parsing, usage checks, progress and the final table.

Everything that can be wrong with the command line (an unknown workload or
backend, a device that is not there, an output path that cannot be
written) is checked before anything runs, and answered with exit code 2
and one line, never a traceback. Exit 1 means some case failed (or nothing
passed), 0 that every case passed or was unsupported.

``--shard K/N`` runs one share of the sweep (``harness.bench.sweep_plan``) and
writes a shard's file, which ``harness.results.merge`` combines with the
others. A shard dealt no cases (N above the sweep's case count) still writes
its (empty) file, so the merge sees every shard ran, says so on one line and
exits 0: it is a result, not a failure.

``add_bench_command(subparsers)`` registers the subcommand on the main
parser; ``main(argv)`` runs it standalone (``python -m harness.cli.bench``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from harness.bench.table import render
from harness.cli.usage import (
    UsageError,
    check_machine,
    command_parser,
    resolve_backends,
    workloads,
    writable,
)
from harness.core.arg_types import (
    OneLineParser,
    device,
    output_file,
    positive_float,
    positive_int,
    shard,
)
from harness.core.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from harness.core.text_table import aligned
from harness.processes.progress_file import report_progress

# Only the standard library at import time: ``attn-harness --help`` builds this
# parser, and torch (which every module running a benchmark imports) takes seconds
# to load. Those modules are imported inside ``cmd_bench`` and the renderers.
if TYPE_CHECKING:
    from harness.bench.runner import BenchConfig
    from harness.bench.workloads import Workload
    from harness.core.registry import BackendEntry
    from harness.results.store import RunRecord

# harness.bench.workloads.DEFAULT_WORKLOADS and harness.bench.timing.TimingConfig's defaults,
# spelled out so that the help needs no torch (a test keeps them equal)
DEFAULT_WORKLOAD_NAMES = ("decode-sweep", "prefill-sweep", "extend", "mixed", "dp-scaling")
DEFAULT_MIN_SAMPLES, DEFAULT_MAX_SAMPLES = 5, 100
DEFAULT_BUDGET_S, DEFAULT_TARGET_CI = 1.0, 0.05
DEFAULT_TIMEOUT_S = 600.0


def add_bench_command(subparsers: Any) -> None:
    """Register ``bench`` on the ``attn-harness`` subparsers (imports no torch)."""
    p = subparsers.add_parser(
        "bench",
        help="time backends on named workloads, each case checked against the oracle first",
        description=(
            "Check every case against the float64 oracle, then time prepare and forward "
            "(validation off) beside torch SDPA over the same tokens held contiguously. "
            "A backend that fails the check is reported with its status and not timed. "
            "Exit 0: all cases passed or unsupported; 1: a case failed; 2: bad usage."
        ),
    )
    p.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="SPEC",
        help="backend to run: a registered name, 'package.module:Class' or "
        "'path/to/file.py:Class' (repeatable; default: every registered backend)",
    )
    p.add_argument(
        "--workload",
        action="append",
        default=[],
        metavar="NAME",
        help="workload to run (repeatable; see --list-workloads; default: "
        f"{', '.join(DEFAULT_WORKLOAD_NAMES)})",
    )
    p.add_argument(
        "--list-workloads",
        action="store_true",
        help="list the workloads (version, kind, number of cases) and exit (default: off)",
    )
    p.add_argument(
        "--device",
        type=device,
        default="cpu",
        metavar="{cpu,cuda}",
        help="device the cases run and are timed on (default: cpu)",
    )
    p.add_argument(
        "--size",
        choices=("cpu", "gpu"),
        default=None,
        help="workload size: cpu (small) or gpu (bf16, long contexts) "
        "(default: gpu on --device cuda, else cpu)",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="run every case in this dtype instead of its own; a case so changed is named "
        "with the dtype, e.g. 'ctx=512 [bfloat16]' (default: each case's own: float32 at "
        "the cpu size, bfloat16 at the gpu size)",
    )
    p.add_argument(
        "--out",
        type=output_file,
        metavar="FILE",
        help="write the results file (JSON, schema version 1: environment, ceilings, "
        "every raw sample) here, atomically, after every case: marked partial until the "
        "last, so an interrupted run keeps what it finished (default: the table only)",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="intra-op threads for every timing (default: torch's current count)",
    )
    p.add_argument(
        "--budget",
        type=positive_float,
        default=DEFAULT_BUDGET_S,
        metavar="SECONDS",
        help="wall-clock budget for timing each forward; sampling stops when it is spent "
        f"(after --min-samples) (default: {DEFAULT_BUDGET_S})",
    )
    p.add_argument(
        "--min-samples",
        type=positive_int,
        default=DEFAULT_MIN_SAMPLES,
        metavar="N",
        help="timed forward calls taken before any stopping rule is checked; at least "
        f"{DEFAULT_MIN_SAMPLES} (default: {DEFAULT_MIN_SAMPLES})",
    )
    p.add_argument(
        "--max-samples",
        type=positive_int,
        default=DEFAULT_MAX_SAMPLES,
        metavar="N",
        help="most timed forward calls per case and backend, even if the CI has not converged and "
        f"budget is left; not below --min-samples (default: {DEFAULT_MAX_SAMPLES})",
    )
    p.add_argument(
        "--target-ci",
        type=positive_float,
        default=DEFAULT_TARGET_CI,
        metavar="FRACTION",
        help="stop sampling once the median's 95%% CI is this narrow relative to the "
        f"median (default: {DEFAULT_TARGET_CI:g})",
    )
    p.add_argument(
        "--warm-cache",
        action="store_true",
        help="do not flush the caches between timed calls (default: flush, cold cache)",
    )
    p.add_argument(
        "--cuda-graph",
        action="store_true",
        help="time CUDA-graph replays, for small kernels; needs backends claiming graph "
        "mode (default: off, plain calls)",
    )
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="deadline for each (case, backend) check and timing; past it the case is "
        f"TIMEOUT (default: {DEFAULT_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--shard",
        type=shard,
        default=None,
        metavar="K/N",
        help="run only shard K of N of the cases (each case whole, with its peer and every "
        "backend; dealt by estimated cost, the same on every machine) and mark --out as that "
        "shard's file, for 'attn-harness merge' (default: every case)",
    )
    p.add_argument(
        "--no-probe",
        action="store_true",
        help="skip measuring the device ceilings; use datasheet figures only (default: probe)",
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar on stderr (default: show one)",
    )
    p.set_defaults(func=cmd_bench)


# -- output --------------------------------------------------------------------------


def render_workloads(workloads: list[Workload]) -> str:
    rows = [["name", "version", "kind", "cpu cases", "gpu cases", "default", "description"]]
    for w in workloads:
        rows.append(
            [
                w.name,
                str(w.version),
                w.kind,
                str(len(w.cpu)),
                str(len(w.gpu)),
                "yes" if w.name in DEFAULT_WORKLOAD_NAMES else "",
                w.description,
            ]
        )
    return "\n".join(aligned(rows))


class Progress:
    """A live bar on a terminal (rich's, as ``attn-harness conform`` draws); else, and
    without rich (optional: ``attn-harness[live]``), one plain ``[done/total] case`` line
    per step, for a log. Each step also goes to the progress file a parent named
    (``harness.processes.progress_file``): what the main job reads."""

    def __init__(self, enabled: bool, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self._plain = not self.stream.isatty() or importlib.util.find_spec("rich") is None
        self._bar: Any = None
        self._task: Any = None

    def __call__(self, done: int, total: int, label: str) -> None:
        report_progress(done, total, label=label)  # for a parent that follows this run
        if not self.enabled:
            return
        if self._plain:
            print(f"[{done}/{total}] {label}", file=self.stream, flush=True)
            return
        if self._bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            console = Console(file=self.stream)
            columns = (
                TextColumn("bench"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
            )
            self._bar = Progress(*columns, console=console, transient=True)
            self._task = self._bar.add_task("", total=total)
            self._bar.start()
        self._bar.update(self._task, completed=done, total=total, description=label)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


# -- the command -------------------------------------------------------------------


def _check_usage(args: argparse.Namespace) -> tuple[list[BackendEntry], list[Workload]]:
    """The backends and workloads asked for, once every value has been checked."""
    found = workloads(args.workload)
    # --list-workloads needs no backend: the registered ones are not loaded for it
    backends = (
        resolve_backends(args.backend, device=args.device)
        if args.backend or not args.list_workloads
        else []
    )
    if args.max_samples < args.min_samples:
        raise UsageError(
            f"--max-samples ({args.max_samples}) is below --min-samples ({args.min_samples})"
        )
    writable(args.out, "--out")
    return backends, found


def _config(args: argparse.Namespace) -> BenchConfig:
    from harness.bench.runner import BenchConfig
    from harness.bench.timing import TimingConfig

    try:
        timing = TimingConfig(
            min_samples=args.min_samples,
            max_samples=args.max_samples,
            budget_s=args.budget,
            target_rel_ci=args.target_ci,
            cold_cache=not args.warm_cache,
            cuda_graph=args.cuda_graph,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return BenchConfig(
        device=args.device,
        size=args.size,
        dtype=args.dtype,
        threads=args.threads,
        timing=timing,
        case_timeout_s=args.timeout,
        probe_ceilings=not args.no_probe,
        shard=args.shard,
    )


class ResultsNotSaved(Exception):
    """Writing the results file failed: the run stops rather than time cases it cannot keep."""


class KeptCases:
    """``run_benchmarks``'s ``keep``: the record saved to ``path`` after every case."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.cases = 0  # the cases in the file now

    def __call__(self, record: RunRecord) -> None:
        from harness.results.store import ResultsError, save_results

        if self.path is None:
            return
        try:
            save_results(record, self.path)
        except (ResultsError, OSError) as exc:
            raise ResultsNotSaved(str(exc)) from exc
        self.cases = len({(case.workload, case.case) for case in record.cases})

    def interrupted(self, planned: int) -> str:
        if self.path is None:
            return "interrupted; no results written (no --out)"
        if not self.cases:
            return "interrupted before the first case finished; nothing written"
        return (
            f"interrupted after {self.cases} of {planned} cases; "
            f"those {self.cases} are in {self.path}, marked partial"
        )


def cmd_bench(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    # torch and everything that runs a benchmark load here, not when the parser is built
    from harness.bench import run_results, sweep_plan
    from harness.bench import runner as bench
    from harness.bench.workloads import list_workloads

    backends, chosen = _check_usage(args)  # a UsageError: one line, exit 2 (cli.main)
    config = _config(args)
    if args.list_workloads:
        print(render_workloads(list_workloads()))
        return EXIT_OK
    try:
        sweep = sweep_plan.sweep_header(backends, chosen, config)
    except ValueError as exc:
        raise UsageError(f"--shard: {exc}") from None
    progress = Progress(enabled=not args.no_progress)
    kept = KeptCases(args.out)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # a backend's prints stay out of the table
            record = bench.run_benchmarks(
                backends,
                chosen,
                config,
                progress=progress,
                command=list(argv) if argv is not None else sys.argv,
                keep=kept,
            )
    except KeyboardInterrupt:
        planned = len(sweep_plan.planned(backends, chosen, config))
        print(f"\nattn-harness bench: {kept.interrupted(planned)}", file=sys.stderr)
        return 130
    except ResultsNotSaved as exc:
        print(f"\nattn-harness bench: error: results not saved: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        progress.close()
    if sweep is not None:
        ran = len({(c.workload, c.workload_version, c.case) for c in record.cases})
        line = f"shard {args.shard}: {ran} of the sweep's {len(sweep['cases'])} cases"
        if not ran:  # N above the case count: nothing to time, and nothing failed
            print(f"{line}: no cases (the others' shards hold them all)")
            if args.out is not None:
                print(f"results written to {args.out}")
            return EXIT_OK
    print(render(record))
    if sweep is not None:
        print(line)
    if args.out is not None:
        print(f"results written to {args.out}")
    return EXIT_FAILED if run_results.failed(record) else EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """A parser with only ``bench``: for running this module on its own."""
    parser = OneLineParser(prog="attn-harness")
    add_bench_command(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_machine(command_parser(parser, "bench"), args)
        return int(cmd_bench(args, argv))
    except UsageError as exc:
        print(f"attn-harness bench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
