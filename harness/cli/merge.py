"""``attn-harness merge``: the shards of a sweep, run anywhere, become one run's files.

What is merged follows from the inputs: ``conform --shard`` JUnit files
(their coverage files beside them), ``bench --shard`` results files, or
``run --shard`` output folders (their conformance files, results file and a
new report). The merged files are those an unsharded run writes, the
verdict printed is its verdict, and the exit status is its status, so a CI
job can end on the merge alone.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.cli.usage import UsageError
from harness.core.arg_types import input_path
from harness.core.exit_codes import EXIT_FAILED, EXIT_OK


def add_merge_command(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "merge",
        help="combine the files of a sweep's shards (conform/bench/run --shard K/N) into one "
        "run's, and print that run's verdict",
        description="Combine every shard of one sharded sweep into the files the unsharded "
        "run writes: conform --shard JUnit files (with their .coverage.json) into one JUnit "
        "file, whose coverage promises are judged on the merged totals; bench --shard "
        "results files into one results file (cases in the unsharded order); run --shard "
        "output folders into one folder with its report. A missing or repeated shard, or "
        "shards of different sweeps, is an error. Exit 0 when the merged run passed, 1 when "
        "it failed, 2 for bad input.",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="PATH",
        help="the merged JUnit or results file, or (for run folders) the merged folder",
    )
    p.add_argument("shards", nargs="+", type=input_path, metavar="SHARD", help="every shard")
    p.set_defaults(func=cmd_merge)


def _kind_of(path: Path) -> str:
    if path.is_dir():
        return "run"
    return "conformance" if path.suffix.lower() == ".xml" else "results"


def _kind(paths: Sequence[Path]) -> str:
    """``conformance``, ``results`` or ``run``: one kind for every input."""
    kinds = {_kind_of(p) for p in paths}
    if len(kinds) > 1:
        words = {"run": "a run folder", "conformance": "a JUnit file", "results": "a results file"}
        shown = ", ".join(f"{p} ({words[_kind_of(p)]})" for p in paths)
        raise UsageError(f"the shards mix kinds: {shown}; merge one sweep at a time")
    return kinds.pop()


def cmd_merge(args: argparse.Namespace) -> int:
    from harness.core.atomic_file import unwritable_reason

    paths = [Path(p) for p in args.shards]
    kind = _kind(paths)
    out = Path(args.out)
    if out.resolve() in {p.resolve() for p in paths}:
        raise UsageError(f"--out {out} is one of the shards: the merge writes a new file")
    if kind != "run" and (problem := unwritable_reason(out)) is not None:
        raise UsageError(f"--out {out}: {problem}")
    try:
        if kind == "conformance":
            return _merge_conformance(paths, out)
        if kind == "results":
            return _merge_results(paths, out)
        return _merge_runs(paths, out)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _merge_conformance(paths: Sequence[Path], out: Path) -> int:
    from harness.conformance.merge import merge_conformance
    from harness.conformance.report import terminal_width
    from harness.core.text_table import wrapped

    merged = merge_conformance(paths, out)
    for line in merged.lines:  # as conform prints them: its own sentences fitted to the width
        print(
            "\n".join(wrapped(line, terminal_width())) if line.startswith("attn-harness") else line
        )
    print(f"merged {len(paths)} shards into {out}")
    return merged.exit_code


def _merge_results(paths: Sequence[Path], out: Path) -> int:
    from harness.bench import run_results
    from harness.bench.table import render
    from harness.results.merge import merge_result_files
    from harness.results.store import save_results

    record = merge_result_files(paths)
    save_results(record, out)
    print(render(record))
    print(f"merged {len(paths)} shards ({len(record.cases)} results) into {out}")
    return EXIT_FAILED if run_results.failed(record) else EXIT_OK


def _merge_runs(folders: Sequence[Path], out: Path) -> int:
    """Each backend's conformance files, then the results file, then the report."""
    from harness.cli.run import report_into
    from harness.conformance.merge import merge_conformance

    names = sorted({p.name for f in folders for p in (f / "conformance").glob("*.xml")})
    if not names:
        raise ValueError(f"{folders[0]}: no conformance/*.xml: not the folder of run --shard")
    codes = []
    inputs = []
    for name in names:
        shards = [f / "conformance" / name for f in folders]
        absent = [str(s) for s in shards if not s.exists()]
        if absent:
            raise ValueError(f"{', '.join(absent)} missing: every shard runs every backend")
        merged = merge_conformance(shards, out / "conformance" / name)
        print(merged.lines[-1].replace("attn-harness conform:", f"conformance {Path(name).stem}:"))
        codes.append(merged.exit_code)
        inputs.append(str(out / "conformance" / name))
    benches = [f / "bench.json" for f in folders]
    present = [b for b in benches if b.exists()]
    if present and len(present) != len(benches):
        missing = ", ".join(str(b) for b in benches if not b.exists())
        raise ValueError(f"{missing} missing: some shards ran the benchmarks and some did not")
    if present:
        codes.append(_merge_results(present, out / "bench.json"))
        inputs.append(str(out / "bench.json"))
    index = report_into(inputs, out / "report", print)
    if index is not None:
        print(f"report: {index.resolve()}")
    return EXIT_FAILED if any(codes) or index is None else EXIT_OK
