"""``attn-harness dist``: real DP, one process per rank, checked against the oracle."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from harness.dist.faults import Fault

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text}")
    return value


def add_dist_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "dist",
        help="run real DP: one process per rank over torch.distributed, checked against the oracle",
        description=(
            "Start DP_SIZE processes through torch.distributed (gloo on CPU, NCCL with a GPU "
            "per rank), each with its own page pool and requests drawn from the seed. Every "
            "step the ranks exchange token counts and pad to the group's maximum; rank 0 "
            "checks every rank's outputs against the float64 oracle and against the same "
            "requests in one process's shared pool. A rank that fails, hangs or dies ends "
            "the run within --timeout. Exit 0 passed, 1 failed, 2 could not run as asked."
        ),
    )
    p.add_argument("--dp-size", type=_positive, required=True, help="number of ranks")
    p.add_argument(
        "--backend", required=True, help="registered name, module:Class or path.py:Class"
    )
    p.add_argument("--steps", type=_positive, default=8, help="engine steps (default 8)")
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=120.0,
        help="seconds without progress before the run is ended as hung (default 120)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument(
        "--graph",
        action="store_true",
        help="graph mode: every step padded to the captured size (1, 2, 4, 8, 16, 32, ...)",
    )
    p.add_argument("--dist-backend", default="auto", choices=("auto", "gloo", "nccl"))
    p.add_argument("--json", type=Path, metavar="FILE", help="write the run's summary as JSON")
    p.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="KIND@RANK:STEP",
        help="plant a fault, to test the harness itself: raise, hang, kill, count-length, "
        "negative-count or overclaim",
    )
    p.set_defaults(func=cmd_dist)


def worker_args(args: argparse.Namespace) -> list[str]:
    out = [
        "--backend", args.backend,
        "--steps", str(args.steps),
        "--seed", str(args.seed),
        "--dtype", args.dtype,
        "--device", args.device,
        "--dist-backend", args.dist_backend,
    ]  # fmt: skip
    if args.graph:
        out.append("--graph")
    for fault in args.inject:
        out += ["--inject", fault]
    return out


def cmd_dist(args: argparse.Namespace) -> int:
    from harness.atomic_file import write_atomically
    from harness.dist.launcher import launch

    try:
        for fault in args.inject:
            parsed = Fault.parse(fault)
            if parsed.rank >= args.dp_size:
                raise ValueError(f"fault {fault}: rank {parsed.rank} >= dp_size {args.dp_size}")
    except ValueError as exc:
        print(f"attn-harness dist: error: {exc}")
        return EXIT_USAGE
    print(f"dist: {args.dp_size} ranks of {args.backend!r}, {args.steps} steps, seed {args.seed}")
    with tempfile.TemporaryDirectory(prefix="attn-harness-dist-") as run_dir:
        outcome = launch(worker_args(args), args.dp_size, Path(run_dir), timeout=args.timeout)
    if outcome.exit_code == EXIT_OK:
        summary = outcome.summary or {}
        print(
            f"PASSED: {args.dp_size} ranks, {len(summary.get('steps', []))} steps checked "
            f"against the float64 oracle and the shared pool in {outcome.seconds:.1f} s; "
            f"padding {summary.get('padding', '?')}; no process left"
        )
    else:
        print(f"FAILED: {outcome.message}")
        rank = outcome.failed_rank
        if rank is not None and outcome.logs.get(rank) and outcome.exit_code != EXIT_USAGE:
            print(f"--- last lines of rank {rank}'s output ---\n{outcome.logs[rank]}")
        print(f"ended in {outcome.seconds:.1f} s; processes left: {outcome.survivors or 'none'}")
    if args.json is not None:
        record = {
            "exit_code": outcome.exit_code,
            "message": outcome.message,
            "seconds": outcome.seconds,
            "pids": outcome.pids,
            "survivors": outcome.survivors,
            "failed_rank": outcome.failed_rank,
            "failed_step": outcome.failed_step,
            "summary": outcome.summary,
        }
        write_atomically(args.json, (json.dumps(record, indent=2) + "\n").encode())
    return outcome.exit_code


def _dp_sizes(text: str) -> list[int]:
    """``1-8`` or ``1,2,4,8``."""
    try:
        if "-" in text:
            low, high = (int(x) for x in text.split("-", 1))
            sizes = list(range(low, high + 1))
        else:
            sizes = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 1-8 or 1,2,4,8, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"dp sizes must be >= 1, got {text!r}")
    return sorted(set(sizes))


def add_dist_bench_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "dist-bench",
        help="DP scaling benchmark: a fixed global decode load over 1..8 rank processes",
        description=(
            "For each dp size, start that many rank processes (torch.distributed); each "
            "takes its share of a fixed global decode batch, checks one step against the "
            "float64 oracle, then times engine steps (token-count all-reduce, prepare, "
            "forward, barrier). Writes a results file that `attn-harness report` draws. "
            "Exit 0 all passed, 1 a case failed, 2 bad input."
        ),
    )
    p.add_argument(
        "--backend", required=True, help="registered name, module:Class or path.py:Class"
    )
    p.add_argument("--dp-sizes", type=_dp_sizes, default=_dp_sizes("1-8"), help="default 1-8")
    p.add_argument("--sequences", type=_positive, default=16, help="global decode batch")
    p.add_argument("--context", type=_positive, default=512, help="context length of each")
    p.add_argument("--steps", type=_positive, default=20, help="timed steps per dp size")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--timeout", type=_seconds, default=120.0)
    p.add_argument("--out", type=Path, required=True, help="results file to write")
    p.set_defaults(func=cmd_dist_bench)


def cmd_dist_bench(args: argparse.Namespace) -> int:
    import sys

    from harness.dist.scaling import ScalingLoad, sweep
    from harness.results import FAILING_STATUSES, check_writable, save_results
    from harness.text_table import aligned

    problem = check_writable(args.out)
    if problem is None and max(args.dp_sizes) > args.sequences:
        problem = f"--sequences {args.sequences} < dp size {max(args.dp_sizes)}: a rank with none"
    if problem is not None:
        print(f"attn-harness dist-bench: error: {problem}")
        return EXIT_USAGE
    load = ScalingLoad(
        sequences=args.sequences,
        context=args.context,
        dtype=args.dtype,
        warmup=args.warmup,
        steps=args.steps,
    )
    record = sweep(
        args.backend,
        args.dp_sizes,
        load,
        device=args.device,
        timeout=args.timeout,
        command=["attn-harness", *sys.argv[1:]],
    )
    save_results(record, args.out)
    rows = [["dp_size", "status", "tokens/s", "vs dp=1", "step ms (median)"]]
    first = None
    for case in record.cases:
        metrics = case.metrics or {}
        rate = metrics.get("tokens_per_s")
        if first is None and rate:
            first = rate
        rows.append([
            str(case.spec.get("dp_size")),
            case.status,
            f"{rate:.0f}" if rate else "-",
            f"{rate / first:.2f}x" if rate and first else "-",
            f"{metrics['median_s'] * 1e3:.2f}" if rate else "-",
        ])  # fmt: skip
    print("\n".join(aligned(rows)))
    print(f"wrote {args.out}")
    return EXIT_FAILED if any(c.status in FAILING_STATUSES for c in record.cases) else EXIT_OK
