"""``attn-harness gate`` and ``attn-harness baseline``: argument parsing and printing only."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from harness.core.arg_types import (
    fraction,
    input_file,
    input_path,
    name_pair,
    output_file,
)
from harness.core.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from harness.core.text_table import aligned, fitted, terminal_width, wrapped

DEFAULT_BASELINE_ROOT = "reports"


def add_gate_command(subparsers: Any) -> None:
    from harness.gate.compare import DEFAULT_THRESHOLD

    p = subparsers.add_parser(
        "gate",
        help="CI gate: fail on conformance failures, failing cases, or a regression of a case's "
        "ratio to its in-run peer beyond the threshold (judged on a bootstrap interval)",
        description="Compare results against a baseline. Fails (exit 1) on any failed "
        "conformance test, any case with a failing status, a case that PASSED in the baseline "
        "and is UNSUPPORTED now, or a case whose ratio to its in-run peer got slower with the "
        "whole bootstrap interval beyond the threshold. Exit 0 pass, 2 unusable input.",
    )
    p.add_argument(
        "results",
        nargs="+",
        type=input_path,
        metavar="RESULTS",
        help="candidate results files or folders: results JSON, pytest-benchmark JSON from "
        "suites/benchmarks, JUnit XML from 'attn-harness conform --junitxml'; several runs "
        "are pooled",
    )
    p.add_argument(
        "--baseline",
        required=True,
        type=input_path,
        metavar="FILE|DIR",
        help="a baseline (attn-harness baseline), a results file, or a folder of baselines "
        "(DIR/DEVICE_CLASS/baseline.json, picked by the results' device class)",
    )
    p.add_argument(
        "--no-baseline-ok",
        action="store_true",
        help="with a folder that holds no baseline for the results' device class, gate "
        "statuses and conformance only, and say so (instead of exit 2)",
    )
    p.add_argument(
        "--threshold",
        type=fraction,
        default=DEFAULT_THRESHOLD,
        help=f"relative slow-down that fails (default {DEFAULT_THRESHOLD})",
    )
    p.add_argument(
        "--junitxml", type=output_file, metavar="FILE", help="also write the verdicts as JUnit XML"
    )
    p.add_argument(
        "--match",
        action="append",
        type=name_pair,
        default=[],
        metavar="CANDIDATE=BASELINE",
        help="compare the candidate's backend CANDIDATE with the baseline's BASELINE "
        "(a renamed or copied backend); repeatable",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="compare with a baseline of another device class anyway",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="list every case (default: failures, improvements, missing and new cases, and "
        "inconclusive ones whose estimate lies past the threshold)",
    )
    p.set_defaults(func=cmd_gate)


def add_baseline_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "baseline",
        help="pool >= 3 results files of one device class into a baseline for the gate",
    )
    p.add_argument(
        "results", nargs="+", type=input_file, metavar="RESULTS", help="results files (>= 3 runs)"
    )
    p.add_argument(
        "--out",
        type=output_file,
        metavar="FILE",
        help="default: reports/baselines/DEVICE_CLASS/baseline.json",
    )
    p.set_defaults(func=cmd_baseline)


def _error(command: str, message: str) -> int:
    print(f"attn-harness {command}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _worth_showing(case: Any, threshold: float) -> bool:
    """Verdicts that need a look, and inconclusive cases whose point estimate is past a bound."""
    if case.verdict in ("FAIL", "IMPROVED", "MISSING", "NEW"):
        return True
    if case.verdict == "INCONCLUSIVE" and case.change is not None:
        return not 1 / (1 + threshold) <= case.change.change <= 1 + threshold
    return False


SHOWN_ONE_SIDED = 5
"""MISSING or NEW cases listed one by one without ``-v``; past this, counted per workload."""

_ONE_SIDED = {
    "MISSING": "in the baseline, not in the candidate",
    "NEW": "in the candidate, not in the baseline",
}


def _one_sided_summary(verdict: str, cases: list[Any]) -> str:
    """``117 cases MISSING (...): decode-sweep x 40, ... (-v lists them)``: one line, not 117."""
    per_workload = Counter(case.key.split("@", 1)[0] for case in cases)
    counts = ", ".join(f"{name} x {n}" for name, n in per_workload.items())
    return f"{len(cases)} cases {verdict} ({_ONE_SIDED[verdict]}): {counts} (-v lists them)"


def _table(report: Any, verbose: bool, width: int) -> list[str]:
    """The cases worth a look (every case with ``verbose``), fitted to ``width``.

    Without ``verbose``, many MISSING or NEW cases (a partial run, a new
    workload) are counted per workload on one line each instead of listed;
    the JUnit report always has every case.
    """
    shown = [c for c in report.cases if verbose or _worth_showing(c, report.threshold)]
    summaries = []
    for verdict in _ONE_SIDED:
        same = [c for c in shown if c.verdict == verdict]
        if not verbose and len(same) > SHOWN_ONE_SIDED:
            shown = [c for c in shown if c.verdict != verdict]
            summaries.append(_one_sided_summary(verdict, same))
    hidden = sum(not verbose and not _worth_showing(c, report.threshold) for c in report.cases)
    more = [f"({hidden} more cases, each within the threshold or not compared: -v lists them)"]
    rows = [["verdict", "case", "detail"], *([c.verdict, c.key, c.detail] for c in shown)]
    table = (fitted(rows, width, give_first=[2]) or aligned(rows)) if shown else []  # keys whole
    lines = [*table, *summaries, *(more if hidden else [])]
    return [part for line in lines for part in ([line] if line in table else wrapped(line, width))]


def _conformance_failures(inputs: Any) -> list[str]:
    return [
        f"{case.backend} · {case.test} ({run.path.name})"
        for run in inputs.conformance
        for case in run.failed()
    ]


def _closing(report: Any) -> str:
    from harness.gate.verdicts import ORDER

    counts = ", ".join(f"{report.count(v)} {v}" for v in ORDER if report.count(v))
    threshold = f"threshold {report.threshold:.0%}"
    conformance = (
        f"; {len(report.conformance_failures)} conformance failure(s)"
        if report.conformance_failures
        else ""
    )
    verdict = "FAILED" if report.failed else "PASSED"
    return f"attn-harness gate: {verdict}: {counts or 'no case'} ({threshold}){conformance}"


def cmd_gate(args: argparse.Namespace) -> int:
    from harness.core.atomic_file import unwritable_reason
    from harness.gate.baseline import BaselineError, load_baseline
    from harness.gate.device_class import device_class
    from harness.gate.verdicts import judge
    from harness.report.inputs import ReportError, load_inputs

    rename = dict(args.match)
    try:
        inputs = load_inputs(args.results)
    except ReportError as exc:
        return _error("gate", str(exc))
    if args.junitxml and (why := unwritable_reason(args.junitxml)):
        return _error("gate", f"--junitxml {args.junitxml}: {why}")
    runs = [b.record for b in inputs.bench]
    if not runs:
        return _error("gate", "no benchmark results among the inputs (only conformance reports)")
    for bench in inputs.bench:
        if bench.record.partial:  # its missing cases are listed as MISSING below
            print(
                "\n".join(
                    wrapped(
                        f"attn-harness gate: note: {bench.path} is a partial run (cut short)",
                        terminal_width(),
                    )
                )
            )
    classes = sorted({device_class(r.environment) for r in runs})
    baseline_path = Path(args.baseline)
    if baseline_path.is_dir():
        folder, baseline_path = baseline_path, baseline_path / classes[0] / "baseline.json"
        if not baseline_path.is_file():
            kept = sorted(p.parent.name for p in folder.glob("*/baseline.json"))
            message = (
                f"no baseline for {classes[0]} in {folder} "
                f"(there are: {', '.join(kept) or 'none'}); make one with 'nox -s baseline'"
            )
            if not args.no_baseline_ok:
                return _error("gate", message)
            print(
                "\n".join(
                    wrapped(
                        f"attn-harness gate: {message}: performance NOT compared", terminal_width()
                    )
                )
            )
            return _statuses_only(runs, inputs, args)
    try:
        baseline = load_baseline(baseline_path)
    except BaselineError as exc:
        return _error("gate", str(exc))
    if classes != [baseline.device_class] and not args.force:
        return _error(
            "gate",
            f"the baseline is for {baseline.device_class}, the results for {', '.join(classes)}: "
            "ratios from another device class say nothing about this one (--force compares anyway)",
        )
    failures = _conformance_failures(inputs)
    report = judge(
        runs, baseline.runs, threshold=args.threshold, rename=rename, conformance_failures=failures
    )
    compared = [c for c in report.cases if c.change is not None or c.verdict == "FAIL"]
    if not compared and not failures:
        return _error("gate", "the results and the baseline share no case that can be compared")
    width = terminal_width()
    say = _printer(width)
    say(
        f"attn-harness gate: {len(runs)} candidate run(s) vs {len(baseline.runs)} baseline run(s) "
        f"({baseline.device_class}); unit: each case's forward time / its in-run peer's"
    )
    for note in report.notes:
        say(note)
    _table_and_failures(report, failures, args, width)
    say(_closing(report))
    return EXIT_FAILED if report.failed else EXIT_OK


def _printer(width: int) -> Any:
    """``print`` for a line of prose, broken at spaces to ``width`` (continuations indented)."""

    def say(line: str) -> None:
        print("\n".join(wrapped(line, width)))

    return say


def _table_and_failures(
    report: Any, failures: list[str], args: argparse.Namespace, width: int
) -> None:
    """The cases' table, each conformance failure, and the JUnit file when one was asked for."""
    from harness.gate.junit import write_gate_junit

    for line in _table(report, args.verbose, width):
        print(line)
    say = _printer(width)
    for failure in failures:
        say(f"FAIL conformance: {failure}")
    if args.junitxml:
        write_gate_junit(report, args.junitxml)


