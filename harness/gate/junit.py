"""The gate's verdict as JUnit XML, for CI systems that show test reports.

One testcase per compared case (a failure for FAIL, skipped for a case that
could not be compared) and one per failed conformance test. Written
atomically: a CI step never picks up half a file.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

from harness.core.atomic_file import write_atomically
from harness.gate.verdicts import GateReport

NOT_COMPARED = frozenset({"MISSING", "NEW", "UNSUPPORTED", "UNCOMPARED"})


def gate_junit(report: GateReport) -> ET.ElementTree[ET.Element]:
    suite = ET.Element("testsuite", name="attn-harness gate")
    failures = skipped = 0
    for case in report.cases:
        workload, _, name = case.key.partition("/")
        element = ET.SubElement(suite, "testcase", classname=f"gate.{workload}", name=name)
        ET.SubElement(
            ET.SubElement(element, "properties"), "property", name="verdict", value=case.verdict
        )
        if case.verdict == "FAIL":
            failures += 1
            ET.SubElement(element, "failure", message=case.detail)
        elif case.verdict in NOT_COMPARED:
            skipped += 1
            ET.SubElement(element, "skipped", message=f"{case.verdict}: {case.detail}")
        else:
            ET.SubElement(element, "system-out").text = f"{case.verdict}: {case.detail}"
    for failure in report.conformance_failures:
        failures += 1
        element = ET.SubElement(suite, "testcase", classname="gate.conformance", name=failure)
        ET.SubElement(element, "failure", message=f"conformance failed: {failure}")
    suite.set("tests", str(len(report.cases) + len(report.conformance_failures)))
    suite.set("failures", str(failures))
    suite.set("skipped", str(skipped))
    suite.set("errors", "0")
    return ET.ElementTree(suite)


def write_gate_junit(report: GateReport, path: str | os.PathLike[str]) -> Path:
    data = ET.tostring(gate_junit(report).getroot(), encoding="utf-8", xml_declaration=True)
    return write_atomically(path, data)
