"""The ``attn-harness`` command line: argument parsing only, composing library modules.

Library modules (and torch) are imported inside each command, so ``--help``
and usage errors answer at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from harness.cli.ab import add_ab_command
from harness.cli.bench import add_bench_command
from harness.cli.dist import add_dist_bench_command, add_dist_command
from harness.cli.gate import add_baseline_command, add_gate_command
from harness.cli.merge import add_merge_command
from harness.cli.report import add_report_command
from harness.cli.run import add_run_command
from harness.cli.usage import UsageError, check_machine, command_parser, resolve_backends
from harness.conformance.plugin_names import PROFILE_NAMES
from harness.core.arg_types import OneLineParser, at_least, device, one_of, output_file, shard
from harness.core.exit_codes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from harness.core.text_table import aligned, fitted, terminal_width, wrapped

if TYPE_CHECKING:
    from harness.core.registry import BackendEntry


def _any(value: object) -> str:
    if value is None:
        return "any"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def _describe(entry: BackendEntry) -> dict[str, object]:
    from harness.core.dtypes import dtype_name
    from harness.core.registry import class_label

    caps = entry.capabilities
    return {
        "name": entry.name,
        "origin": entry.origin,
        "class": class_label(entry),
        "kind": caps.kind,
        "kv_lora_ranks": _any(caps.kv_lora_ranks),
        "dp_aware": entry.accepts_dp,
        "dtypes": [dtype_name(d) for d in caps.dtypes],
        "devices": list(caps.devices),
        "page_sizes": _any(caps.page_sizes),
        "head_dims": _any(caps.head_dims),
        "max_seq_len": _any(caps.max_seq_len),
        "graph_mode": caps.graph_mode,
        "non_causal": caps.non_causal,
        "max_dp_size": _any(caps.max_dp_size),
        "variants": _variants(caps),
        "unavailable": entry.unavailable_reason,
    }


def _variants(caps: Any) -> list[str]:
    """The attention variants and optional outputs a claim includes, in short words."""
    flags = {
        "window": caps.sliding_window,
        "soft-cap": caps.soft_cap,
        "sinks": caps.sinks,
        "alibi": caps.alibi,
        "out=": caps.out_buffer,
        "lse": caps.lse,
    }
    words = [word for word, on in flags.items() if on]
    words += [d for d in caps.kv_cache_dtypes if d != "auto"]
    words += [layout for layout in caps.cache_layouts if layout != "NHD"]
    return words


LIST_COLUMNS = {
    "name": "name",
    "origin": "origin",
    "kind": "kind",
    "dp_aware": "dp-aware",
    "dtypes": "dtypes",
    "devices": "devices",
    "page_sizes": "page sizes",
    "head_dims": "head dims",
    "max_seq_len": "max len",
    "graph_mode": "graph",
    "non_causal": "non-causal",
    "max_dp_size": "max dp",
    "variants": "variants",
}
"""``list``'s columns: the key in ``--json``, the heading in the table."""


def _list_lines(described: list[dict[str, object]], width: int) -> list[str]:
    """The table when it fits ``width`` (cells wrapped); else one block per backend.

    Thirteen columns need 98 characters for the built-ins however their cells
    are wrapped; on a narrower terminal each backend gets its name on a line, then its
    ``heading value`` pairs packed into indented lines. Nothing is cut: the
    same values either way, as ``--json`` has them.
    """
    rows = [list(LIST_COLUMNS.values())]
    rows += [[_cell(d[k]) for k in LIST_COLUMNS] for d in described]
    table = fitted(rows, width, whole=[0])  # backend names whole: they are typed back
    if table is not None:
        return table
    lines: list[str] = []
    for d in described:
        lines.append(str(d["name"]))
        pairs = [f"{LIST_COLUMNS[k]} {_cell(d[k])}" for k in LIST_COLUMNS if k != "name"]
        line = ""
        for pair in pairs:
            if line and len(line) + 2 + len(pair) > width:
                lines += wrapped(line, width, indent="    ")
                line = ""
            line = f"{line}  {pair}" if line else f"  {pair}"
        lines += wrapped(line, width, indent="    ")
    return lines


def cmd_list(args: argparse.Namespace) -> int:
    entries = resolve_backends(args.backend)
    described = [_describe(e) for e in entries]
    from harness.core.registry import default_registry

    errors = default_registry().load_errors
    if args.json:
        print(json.dumps({"backends": described, "load_errors": errors}, indent=2))
        return EXIT_OK
    print("\n".join(_list_lines(described, terminal_width())))
    for backend in described:
        if backend["unavailable"]:
            text = f"{backend['name']}: unavailable here: {backend['unavailable']}"
            print(textwrap.fill(text, terminal_width(), subsequent_indent="  "))
    for name, problem in sorted(errors.items()):
        print(f"warning: entry point {name!r} not loaded: {problem}", file=sys.stderr)
    return EXIT_OK