def _statuses_only(runs: list[Any], inputs: Any, args: argparse.Namespace) -> int:
    """The gate without a baseline: failing statuses and conformance failures only."""
    from harness.gate.verdicts import status_failures

    failures = _conformance_failures(inputs)
    report = status_failures(runs, args.threshold)
    report.conformance_failures = failures
    width = terminal_width()
    _table_and_failures(report, failures, args, width)
    verdict = "FAILED" if report.failed else "PASSED"
    _printer(width)(
        f"attn-harness gate: {verdict} (statuses and conformance only, no performance baseline)"
    )
    return EXIT_FAILED if report.failed else EXIT_OK


def cmd_baseline(args: argparse.Namespace) -> int:
    from harness.gate.baseline import (
        BaselineError,
        default_baseline_path,
        make_baseline,
        save_baseline,
    )
    from harness.results.store import ResultsError, load_results

    try:
        runs = [load_results(path) for path in args.results]
        baseline = make_baseline(runs, command=["attn-harness", "baseline", *args.results])
    except (ResultsError, BaselineError) as exc:
        return _error("baseline", str(exc))
    out = (
        Path(args.out)
        if args.out
        else default_baseline_path(DEFAULT_BASELINE_ROOT, baseline.device_class)
    )
    try:
        save_baseline(baseline, out)
    except OSError as exc:
        return _error("baseline", f"cannot write {out}: {exc.strerror or exc}")
    cases = sum(len(r.cases) for r in runs)
    print(f"baseline for {baseline.device_class}: {len(runs)} runs, {cases} case results -> {out}")
    return EXIT_OK
