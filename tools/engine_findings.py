"""Whether an engine kernel's conformance run failed only for the reasons docs/engines.md gives.

    attn-harness conform --backend sglang-triton --junitxml run.xml
    python tools/engine_findings.py run.xml

An engine's kernel has defects the harness found and docs/engines.md
records (SGLang's window decode reads one key too few; a window of 1 is
full attention there). A CI run of that kernel fails, rightly, on them; what
must not happen unseen is a failure for any other reason. This reads the
run's JUnit report and sorts each failure under the finding whose evidence
it carries (every recorded finding names what the failing step's description shows),
and exits 1 on a failure no finding explains, an error, or a promised value the
run never checked (its coverage verdict). A finding the
run did not reproduce is said, not failed: the ``ci`` draws may miss it.
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Finding:
    """A defect recorded in docs/engines.md, and what a failure it causes shows."""

    backend: str
    title: str
    evidence: re.Pattern[str]  # searched in the failure's report (its scenario line)


SCENARIO = r"(?:scenario|geometry): "  # a failure's step in words (a state machine's: geometry)
FINDINGS = (
    Finding(
        "sglang-triton",
        "SGLang: a window W decodes over W - 1 keys, and a window of 1 is full attention",
        re.compile(rf"{SCENARIO}.*\bwindow=\d+"),
    ),
    Finding(
        "sglang-triton",
        "SGLang: the MHA decode kernel rounds each q_i k_i product to the 16-bit dtype"
        " before summing in float32",
        re.compile(rf"{SCENARIO}.*\b(?:float16|bfloat16), H=(\d+) KV=\1 "),
    ),
    Finding(
        "vllm-triton",
        "vLLM: ALiBi is slope x (key - context_len), off the definition by a per-row"
        " constant that sinks expose on multi-token queries",
        re.compile(rf"{SCENARIO}(?=.*\bsinks=)(?=.*\balibi=)"),
    ),
)


def params(test: str) -> str:
    """A test's parameters, backend first: ``test_x[sglang-triton-float32]`` -> the inside."""
    return test.partition("[")[2].rstrip("]")


@dataclass(frozen=True)
class Failure:
    test: str  # the test's name, its parameters (backend first) in brackets
    report: str


def failures(junit: Path) -> tuple[list[Failure], list[str], list[str]]:
    """The run's failed tests, the tests that errored (never explained by a finding), and
    every test's name."""
    failed, errored, names = [], [], []
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "?")
        names.append(name)
        for element in case:
            report = f"{element.get('message', '')}\n{element.text or ''}"
            if element.tag == "failure":
                failed.append(Failure(name, report))
            elif element.tag == "error":
                errored.append(name)
    return failed, errored, names


def coverage_gaps(junit: Path) -> list[str]:
    """Promised values the run never checked (``coverage[BACKEND].never_checked``): a run
    that checked too little fails whatever its tests say, and no finding explains that."""
    return [
        f"{prop.get('name', '').partition('.')[0]}: {prop.get('value', '')}"
        for prop in ET.parse(junit).getroot().iter("property")
        if prop.get("name", "").endswith(".never_checked")
    ]


def explain(failure: Failure, findings: tuple[Finding, ...] = FINDINGS) -> Finding | None:
    """The recorded finding of the failure's backend whose evidence its report shows."""
    for finding in findings:
        ours = params(failure.test).startswith(finding.backend)
        if ours and finding.evidence.search(failure.report):
            return finding
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", type=Path, help="the JUnit XML of an attn-harness conform run")
    args = parser.parse_args(argv)
    if not args.junit.is_file():
        print(f"engine_findings: no JUnit report at {args.junit}", file=sys.stderr)
        return 2
    failed, errored, names = failures(args.junit)
    unexplained = [f for f in failed if explain(f) is None]
    ran = {params(name) for name in names}
    for finding in FINDINGS:
        if not any(p.startswith(finding.backend) for p in ran):
            continue  # its backend was not in this run
        seen = [f.test for f in failed if explain(f) is finding]
        state = f"{len(seen)} failure(s): {', '.join(seen)}" if seen else "not reproduced"
        print(f"finding [{finding.backend}] {finding.title}: {state}")
    for failure in unexplained:
        first = failure.report.strip().splitlines()[0] if failure.report.strip() else ""
        print(f"UNEXPLAINED failure {failure.test}: {first}", file=sys.stderr)
    for name in errored:
        print(f"ERROR in {name}: an error is never a recorded finding", file=sys.stderr)
    gaps = coverage_gaps(args.junit)
    for gap in gaps:
        print(f"NEVER CHECKED {gap}: the run promised these values", file=sys.stderr)
    if unexplained or errored or gaps:
        return 1
    print(f"engine_findings: {len(failed)} failure(s), each a finding docs/engines.md records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
