"""``attn-harness dist``: real DP, one process per rank, checked against the oracle."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness.core.arg_types import (
    at_least,
    dtype,
    integer,
    output_file,
    positive_float,
    positive_int,
    torch_device,
)
from harness.core.atomic_file import write_json_atomically
from harness.core.exit_codes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from harness.dist.faults import Fault


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
    p.add_argument("--dp-size", type=positive_int, required=True, help="number of ranks")
    p.add_argument(
        "--backend", required=True, help="registered name, module:Class or path.py:Class"
    )
    p.add_argument("--steps", type=positive_int, default=8, help="engine steps (default 8)")
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=120.0,
        help="seconds without progress before the run is ended as hung (default 120)",
    )
    p.add_argument("--seed", type=integer, default=0)
    p.add_argument("--dtype", default="float32", type=dtype, metavar="{float32,float16,bfloat16}")
    p.add_argument(
        "--device", default="cpu", type=torch_device, help="cpu, cuda or cuda:N (default cpu)"
    )
    p.add_argument(
        "--graph",
        action="store_true",
        help="graph mode: every step padded to the captured size (1, 2, 4, 8, 16, 32, ...)",
    )
    p.add_argument("--dist-backend", default="auto", choices=("auto", "gloo", "nccl"))
    p.add_argument(
        "--nnodes",
        type=positive_int,
        default=1,
        help="hosts the ranks are spread over (default 1); start this command on each, with "
        "the same arguments and its own --node-rank",
    )
    p.add_argument(
        "--node-rank",
        type=at_least(0),
        default=0,
        help="this host's place, 0..nnodes-1 (default 0); node 0 holds the rendezvous",
    )
    p.add_argument(
        "--master",
        type=_master,
        default=None,
        metavar="HOST:PORT",
        help="the rendezvous: node 0's address and a free port on it, reachable from every "
        "host (needed with --nnodes > 1; one host: a free port on 127.0.0.1)",
    )
    p.add_argument(
        "--json", type=output_file, metavar="FILE", help="write the run's summary as JSON"
    )
    p.add_argument(
        "--inject",
        action="append",
        default=[],
        type=_fault,
        metavar="KIND@RANK:STEP",
        help="plant a fault, to test the harness itself: raise, hang, kill, count-length, "
        "negative-count or overclaim",
    )
    p.set_defaults(func=cmd_dist)


def _fault(text: str) -> str:
    """A ``--inject`` value whose form is right (its rank and step are checked against the run)."""
    try:
        Fault.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _master(text: str) -> tuple[str, int]:
    from harness.dist.rendezvous import NodePlan

    try:
        return NodePlan.parse_master(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def node_plan(args: argparse.Namespace) -> Any:
    """This host's ``NodePlan`` from ``--nnodes``/``--node-rank``/``--master``."""
    from harness.dist.rendezvous import NodePlan

    host, port = args.master if args.master is not None else ("127.0.0.1", 0)
    return NodePlan(args.nnodes, args.node_rank, host, port)


def _error(command: str, problem: str) -> int:
    print(f"attn-harness {command}: error: {problem}", file=sys.stderr)
    return EXIT_USAGE


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