SHOWN_FAILURES = 10
"""Failing cases ``check`` prints without ``-v``: enough to see a pattern, not a flood."""


def _case_lines(backend: str, results: list[Any], verbose: bool) -> list[str]:
    """One line per case; without ``verbose``, one per distinct error, the first few only."""
    if verbose:
        return [f"{r.status:11} {backend}: {r.case}: {r.detail}" for r in results]
    lines: list[str] = []
    by_detail: dict[str, list[Any]] = {}
    for r in results:
        by_detail.setdefault(r.detail, []).append(r)
    for detail, same in list(by_detail.items())[:SHOWN_FAILURES]:
        more = f" (and {len(same) - 1} more cases the same)" if len(same) > 1 else ""
        lines.append(f"{same[0].status:11} {backend}: {same[0].case}: {detail}{more}")
    hidden = sum(len(same) for same in list(by_detail.values())[SHOWN_FAILURES:])
    if hidden:
        lines.append(f"... and {hidden} more failing cases (-v prints every case)")
    return lines


def cmd_check(args: argparse.Namespace) -> int:
    from harness.conformance.check_matrix import quick_coverage, run_quick_check, triage_lines
    from harness.core.registry import split_by_device
    from harness.core.threads import fixed_threads, small_step_threads
    from harness.core.triton_mode import interpret_triton_here

    interpret_triton_here()  # the quick check runs on the CPU: Triton kernels are interpreted
    entries = resolve_backends(args.backend, device="cpu")
    if not args.backend:  # a default run leaves out what claims no CPU (a missing extra)
        entries, others = split_by_device(entries, "cpu")
        for entry in others:
            print(f"{entry.name} not checked: registered, but claims no 'cpu' device here")
    width = terminal_width()
    rows = [["backend", "passed", "failed", "errors", "unsupported", "first failure"]]
    covered: list[str] = []
    any_bad = False
    for entry in entries:
        # one torch thread, as conform runs the same small steps (busy machine: 29 s -> 8.6 s)
        with fixed_threads(small_step_threads()), contextlib.redirect_stdout(sys.stderr):
            results = run_quick_check(entry)  # a backend's prints stay out of the table
        with contextlib.suppress(TypeError):  # a bad capabilities() is an ERROR case already
            covered.append(
                f"checked ({entry.name}): {quick_coverage(entry.capabilities).describe()}"
            )
        counts = {
            s: sum(r.status == s for r in results)
            for s in ("PASSED", "FAILED", "ERROR", "UNSUPPORTED")
        }
        bad = [r for r in results if r.status in ("FAILED", "ERROR")]
        for line in _case_lines(entry.name, results if args.verbose else bad, args.verbose):
            print(line)  # one line per case, whole: what a log search finds
        for line in triage_lines(results):  # what the failed cases share
            print("\n".join(wrapped(f"CAUSE  {line}", width, indent=" " * 7)))
        nothing = counts["PASSED"] == 0
        any_bad = any_bad or bool(bad) or nothing
        shown = bad[0].case if bad else ("nothing could be checked" if nothing else "-")
        rows.append(
            [
                entry.name,
                str(counts["PASSED"]),
                str(counts["FAILED"]),
                str(counts["ERROR"]),
                str(counts["UNSUPPORTED"]),
                shown,
            ]
        )
    print("\n".join(fitted(rows, width) or aligned(rows)))
    print("\n".join(line for text in covered for line in wrapped(text, width)))
    print("quick check: " + ("FAILED" if any_bad else "all cases match the float64 oracle"))
    return EXIT_FAILED if any_bad else EXIT_OK


