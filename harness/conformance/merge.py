"""``attn-harness merge`` for conformance: N shards' JUnit files become the unsharded run's.

Each shard left ``NAME.xml`` (its tests, as pytest's JUnit writer saves them)
and ``NAME.coverage.json`` (its tallies and test verdicts, ``shard_runs``).
The merge checks they are every shard of one run, rebuilds the whole run's
session, and writes one JUnit file (every shard's test cases in one suite,
the coverage and triage properties of the whole run) and its coverage file:
what ``attn-harness report`` and ``gate`` read of an unsharded run. It prints
the verdict an unsharded ``conform`` ends with, and returns its exit status.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.atomic_file import write_atomically, write_json_atomically

SUMMED = ("tests", "errors", "failures", "skipped")
"""A test suite's counts, added over the shards."""


@dataclass
class MergedConformance:
    exit_code: int
    lines: list[str]


def coverage_path(junit: Path) -> Path:
    return junit.with_suffix(".coverage.json")


def _state(junit: Path) -> dict[str, Any]:
    path = coverage_path(junit)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(
            f"{junit}: its coverage file {path.name} is missing (a shard writes it beside "
            "its --junitxml file; an interrupted shard writes none)"
        ) from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read it as JSON: {exc}") from None
    state = data.get("shard") if isinstance(data, dict) else None
    if state is None:
        raise ValueError(f"{junit}: not a shard (run with conform --shard K/N)")
    return dict(state)


def _suite(junit: Path) -> ET.Element:
    try:
        root = ET.parse(junit).getroot()
    except (OSError, ET.ParseError) as exc:
        raise ValueError(f"{junit}: not a JUnit XML file: {exc}") from None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    if len(suites) != 1:
        raise ValueError(f"{junit}: expected one test suite, found {len(suites)}")
    return suites[0]


def merged_junit(suites: Sequence[ET.Element], properties: list[tuple[str, str]]) -> str:
    """One suite holding every shard's test cases, with the whole run's properties."""
    suite = ET.Element("testsuite", dict(suites[0].attrib))
    for key in SUMMED:
        suite.set(key, str(sum(int(s.get(key, "0")) for s in suites)))
    suite.set("time", f"{sum(float(s.get('time', '0')) for s in suites):.3f}")
    hosts = sorted({s.get("hostname", "") for s in suites} - {""})
    if hosts:
        suite.set("hostname", ",".join(hosts))
    stamps = sorted(s.get("timestamp", "") for s in suites if s.get("timestamp"))
    if stamps:
        suite.set("timestamp", stamps[0])
    tallied = ("coverage[", "triage.")
    props = ET.SubElement(suite, "properties")
    kept: set[tuple[str, str]] = set()
    for shard in suites:  # a shard's own properties, but not its partial tallies
        for prop in shard.findall("properties/property"):
            pair = (prop.get("name", ""), prop.get("value", ""))
            if not pair[0].startswith(tallied) and pair not in kept:
                kept.add(pair)
                ET.SubElement(props, "property", name=pair[0], value=pair[1])
    for name, value in properties:
        ET.SubElement(props, "property", name=name, value=value)
    for shard in suites:
        for case in shard.findall("testcase"):
            suite.append(case)
    root = ET.Element("testsuites", name="pytest tests")
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode")


def merge_conformance(junits: Sequence[Path], out: Path) -> MergedConformance:
    """Merge the shards' files into ``out`` (and its coverage file); ``ValueError`` names a
    file that is not a shard, or shards that are not every shard of one run."""
    from harness.conformance import run_coverage, session_lines
    from harness.conformance.shard_runs import merged_session

    states = [_state(path) for path in junits]
    suites = [_suite(path) for path in junits]
    run = merged_session(states, [str(p) for p in junits])
    seconds = sum(float(s.get("time", "0")) for s in suites)
    text = merged_junit(suites, run_coverage.junit_properties(run))
    coverage = run_coverage.coverage_json(run)
    write_atomically(out, text)
    if coverage is not None:
        write_json_atomically(coverage_path(out), coverage)
    lines = session_lines.compact_summary(run, seconds)
    failed = (
        run.verdicts.count("failed") > 0
        or bool(session_lines.problems_of(run))
        or not run.verdicts.tests
    )
    return MergedConformance(1 if failed else 0, lines)