def _usage_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the command line, found before any rank starts."""
    from harness.core.atomic_file import unwritable_reason
    from harness.dist.group import group_problem

    if args.nnodes > 1 and args.master is None:
        return f"--nnodes {args.nnodes} needs --master HOST:PORT (node 0's address, a free port)"
    if args.node_rank >= args.nnodes:
        return f"--node-rank {args.node_rank} is outside 0..{args.nnodes - 1}"
    if args.dp_size < args.nnodes:
        return f"--dp-size {args.dp_size} < --nnodes {args.nnodes}: a host would run no rank"
    if args.master is not None and args.master[1] == 0:
        return "--master needs a port other than 0"
    for text in args.inject:
        fault = Fault.parse(text)
        if fault.rank >= args.dp_size:
            return f"--inject {text}: rank {fault.rank} >= dp_size {args.dp_size}"
        if not 1 <= fault.step <= args.steps:
            return f"--inject {text}: step {fault.step} is outside the run's steps 1..{args.steps}"
    if args.json is not None:
        problem = unwritable_reason(args.json)
        if problem is not None:
            return f"--json {args.json}: {problem}"
    ranks_here = len(node_plan(args).ranks(args.dp_size))
    return group_problem(args.dist_backend, args.device, ranks_here) or _claim_problem(args)


def _claim_problem(args: argparse.Namespace) -> str | None:
    """A backend that cannot load, or whose claim leaves this run out: as each rank would find."""
    from harness.cli.usage import UsageError, resolve_backends
    from harness.dist.claims import claim_problems, fit_claim
    from harness.dist.group import rank_device
    from harness.dist.schedule import DistSetup

    try:
        (entry,) = resolve_backends([args.backend])
    except UsageError as exc:
        return str(exc)
    setup = DistSetup(
        dp_size=args.dp_size,
        steps=args.steps,
        seed=args.seed,
        dtype=args.dtype,
        device=rank_device(args.device, 0),
        graph=args.graph,
    )
    s = fit_claim(setup, entry.capabilities)
    problems = claim_problems(
        entry,
        dtype=s.torch_dtype,
        device=s.device,
        dp_sizes=[args.dp_size],
        page_size=s.page_size,
        head_dim=s.head_dim,
        longest=s.longest,
        padding=s.graph,
    )
    if problems:
        return f"backend {entry.name!r} cannot run this: {'; '.join(problems)}"
    return None


def cmd_dist(args: argparse.Namespace) -> int:
    from harness.dist.launcher import Terminated, launch
    from harness.dist.rendezvous import RendezvousError

    problem = _usage_problem(args)
    if problem is not None:
        return _error("dist", problem)
    plan = node_plan(args)
    hosts = ""
    if args.nnodes > 1:
        ranks = plan.ranks(args.dp_size)
        hosts = (
            f" over {args.nnodes} hosts (node {args.node_rank} of {args.nnodes}: ranks "
            f"{ranks.start}-{ranks.stop - 1}; rendezvous {args.master[0]}:{args.master[1]})"
        )
    print(
        f"dist: {args.dp_size} ranks of {args.backend!r}{hosts}, {args.steps} steps, "
        f"seed {args.seed}",
        flush=True,
    )
    try:
        with tempfile.TemporaryDirectory(prefix="attn-harness-dist-") as run_dir:
            outcome = launch(
                worker_args(args), args.dp_size, Path(run_dir), timeout=args.timeout, plan=plan
            )
    except (KeyboardInterrupt, Terminated) as exc:
        print(f"dist: interrupted ({str(exc) or 'SIGINT'}); every rank on this host was killed")
        return EXIT_INTERRUPTED
    except RendezvousError as exc:
        return _error("dist", str(exc))
    summary = outcome.summary or {}
    checked = summary.get("checked_steps", 0)
    if outcome.exit_code == EXIT_OK and not checked:
        outcome.exit_code = EXIT_FAILED
        outcome.message = "no step was checked: no rank had tokens in any step (try more --steps)"
    if outcome.exit_code == EXIT_OK:
        print(
            f"PASSED: {args.dp_size} ranks{' on ' + str(args.nnodes) + ' hosts' if hosts else ''}"
            f", {checked} of {args.steps} steps checked against "
            f"the float64 oracle and the shared pool ({args.steps - checked} had no tokens "
            f"anywhere) in {outcome.seconds:.1f} s; padding {summary.get('padding', '?')}; "
            "no process left"
        )
    else:
        print(f"FAILED: {outcome.message}")
        rank = outcome.failed_rank
        if rank is not None and outcome.logs.get(rank) and outcome.exit_code != EXIT_USAGE:
            print(f"--- last lines of rank {rank}'s output ---\n{outcome.logs[rank]}")
        print(f"ended in {outcome.seconds:.1f} s; processes left: {outcome.survivors or 'none'}")
    if args.json is not None:
        _write_json(args.json, outcome)
    return outcome.exit_code


def _write_json(path: Path, outcome: Any) -> None:
    record = {
        "exit_code": outcome.exit_code,
        "message": outcome.message,
        "seconds": outcome.seconds,
        "pids": outcome.pids,
        "survivors": outcome.survivors,
        "failed_rank": outcome.failed_rank,
        "failed_step": outcome.failed_step,
        "hung": outcome.hung,
        "summary": outcome.summary,
    }
    write_json_atomically(path, record, indent=2)


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
    p.add_argument("--sequences", type=positive_int, default=16, help="global decode batch")
    p.add_argument("--context", type=positive_int, default=512, help="context length of each")
    p.add_argument("--steps", type=at_least(5), default=20, help="timed steps per dp size (>= 5)")
    p.add_argument("--warmup", type=at_least(0), default=3, help="untimed steps first")
    p.add_argument("--dtype", default="float32", type=dtype, metavar="{float32,float16,bfloat16}")
    p.add_argument("--device", default="cpu", type=torch_device, help="cpu, cuda or cuda:N")
    p.add_argument("--timeout", type=positive_float, default=120.0)
    p.add_argument("--out", type=output_file, required=True, help="results file to write")
    p.set_defaults(func=cmd_dist_bench)


def _bench_problem(args: argparse.Namespace, load: Any) -> str | None:
    """What stops the sweep before it starts: the output, the group, the backend's claim."""
    from harness.cli.usage import UsageError, resolve_backends
    from harness.core.atomic_file import unwritable_reason
    from harness.dist.claims import claim_problems
    from harness.dist.group import group_problem

    problem = unwritable_reason(args.out)
    if problem is not None:
        return f"--out {args.out}: {problem}"
    if max(args.dp_sizes) > args.sequences:
        return f"--sequences {args.sequences} < dp size {max(args.dp_sizes)}: a rank with none"
    problem = group_problem("auto", args.device, max(args.dp_sizes))
    if problem is not None:
        return problem
    try:
        (entry,) = resolve_backends([args.backend])
    except UsageError as exc:
        return str(exc)
    spec = load.spec(1)
    problems = claim_problems(
        entry,
        dtype=spec.torch_dtype,
        device=args.device,
        dp_sizes=args.dp_sizes,
        page_size=load.page_size,
        head_dim=load.head_dim,
        longest=load.context,
    )
    if problems:
        return f"backend {entry.name!r} cannot run this: {'; '.join(problems)}"
    return None


