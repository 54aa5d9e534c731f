"""``attn-harness bench``: argument parsing, usage checks, progress and the final table.

Everything that can be wrong with the command line (an unknown workload or
backend, a device that is not there, an output path that cannot be
written) is checked before anything runs, and answered with exit code 2
and one line, never a traceback. Exit 1 means some case failed (or nothing
passed), 0 that every case passed or was unsupported.

``add_bench_command(subparsers)`` registers the subcommand on the main
parser; ``main(argv)`` runs it standalone (``python -m harness.bench_cli``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import torch

from harness.bench import BenchConfig, failed, run_benchmarks
from harness.errors import BackendLoadError
from harness.peer import PEER_NAME
from harness.registry import BackendEntry, default_registry
from harness.results import CaseRecord, ResultsError, RunRecord, check_writable, save_results
from harness.timing import TimingConfig
from harness.workloads import DEFAULT_WORKLOADS, Workload, get_workload, list_workloads

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A bad command line, found before anything runs."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def add_bench_command(subparsers: Any) -> None:
    """Register ``bench`` on the ``attn-harness`` subparsers."""
    p = subparsers.add_parser(
        "bench",
        help="time backends on named workloads, each case checked against the oracle first",
        description=(
            "Check every case against the float64 oracle, then time prepare and forward "
            "(validation off) beside torch SDPA over the same tokens held contiguously. "
            "Exit 0: all cases passed or unsupported; 1: a case failed; 2: bad usage."
        ),
    )
    p.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="SPEC",
        help="backend name, 'package.module:Class' or 'path/to/file.py:Class' "
        "(repeatable; default: all registered)",
    )
    p.add_argument(
        "--workload",
        action="append",
        default=[],
        metavar="NAME",
        help=f"workload name (repeatable; default: {', '.join(DEFAULT_WORKLOADS)})",
    )
    p.add_argument("--list-workloads", action="store_true", help="list the workloads and exit")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--size",
        choices=("cpu", "gpu"),
        default=None,
        help="workload size (default: gpu on --device cuda, else cpu)",
    )
    p.add_argument("--out", metavar="FILE", help="write the results (JSON schema v1) here")
    p.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        help="intra-op threads for every timing (default: torch's current count)",
    )
    p.add_argument(
        "--budget",
        type=_positive_float,
        default=1.0,
        metavar="SECONDS",
        help="time budget of each timed callable (default 1.0)",
    )
    p.add_argument("--min-samples", type=_positive_int, default=5)
    p.add_argument("--max-samples", type=_positive_int, default=100)
    p.add_argument(
        "--target-ci",
        type=_positive_float,
        default=0.05,
        metavar="FRACTION",
        help="stop once the median's CI is this narrow relative to it (default 0.05)",
    )
    p.add_argument(
        "--warm-cache", action="store_true", help="do not flush the caches between calls"
    )
    p.add_argument(
        "--cuda-graph", action="store_true", help="time CUDA-graph replays (small kernels)"
    )
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=600.0,
        metavar="SECONDS",
        help="per (case, backend) deadline (default 600)",
    )
    p.add_argument(
        "--no-probe", action="store_true", help="skip the ceiling probe (datasheet only)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_bench)


# -- output --------------------------------------------------------------------------


def format_ns(ns: float | None) -> str:
    if ns is None:
        return "-"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    for suffix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _row(case: CaseRecord) -> list[str]:
    median = ci = "-"
    if case.forward is not None:
        s = case.forward.summary()
        median = format_ns(s.median)
        ci = f"{format_ns(s.ci_low)} .. {format_ns(s.ci_high)}"
        if not case.valid:
            median = f"({median})"  # timed, but not a valid result
    m = case.metrics or {}
    ratio = m.get("ratio_to_peer")
    ratio_ci = m.get("ratio_to_peer_ci")
    shown_ratio = "-"
    if ratio is not None:
        shown_ratio = f"{ratio:.2f}x"
        if ratio_ci:
            shown_ratio += f" [{ratio_ci[0]:.2f}, {ratio_ci[1]:.2f}]"
    prepare = format_ns(case.prepare.summary().median) if case.prepare else "-"
    return [
        f"{case.workload}@{case.workload_version}",
        case.case,
        case.backend,
        case.status,
        median,
        ci,
        prepare,
        _rate(m.get("tokens_per_s")),
        "-" if "gbps" not in m else f"{m['gbps']:.3g}",
        "-" if "tflops" not in m else f"{m['tflops']:.3g}",
        _pct(m.get("bandwidth_fraction")),
        _pct(m.get("compute_fraction")),
        shown_ratio,
        "!" if case.flags else "",
    ]


HEADER = [
    "workload",
    "case",
    "backend",
    "status",
    "median",
    "95% CI",
    "prepare",
    "tok/s",
    "GB/s",
    "TFLOP/s",
    "%BW",
    "%FLOP",
    "x peer [CI]",
    "",
]


def render(record: RunRecord) -> str:
    """The readable summary printed at the end of a run."""
    lines = [_table([HEADER] + [_row(c) for c in record.cases])]
    for case in record.cases:
        if case.error and case.status != "PASSED":
            lines.append(f"{case.status}: {case.id}: {case.error}")
        lines.extend(f"flag: {case.id}: {flag}" for flag in case.flags)
    ceilings = record.ceilings.get(record.ceilings.get("used") or "", None)
    if ceilings:
        flops = ", ".join(
            f"{dtype} matmul {value / 1e9:.4g} GFLOP/s"
            for dtype, value in ceilings["matmul_flops"].items()
        )
        bandwidth = ceilings["memory_bandwidth"]
        shown = "-" if bandwidth is None else f"{bandwidth / 1e9:.4g} GB/s"
        lines.append(f"ceilings ({ceilings['source']}): copy {shown}; {flops}")
    overhead = record.timing.get("overhead") or {}
    lines.append(
        f"timing: {record.timing['clock']}, {record.timing['threads']} threads, cold cache "
        f"{'on' if record.timing['cold_cache'] else 'off'}, timer overhead "
        f"{format_ns(overhead.get('median_ns'))} (empty call); "
        f"'x peer' is time / {PEER_NAME} time"
    )
    counts: dict[str, int] = {}
    for case in record.cases:
        counts[case.status] = counts.get(case.status, 0) + 1
    lines.append("bench: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    return "\n".join(lines)


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
                "yes" if w.name in DEFAULT_WORKLOADS else "",
                w.description,
            ]
        )
    return _table(rows)


class Progress:
    """A tqdm bar on stderr when tqdm is installed, else one plain line per step."""

    def __init__(self, enabled: bool, stream: TextIO | None = None) -> None:
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self._bar: Any = None

    def __call__(self, done: int, total: int, label: str) -> None:
        if not self.enabled:
            return
        if self._bar is None:
            try:
                from tqdm import tqdm
            except ImportError:
                self._bar = False
            else:
                self._bar = tqdm(total=total, desc="bench", unit="case", file=self.stream)
        if self._bar is False:
            print(f"[{done}/{total}] {label}", file=self.stream, flush=True)
            return
        self._bar.set_postfix_str(label, refresh=False)
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar:
            self._bar.close()


# -- the command -------------------------------------------------------------------


def _check_usage(args: argparse.Namespace) -> tuple[list[BackendEntry], list[Workload]]:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            f"--device cuda: no CUDA device is available (torch {torch.__version__}, "
            f"built with CUDA {torch.version.cuda or 'no'})"
        )
    try:
        workloads = [get_workload(name) for name in (args.workload or DEFAULT_WORKLOADS)]
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    registry = default_registry()
    try:
        backends = [registry.resolve(s) for s in args.backend] if args.backend else None
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    except BackendLoadError as exc:
        raise UsageError(str(exc)) from None
    if backends is None:
        backends = registry.entries()
    if args.max_samples < args.min_samples:
        raise UsageError(
            f"--max-samples ({args.max_samples}) is below --min-samples ({args.min_samples})"
        )
    if args.out is not None:
        problem = check_writable(args.out)
        if problem is not None:
            raise UsageError(f"--out {args.out}: {problem}")
    return backends, workloads


def _config(args: argparse.Namespace) -> BenchConfig:
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
        threads=args.threads,
        timing=timing,
        case_timeout_s=args.timeout,
        probe_ceilings=not args.no_probe,
    )


def cmd_bench(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    if args.list_workloads:
        print(render_workloads(list_workloads()))
        return EXIT_OK
    try:
        backends, workloads = _check_usage(args)
        config = _config(args)
    except UsageError as exc:
        print(f"attn-harness bench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    progress = Progress(enabled=not args.no_progress)
    try:
        record = run_benchmarks(
            backends,
            workloads,
            config,
            progress=progress,
            command=list(argv) if argv is not None else sys.argv,
        )
    except KeyboardInterrupt:
        print("\nattn-harness bench: interrupted; no results written", file=sys.stderr)
        return 130
    finally:
        progress.close()
    print(render(record))
    if args.out is not None:
        try:
            save_results(record, args.out)
        except (ResultsError, OSError) as exc:
            print(f"attn-harness bench: error: results not saved: {exc}", file=sys.stderr)
            return EXIT_USAGE
        print(f"results written to {args.out}")
    return EXIT_FAILED if failed(record) else EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """A parser with only ``bench``: for running this module on its own."""
    parser = argparse.ArgumentParser(prog="attn-harness")
    add_bench_command(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(cmd_bench(args, argv))


if __name__ == "__main__":
    sys.exit(main())
