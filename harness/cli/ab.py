"""``attn-harness ab``: two revisions of a backend timed in paired, interleaved rounds.

Both sides run in their own worker process on this machine, one at a time,
case by case and round by round, the order alternating; each case is
checked against the float64 oracle on both sides first. The verdict per case
comes from a sequential test on the paired per-round ratios
(``harness.ab.sequential``); the output is the gate's table, JUnit file and
exit codes (0 passed, 1 a case FAILed, 2 bad usage, 130 interrupted), and
``--out`` writes every round's raw samples.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.cli.usage import UsageError, resolve_backends, workloads, writable
from harness.core.arg_types import cpu_list, device, output_file, positive_float, positive_int
from harness.core.exit_codes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from harness.core.text_table import terminal_width, wrapped

if TYPE_CHECKING:  # the ab package loads only when ab runs
    from harness.ab.sides import WorkerSettings

DEFAULT_WORKLOADS = ("decode-sweep", "prefill-sweep", "extend", "mixed", "dp-scaling")


def add_ab_command(subparsers: Any) -> None:
    """Register ``ab`` on the ``attn-harness`` subparsers (imports no torch)."""
    p = subparsers.add_parser(
        "ab",
        help="compare two revisions of a backend in paired, interleaved rounds on this machine",
        description=(
            "Time a base and a candidate backend in alternating rounds (each side in its own "
            "process, each case checked against the float64 oracle on both first) until a "
            "sequential test decides every case: FAIL (slower by the threshold), IMPROVED, "
            "PASS (no change past it) or INCONCLUSIVE (undecided after --max-rounds). "
            "Exit 0: no case FAILed; 1: one did; 2: bad usage; 130: interrupted."
        ),
    )
    p.add_argument("--base", required=True, metavar="SPEC", help="the base side's backend")
    p.add_argument(
        "--candidate",
        metavar="SPEC",
        help="the candidate side's backend (default: the base's spec, at this checkout)",
    )
    p.add_argument(
        "--base-rev",
        metavar="REV",
        help="take the base's backend from this git revision of the project (a temporary "
        "worktree; e.g. HEAD~1, main, a commit) instead of this checkout",
    )
    p.add_argument(
        "--candidate-rev", metavar="REV", help="the same for the candidate (default: this checkout)"
    )
    p.add_argument(
        "--workload",
        action="append",
        default=[],
        metavar="NAME",
        help=f"workload to compare (repeatable; default: {', '.join(DEFAULT_WORKLOADS)})",
    )
    p.add_argument(
        "--case",
        action="append",
        default=[],
        metavar="TEXT",
        help="only the cases whose name contains TEXT (repeatable; default: every case)",
    )
    p.add_argument(
        "--threshold",
        type=positive_float,
        default=0.10,
        help="the slowdown to detect, as a fraction (default: 0.10)",
    )
    p.add_argument(
        "--alpha",
        type=positive_float,
        default=0.05,
        help="chance that unchanged code FAILs any case of the run (default: 0.05)",
    )
    p.add_argument(
        "--beta",
        type=positive_float,
        default=0.05,
        help="chance of missing a slowdown of exactly the threshold, per case (default: 0.05)",
    )
    p.add_argument("--min-rounds", type=positive_int, default=6, help="(default: 6)")
    p.add_argument(
        "--max-rounds",
        type=positive_int,
        default=60,
        help="rounds after which an open case is INCONCLUSIVE (default: 60)",
    )
    p.add_argument(
        "--samples",
        type=positive_int,
        default=5,
        help="forwards per side per round; the round's time is their median (default: 5)",
    )
    p.add_argument(
        "--time-budget",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="open no round after this long; cases still open are INCONCLUSIVE (default: none)",
    )
    p.add_argument("--device", type=device, default="cpu", metavar="{cpu,cuda}")
    p.add_argument("--size", choices=("cpu", "gpu"), default=None)
    p.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="torch's threads a side (default: 1 on the CPU, torch's own with cuda)",
    )
    p.add_argument(
        "--cpus",
        type=cpu_list,
        default=None,
        metavar="LIST",
        help="the CPUs both sides time on, pinned while timing (e.g. 1 or 0-3; default on "
        "the CPU: the last --threads usable CPUs; 'none': not pinned)",
    )
    p.add_argument(
        "--warm-cache",
        action="store_true",
        help="do not flush the last-level cache before each forward (default: flush, as bench)",
    )
    p.add_argument("--out", type=output_file, metavar="FILE", help="write every round here")
    p.add_argument("--junitxml", type=output_file, metavar="FILE", help="the gate's JUnit file")
    p.add_argument("-v", "--verbose", action="store_true", help="list every case")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=cmd_ab)


@contextlib.contextmanager
def _checkouts(revisions: dict[str, str | None]) -> Iterator[dict[str, Path | None]]:
    """A temporary worktree per side that names a revision (one per distinct commit)."""
    from harness.ab.sides import revision_checkout

    with contextlib.ExitStack() as stack:
        made: dict[str, Path] = {}
        roots: dict[str, Path | None] = {}
        for label, commit in revisions.items():
            if commit is None:
                roots[label] = None
                continue
            if commit not in made:
                made[commit] = stack.enter_context(revision_checkout(commit))
            roots[label] = made[commit]
        yield roots


def _checked(args: argparse.Namespace) -> None:
    """The values the parser's types let through but the plan cannot use, each by its option."""
    from harness.ab.rounds import MIN_SAMPLES

    for option, value in (("--alpha", args.alpha), ("--beta", args.beta)):
        if not value < 0.5:
            raise UsageError(f"{option} {value}: an error rate must lie in (0, 0.5)")
    if not args.threshold < 10.0:
        raise UsageError(f"--threshold {args.threshold}: a slowdown fraction must lie in (0, 10)")
    if args.min_rounds < 3:
        raise UsageError(
            f"--min-rounds {args.min_rounds}: need at least 3 (the spread needs rounds to be seen)"
        )
    if args.max_rounds < args.min_rounds:
        raise UsageError(f"--max-rounds {args.max_rounds}: below --min-rounds {args.min_rounds}")
    if args.samples < MIN_SAMPLES:
        raise UsageError(
            f"--samples {args.samples}: need at least {MIN_SAMPLES} (a round's median of fewer "
            "is one outlier away from wrong)"
        )