def cmd_dist_bench(args: argparse.Namespace) -> int:
    from harness.core.text_table import aligned
    from harness.dist.scaling import ScalingLoad, sweep
    from harness.results.store import FAILING_STATUSES, save_results

    load = ScalingLoad(
        sequences=args.sequences,
        context=args.context,
        dtype=args.dtype,
        warmup=args.warmup,
        steps=args.steps,
    )
    problem = _bench_problem(args, load)
    if problem is not None:
        return _error("dist-bench", problem)
    record = sweep(
        args.backend,
        args.dp_sizes,
        load,
        device=args.device,
        timeout=args.timeout,
        command=["attn-harness", *sys.argv[1:]],
    )
    save_results(record, args.out)
    rates = {
        case.spec.get("dp_size"): (case.metrics or {}).get("tokens_per_s") for case in record.cases
    }
    single = rates.get(1)
    rows = [["dp_size", "status", "tokens/s", "vs dp=1", "step ms (median)"]]
    for case in record.cases:
        metrics = case.metrics or {}
        rate = metrics.get("tokens_per_s")
        rows.append([
            str(case.spec.get("dp_size")),
            case.status,
            f"{rate:.0f}" if rate else "-",
            f"{rate / single:.2f}x" if rate and single else "-",
            f"{metrics['median_s'] * 1e3:.2f}" if rate else "-",
        ])  # fmt: skip
    print("\n".join(aligned(rows)))
    print(f"wrote {args.out}")
    return EXIT_FAILED if any(c.status in FAILING_STATUSES for c in record.cases) else EXIT_OK
