"""Run the conformance suite against every planted bug and say which properties caught it.

    python -m suites.mutants.kill_matrix [--profile kill|ci|thorough]

One pytest process checks all mutants and the built-ins; the JUnit report
(each test case carries its backend as a property) gives, per backend, the
tests that failed. A mutant no test fails is a survivor, a gap in the suite.
The threshold mutants (``suites.mutants.thresholds``) are wrong only past a
production shape (a 256-key split, a 64-row query tile, page size 16, head
dim 128, GQA group 8, 64 sequences, int16 lengths and ids, 8 DP ranks), so
only a profile that draws such shapes kills them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from harness.conform import pytest_arguments
from suites.mutants.backends import MUTANTS

BUILTINS = ("reference", "sdpa")


def mutant_specs() -> list[str]:
    """Each mutant as ``module:Class`` of the module that defines it."""
    return [f"{cls.__module__}:{cls.__name__}" for cls in MUTANTS]


@dataclass(frozen=True)
class Verdict:
    backend: str
    failed: tuple[str, ...]  # test functions that failed (or errored)
    passed: int

    @property
    def caught(self) -> bool:
        return bool(self.failed)


def run_suite(specs: list[str], profile: str) -> dict[str, Verdict]:
    """One pytest run over ``specs``; per backend, which tests failed."""
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            *pytest_arguments(specs, profile, str(report)),
        ]
        subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
        if not report.exists():
            raise RuntimeError("the conformance run wrote no JUnit report")
        tree = ET.parse(report)
    failed: dict[str, set[str]] = defaultdict(set)
    passed: dict[str, int] = defaultdict(int)
    for case in tree.iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        backend = props.get("backend")
        if backend is None:
            continue
        name = (case.get("name") or "").split("[")[0]
        if case.find("failure") is not None or case.find("error") is not None:
            failed[backend].add(name)
        elif case.find("skipped") is None:
            passed[backend] += 1
    return {spec: Verdict(spec, tuple(sorted(failed[spec])), passed[spec]) for spec in specs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="kill", choices=("kill", "ci", "thorough"))
    args = parser.parse_args()
    verdicts = run_suite([*BUILTINS, *mutant_specs()], args.profile)
    width = max(len(v) for v in verdicts)
    for spec, verdict in verdicts.items():
        status = "FAILED" if verdict.caught else "passed"
        print(f"{spec:{width}}  {status:6}  {', '.join(verdict.failed) or '-'}")
    mutants = [verdicts[s] for s in mutant_specs()]
    killed = sum(v.caught for v in mutants)
    clean = all(not verdicts[b].caught for b in BUILTINS)
    print(
        f"kill rate: {killed}/{len(mutants)} ({100 * killed / len(mutants):.0f}%); "
        f"built-ins {'all pass' if clean else 'FAIL'}"
    )
    return 0 if killed == len(mutants) and clean else 1


if __name__ == "__main__":
    sys.exit(main())
