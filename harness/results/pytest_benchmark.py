"""Convert pytest-benchmark JSON from ``suites/benchmarks`` into the results schema, losslessly.

The suites put each case's full results record in
``extra_info["attn_harness"]`` (with its peer's), and the run's environment,
ceilings and timing setup in the document's ``attn_harness`` section. The
conversion keeps everything else verbatim: each benchmark entry (name,
group, params, options, pytest-benchmark's own stats, the flat metrics in
``extra_info``) becomes its case's ``source``, and the run-level
``machine_info``, ``commit_info``, ``datetime`` and ``version`` the run's.
``to_pytest_benchmark`` rebuilds the original document from the result,
which is what "lossless" means here (and what the tests check).

    python -m harness.results.pytest_benchmark BENCH.json RESULTS.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.results.store import (
    CaseRecord,
    ResultsError,
    RunRecord,
    load_results,
    save_results,
)

SECTION = "attn_harness"
RUN_FIELDS = ("machine_info", "commit_info", "datetime", "version")


def _require(data: dict[str, Any], key: str, where: str) -> Any:
    if not isinstance(data, dict) or key not in data:
        raise ResultsError(f"{where}: missing {key!r} (is this pytest-benchmark JSON?)")
    return data[key]


def from_pytest_benchmark(document: dict[str, Any], *, origin: str = "input") -> RunRecord:
    """The results record of a pytest-benchmark document written by ``suites/benchmarks``."""
    if not isinstance(document, dict):
        raise ResultsError(f"{origin}: expected a JSON object, got {type(document).__name__}")
    benchmarks = _require(document, "benchmarks", origin)
    meta = document.get(SECTION)
    if not isinstance(meta, dict):
        raise ResultsError(
            f"{origin}: no {SECTION!r} section: not written by the suites in suites/benchmarks"
        )
    cases: list[CaseRecord] = []
    peers: set[str] = set()
    for index, entry in enumerate(benchmarks):
        where = f"{origin}: benchmarks[{index}] ({entry.get('fullname', '?')})"
        extra = _require(entry, "extra_info", where)
        ours = _require(extra, SECTION, where)
        try:
            peer = CaseRecord.from_json(ours["peer"])
            record = CaseRecord.from_json(ours["record"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultsError(f"{where}: malformed {SECTION} record: {exc!r}") from None
        if peer.id not in peers:  # one peer per case, shared by its backends
            peers.add(peer.id)
            cases.append(peer)
        source = copy.deepcopy(entry)
        del source["extra_info"][SECTION]
        record.source = source
        cases.append(record)
    tool_version = str(document.get("version", "unknown"))
    return RunRecord(
        created=str(document.get("datetime", "")),
        tool={"name": "pytest-benchmark (suites/benchmarks)", "version": tool_version},
        environment=_require(meta, "environment", origin),
        ceilings=_require(meta, "ceilings", origin),
        timing=_require(meta, "timing", origin),
        workloads=_require(meta, "workloads", origin),
        cases=cases,
        source={key: document[key] for key in RUN_FIELDS if key in document},
    )


def to_pytest_benchmark(record: RunRecord) -> dict[str, Any]:
    """Rebuild the pytest-benchmark document a converted record came from."""
    if record.source is None:
        raise ResultsError("this results record was not converted from pytest-benchmark JSON")
    peers = {c.id: c for c in record.cases if c.role == "peer"}
    benchmarks = []
    for case in record.cases:
        if case.role == "peer":
            continue
        if case.source is None or case.peer not in peers:
            raise ResultsError(f"case {case.id} has no pytest-benchmark source or peer")
        entry = copy.deepcopy(case.source)
        plain = CaseRecord.from_json(case.to_json())
        plain.source = None
        entry["extra_info"][SECTION] = {
            "record": plain.to_json(),
            "peer": peers[case.peer].to_json(),
        }
        benchmarks.append(entry)
    document = dict(copy.deepcopy(record.source))
    document["benchmarks"] = benchmarks
    document[SECTION] = {
        "environment": record.environment,
        "ceilings": record.ceilings,
        "timing": record.timing,
        "workloads": record.workloads,
    }
    return document


def convert_file(source: str | Path, target: str | Path) -> RunRecord:
    """Read pytest-benchmark JSON, write the results file atomically."""
    path = Path(source)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path}: not valid JSON: {exc}") from None
    record = from_pytest_benchmark(document, origin=str(path))
    save_results(record, target)
    return record


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.results.pytest_benchmark",
        description="Convert suites/benchmarks pytest-benchmark JSON to the results schema.",
    )
    parser.add_argument("source", help="pytest-benchmark JSON (--benchmark-json=FILE)")
    parser.add_argument("target", help="results file to write")
    args = parser.parse_args(argv)
    try:
        record = convert_file(args.source, args.target)
        load_results(args.target)  # what was written reads back
    except ResultsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(record.cases)} cases written to {args.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