def _plan(args: argparse.Namespace) -> Any:
    from harness.ab.rounds import PairConfig
    from harness.ab.sequential import SequentialPlan

    _checked(args)
    plan = SequentialPlan(
        threshold=args.threshold,
        alpha=args.alpha,
        beta=args.beta,
        min_rounds=args.min_rounds,
        max_rounds=args.max_rounds,
    )
    return PairConfig(
        plan=plan,
        samples=args.samples,
        cold_cache=not args.warm_cache,
        time_budget_s=args.time_budget,
    )


def worker_settings(args: argparse.Namespace) -> WorkerSettings:
    """Threads and pinning for both sides: on the CPU one thread on the last usable CPU
    unless told otherwise (pinned, a decode case's rounds spread half as much here)."""
    from harness.ab.sides import WorkerSettings

    on_cpu = not args.device.startswith("cuda")
    threads = args.threads if args.threads is not None else (1 if on_cpu else None)
    if not hasattr(os, "sched_getaffinity"):  # not Linux: nothing to pin with
        return WorkerSettings(device=args.device, threads=threads, cpus=None)
    usable = sorted(os.sched_getaffinity(0))
    cpus = args.cpus
    if cpus is None and on_cpu:
        cpus = tuple(usable[-(threads or 1) :])
    if cpus == ():  # --cpus none
        cpus = None
    if cpus is not None:
        outside = sorted(set(cpus) - set(usable))
        if outside:
            raise UsageError(
                f"--cpus {','.join(map(str, cpus))}: CPU {outside[0]} is not one this process "
                f"may use ({','.join(map(str, usable))})"
            )
        if threads is not None and threads > len(cpus):
            raise UsageError(
                f"--threads {threads} on --cpus {','.join(map(str, cpus))}: more threads than "
                "CPUs would time the threads' contention"
            )
    return WorkerSettings(device=args.device, threads=threads, cpus=cpus)


