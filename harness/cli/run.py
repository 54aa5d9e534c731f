"""``attn-harness run``: the main job's command line (parsing, progress and the closing lines)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from harness.cli.usage import UsageError, resolve_backends, workloads
from harness.conformance.plugin_names import PROFILE_NAMES
from harness.core.arg_types import at_least, device, one_of, output_dir, shard
from harness.core.exit_codes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK

DEFAULT_OUT = "reports/run"


def add_run_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "run",
        help="the main job: conformance of every backend, the benchmark workloads, then the "
        "report (index.html, summary.md, figures)",
        description="Run conformance (ci profile) of every registered backend in parallel "
        "worker processes, then the default benchmark workloads, then build the report. "
        "Files land in --out as each step finishes: conformance/NAME.xml (+ .log, "
        ".coverage.json), bench.json, bench.log, report/index.html. Exit 0 when every "
        "property held and every case passed, 1 otherwise, 2 for a usage error, 130 when "
        "interrupted.",
    )
    p.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="SPEC",
        help="backend name or spec (repeatable; default: every registered backend that "
        "claims the device)",
    )
    p.add_argument(
        "--out", default=DEFAULT_OUT, type=output_dir, metavar="DIR", help=f"default: {DEFAULT_OUT}"
    )
    p.add_argument("--device", default="cpu", type=device, metavar="cpu|cuda", help="default: cpu")
    p.add_argument(
        "--profile",
        default="ci",
        type=one_of("profile", PROFILE_NAMES),
        metavar="ci|thorough|kill",
        help="conformance profile (ci)",
    )
    p.add_argument(
        "--workers",
        type=at_least(1),
        default=None,
        metavar="N",
        help="conformance processes in all: one backend per process, and a backend's tests "
        "spread over the rest when there are more than backends (default: the CPUs this "
        "process may use)",
    )
    p.add_argument(
        "--workload",
        action="append",
        default=[],
        metavar="NAME",
        help="benchmark workload (repeatable; default: bench's defaults)",
    )
    p.add_argument("--no-bench", action="store_true", help="conformance and the report only")
    p.add_argument(
        "--shard",
        type=shard,
        default=None,
        metavar="K/N",
        help="run shard K of N: that share of every backend's conformance tests and of the "
        "benchmark cases, the same on every machine; attn-harness merge --out DIR combines "
        "the N shards' --out folders into the whole run's files and report",
    )
    p.set_defaults(func=cmd_run)


def _backends(specs: list[str], device: str) -> tuple[list[Any], list[str]]:
    """The entries to run, and the names of those left out (they claim no ``device``)."""
    from harness.core.registry import split_by_device

    entries = resolve_backends(specs, device=device)
    if specs:
        return entries, []
    entries, others = split_by_device(entries, device)
    if not entries:
        raise UsageError(f"no registered backend claims --device {device}")
    return entries, [e.name for e in others]


def cmd_run(args: argparse.Namespace) -> int:
    from harness.bench.environment import usable_cpus
    from harness.cli.run_jobs import (
        ConformanceJob,
        closing_verdict,
        file_stem,
        printer,
        probe_seconds,
        run_bench,
        run_conformance_jobs,
        schedule,
    )

    if args.device == "cpu":
        from harness.core.triton_mode import interpret_triton_here

        interpret_triton_here()  # before a backend module is imported for its capabilities
    # every value is checked before the out folder is made or any worker starts
    from harness.report import unavailable_reason

    missing = unavailable_reason()
    if missing is not None:
        raise UsageError(f"the main job ends in a report: {missing}")
    workloads(args.workload)
    entries, left_out = _backends(args.backend, args.device)
    say = printer(sys.stdout)
    shard_text = None if args.shard is None else str(args.shard)
    out = Path(args.out)
    conformance_dir = out / "conformance"
    try:
        conformance_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot create it: {exc.strerror or exc}") from None
    with contextlib.redirect_stdout(sys.stderr):  # a backend's prints stay out of the log
        names = schedule({e.name: probe_seconds(e, args.device) for e in entries})
    cpus = args.workers if args.workers is not None else usable_cpus()
    workers = max(1, min(cpus, len(names)))
    per_job = max(1, cpus // workers)  # more CPUs than backends: each spreads its own tests
    jobs = [
        ConformanceJob(
            n, conformance_dir / f"{file_stem(n)}.xml", conformance_dir / f"{file_stem(n)}.log"
        )
        for n in names
    ]
    say(
        f"main job: {len(names)} backend{'s' if len(names) != 1 else ''} "
        f"({', '.join(names)}) -> {out}: conformance "
        f"({args.profile}, {workers} at a time"
        + (f", {per_job} workers each" if per_job > 1 else "")
        + "), then "
        + ("the report" if args.no_bench else "the benchmark workloads, then the report")
        + (f"; shard {shard_text} of each" if shard_text else "")
    )
    for name in left_out:
        say(f"{name} left out: registered, but claims no {args.device!r} device here")
    bench_json = out / "bench.json"
    bench_code = 0
    try:
        run_conformance_jobs(
            jobs,
            workers=workers,
            profile=args.profile,
            device=args.device,
            say=say,
            workers_per_job=per_job,
            shard=shard_text,
        )
        if not args.no_bench:
            say("bench: the default workloads, every backend and the no-paging peer")
            bench_code = run_bench(
                [e.name for e in entries],  # registry order, as a plain bench run
                args.workload,
                bench_json,
                out / "bench.log",
                args.device,
                say,
                shard=shard_text,
            )
            say(f"bench: {_bench_verdict(out / 'bench.log', bench_code)}")
    except KeyboardInterrupt:
        print(
            "attn-harness run: interrupted; finished steps are kept in " + str(out), file=sys.stderr
        )
        return EXIT_INTERRUPTED
    inputs = [str(j.junit) for j in jobs if j.junit.exists()]
    if bench_json.exists() and not args.no_bench:
        inputs.append(str(bench_json))
    index = report_into(inputs, out / "report", say)
    failed = [j.backend for j in jobs if j.code != 0]
    say(
        closing_verdict(
            failed, None if args.no_bench else bench_code, bench_json, out / "bench.log"
        )
    )
    if index is not None:
        print(f"report: {index.resolve()}")
    return EXIT_FAILED if failed or bench_code or index is None else EXIT_OK


def _bench_verdict(log: Path, code: int) -> str:
    from harness.cli.run_jobs import bench_summary

    return bench_summary(log.with_name("bench.json"), log, code)


def report_into(inputs: list[str], out: Path, say: Any) -> Path | None:
    """The report of ``inputs`` (JUnit and results files) in ``out``; ``None`` if it failed."""
    from harness.report import ReportError, build_report

    if not inputs:
        say("report: nothing to report (no step finished)")
        return None
    try:
        index = build_report(inputs, out)
    except (ReportError, OSError) as exc:
        say(f"report: FAILED: {exc}")
        return None
    say(f"report: {index}")
    return index
