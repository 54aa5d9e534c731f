"""``attn-harness report``: argument parsing and the one-line answer.

Any unusable input or an output folder that cannot be written is answered
with exit code 2 and one line on stderr, never a traceback, and leaves the
output folder as it was. ``add_report_command(subparsers)`` registers the
subcommand on the main parser; ``main(argv)`` runs it standalone
(``python -m harness.cli.report``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from harness.core.arg_types import OneLineParser, input_path
from harness.core.exit_codes import EXIT_OK, EXIT_USAGE


def add_report_command(subparsers: Any) -> None:
    """Register ``report`` on the ``attn-harness`` subparsers (imports no torch, no matplotlib)."""
    p = subparsers.add_parser(
        "report",
        help="turn results files and conformance JUnit XML into an HTML and Markdown report",
        description=(
            "Build a self-contained HTML report (index.html, figures embedded), a Markdown "
            "summary for a pull-request comment (summary.md) and the figures as PNG and SVG "
            "(figures/) from benchmark results and conformance runs. Several benchmark runs "
            "are shown side by side. Exit 0: report written; 2: an input cannot be used or "
            "the output cannot be written (nothing is written then)."
        ),
    )
    p.add_argument(
        "results",
        nargs="+",
        type=input_path,
        metavar="RESULTS",
        help="a results file (attn-harness bench --out), pytest-benchmark JSON from "
        "suites/benchmarks, JUnit XML from attn-harness conform --junitxml (its "
        "NAME.coverage.json beside it is read too), or a folder of these",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="folder to write the report to; an earlier report there is replaced once the "
        "new one is complete (a folder holding anything else is refused)",
    )
    p.add_argument(
        "--title",
        default=None,
        help="the report's heading (default: 'attn-harness report')",
    )
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    # matplotlib, numpy and torch load here, not when the parser is built
    from harness.report import ReportError, build_report

    try:
        index = build_report(args.results, args.out, title=args.title)
    except ReportError as exc:
        print(f"attn-harness report: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"report written to {index}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """A parser with only ``report``: for running this module on its own."""
    parser = OneLineParser(prog="attn-harness")
    add_report_command(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from harness.cli.usage import UsageError, check_machine, command_parser

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_machine(command_parser(parser, "report"), args)
    except UsageError as exc:
        print(f"attn-harness report: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