def cmd_conform(args: argparse.Namespace) -> int:
    from harness.bench.environment import usable_cpus
    from harness.conformance.runner import run_conformance

    if args.replay is not None and ("@" in args.replay or not args.replay):
        # TEST@VERSION:BLOB must parse; whether TEST exists is known once pytest has collected
        from harness.conformance.report import parse_replay

        try:
            parse_replay(args.replay)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    extra = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    return run_conformance(
        args.backend,
        args.profile,
        args.junitxml,
        extra,
        device=args.device,
        verbose=args.verbose,
        replay=args.replay,
        user_plugins=args.user_plugins,
        workers=args.workers if args.workers is not None else usable_cpus(),
        shard=None if args.shard is None else str(args.shard),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="attn-harness",
        description="Conformance and benchmarks for DP-partitioned paged attention backends.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    spec_help = (
        "backend name, 'package.module:Class' or 'path/to/file.py:Class' "
        "(repeatable; default: all registered)"
    )
    p_list = sub.add_parser("list", help="list backends with origin, DP-awareness, capabilities")
    p_list.add_argument("--backend", action="append", default=[], metavar="SPEC", help=spec_help)
    p_list.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p_list.set_defaults(func=cmd_list)
    p_check = sub.add_parser(
        "check",
        help="quick oracle check: decode/prefill/extend/mixed "
        "batches on every rank of dp_size 1..3, both layouts, every claimed dtype, "
        "page size and head dim; inputs modified in place are named as such",
    )
    p_check.add_argument("--backend", action="append", default=[], metavar="SPEC", help=spec_help)
    p_check.add_argument("-v", "--verbose", action="store_true", help="print every case")
    p_check.set_defaults(func=cmd_check)
    p_conform = sub.add_parser(
        "conform",
        help="property-based conformance suite (pytest + hypothesis) against backends",
        description="Run suites.conformance against each backend and print a verdict table "
        "(backend x property) with one entry per failure: the shrunk example in words, the "
        "error against the bound, and the command that replays it. pytest runs isolated from "
        "the current folder's pytest configuration and plugins. Exit 0 when every property "
        "holds, 1 when any fails or nothing could be checked, 2 for a usage error, 130 when "
        "interrupted. Arguments after -- go to pytest (for example -- -k oracle --examples 20).",
    )
    p_conform.add_argument("--backend", action="append", default=[], metavar="SPEC", help=spec_help)
    p_conform.add_argument(
        "--profile",
        default="ci",
        type=one_of("profile", PROFILE_NAMES),
        metavar="ci|thorough|kill",
        help="hypothesis profile (default: ci)",
    )
    p_conform.add_argument(
        "--device",
        default="cpu",
        type=device,
        metavar="cpu|cuda",
        help="device the cases run on (default: cpu)",
    )
    p_conform.add_argument(
        "--junitxml",
        type=output_file,
        metavar="FILE",
        help="also write a JUnit XML report (and FILE's name with .coverage.json: the coverage "
        "tally); written only when the run finishes",
    )
    p_conform.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="pytest's full report (each test, tracebacks, coverage tables) before the verdict",
    )
    p_conform.add_argument(
        "--replay",
        metavar="TEST@VERSION:BLOB",
        help="rerun exactly one failing example, as printed after 'replay:' in a failure entry",
    )
    p_conform.add_argument(
        "--workers",
        type=at_least(1),
        default=None,
        metavar="N",
        help="processes that share the tests (pytest-xdist): verdicts, coverage and the replay "
        "commands are the same for any N; 1 runs them all in this process (default: one per "
        "CPU this process may use; a --replay runs in one)",
    )
    p_conform.add_argument(
        "--shard",
        type=shard,
        default=None,
        metavar="K/N",
        help="run shard K of N: a fixed, balanced share of the tests, the same on every "
        "machine (needs --junitxml); attn-harness merge combines the N shards' files into "
        "the whole run's verdict, coverage and JUnit file",
    )
    p_conform.add_argument(
        "--user-plugins",
        action="store_true",
        help="also load the pytest plugins installed in this environment and PYTEST_ADDOPTS "
        "(off by default: the suite runs the same wherever it is started)",
    )
    p_conform.add_argument("pytest_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p_conform.set_defaults(func=cmd_conform)
    add_bench_command(sub)
    add_run_command(sub)
    add_report_command(sub)
    add_gate_command(sub)
    add_baseline_command(sub)
    add_ab_command(sub)
    add_dist_command(sub)
    add_dist_bench_command(sub)
    add_merge_command(sub)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The parsed command line; an unknown option is the subcommand's error, as a bad value is."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        command_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """``attn-harness ARGS``; the exit status (argparse's own exits, 0 for --help, 2 for a usage
    error, come back as the status too, so an in-process caller gets a number either way)."""
    parser = build_parser()
    try:
        args = _parse(parser, argv)
    except SystemExit as exc:
        if exc.code is None:
            return EXIT_OK
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        check_machine(command_parser(parser, args.command), args)
        return int(args.func(args))
    except UsageError as exc:
        print(f"attn-harness {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"attn-harness {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