def cmd_ab(args: argparse.Namespace) -> int:
    from harness.ab.record import make_record
    from harness.ab.rounds import prepare_cases, run_rounds
    from harness.ab.sides import SideError, SidePair, SideSpec, head_commit, resolve_revision
    from harness.bench.environment import fingerprint
    from harness.cli.gate import _closing, _printer, _table
    from harness.gate.junit import write_gate_junit
    from harness.results.pairs import save_pair

    config = _plan(args)
    chosen = workloads(args.workload or list(DEFAULT_WORKLOADS))
    writable(args.out, "--out")
    writable(args.junitxml, "--junitxml")
    size = args.size or ("gpu" if args.device.startswith("cuda") else "cpu")
    settings = worker_settings(args)
    specs = {}
    for label, backend, revision in (
        ("base", args.base, args.base_rev),
        ("candidate", args.candidate or args.base, args.candidate_rev),
    ):
        try:
            commit = resolve_revision(revision) if revision else None
        except SideError as exc:
            raise UsageError(f"--{label}-rev {revision}: {exc}") from None
        if commit is None:  # this checkout's backend: loadable here, checked before any worker
            resolve_backends([backend], f"--{label}")
        specs[label] = SideSpec(label, backend, revision, commit)
    plan = [
        (w, spec)
        for w in chosen
        for spec in w.cases(size)
        if not args.case or any(text in spec.name for text in args.case)
    ]
    if not plan:
        raise UsageError(
            f"--case {' '.join(args.case)}: no case of {', '.join(w.name for w in chosen)} "
            "has it in its name"
        )
    width = terminal_width()
    say = _printer(width)
    progress = (
        (lambda line: None)
        if args.no_progress
        else (lambda line: print(f"attn-harness ab: {line}", file=sys.stderr, flush=True))
    )
    started = time.monotonic()
    pair: SidePair | None = None
    try:
        with _checkouts({k: s.commit for k, s in specs.items()}) as roots:
            pair = SidePair(specs, roots, settings)
            try:
                sides = pair.start()
            except SideError as exc:
                raise UsageError(str(exc)) from None
            say(
                f"attn-harness ab: base {specs['base'].describe()} vs candidate "
                f"{specs['candidate'].describe()}; {len(plan)} cases; threshold "
                f"{args.threshold:.0%}; rounds of {args.samples} forwards a side, order "
                "alternating, each round in fresh processes"
            )
            described = {
                label: (specs[label], {"backend_class": side.backend_class, "source": side.source})
                for label, side in sides.items()
            }
            cases = prepare_cases(sides, plan, size, progress)
            run_rounds(sides, cases, config, progress, renew=(pair.start, size))
    except KeyboardInterrupt:
        if pair is not None:
            pair.close(at_once=True)  # the workers have their own process groups
        print("attn-harness ab: interrupted; no results written", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (SideError, OSError) as exc:
        print(f"attn-harness ab: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if pair is not None:
            pair.close()
    wall_s = time.monotonic() - started
    record = make_record(
        cases=cases,
        config=config,
        sides=described,
        environment=fingerprint(args.device, threads=settings.threads),
        timing={
            "device": args.device,
            "size": size,
            "threads": settings.threads,
            "cpus": list(settings.cpus) if settings.cpus is not None else None,
            "processes_per_side": pair.started if pair is not None else 0,
        },
        tool={"name": "attn-harness ab", "command": sys.argv, "checkout": head_commit()},
        wall_s=wall_s,
    )
    report = gate_report(record)
    for line in _table(report, args.verbose, width):
        print(line)
    rounds = [c.evidence.rounds for c in cases if c.evidence is not None]
    if rounds:
        say(
            f"rounds per compared case: {min(rounds)} to {max(rounds)} (median "
            f"{sorted(rounds)[len(rounds) // 2]}); {wall_s:.0f} s in all"
        )
    if args.out is not None:
        save_pair(record, args.out)
        print("\n".join(wrapped(f"paired results written to {args.out}", width)))
    if args.junitxml:
        write_gate_junit(report, args.junitxml)
    say(_closing(report).replace("attn-harness gate", "attn-harness ab"))
    return EXIT_FAILED if report.failed else EXIT_OK


def gate_report(record: Any) -> Any:
    """A paired comparison as the gate's report: the gate's table, JUnit file and exit code."""
    from harness.ab.sequential import SequentialPlan, weigh
    from harness.gate.compare import Change
    from harness.gate.verdicts import ORDER, CaseVerdict, GateReport
    from harness.results.pairs import rounds_log_ratios

    plan = SequentialPlan(**record.plan)
    compared = max(1, sum(1 for e in record.cases if e.get("rounds")))
    verdicts = []
    for entry in record.cases:
        change = None
        if entry.get("rounds"):
            evidence = weigh(rounds_log_ratios(entry), plan, compared)
            low, high = evidence.interval()
            change = Change(evidence.ratio, 1.0, evidence.ratio, low, high, 1, 1)
        verdicts.append(CaseVerdict(entry["key"], entry["verdict"], entry["detail"], change))
    verdicts.sort(key=lambda v: (ORDER.index(v.verdict), v.key))
    return GateReport(record.threshold, verdicts, notes=list(record.notes))
