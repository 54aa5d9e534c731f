"""The main job: conformance workers, the benchmarks and the report from one command."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.bench.peer import PEER_NAME
from harness.bench.workloads import get_workload
from harness.cli.main import main
from harness.cli.run_jobs import file_stem, probe_seconds, schedule
from harness.core.registry import BackendEntry
from harness.results.store import load_results
from reference_backends.reference import ReferenceBackend

# Fails every property at its first example (it refuses the valid steps it claims), so
# the job's failure path runs in seconds; a wrong answer failing conformance is
# tests/test_conform.py's and tests/test_mutants.py's.
FAILING = "tests/fixtures/conform_backends.py:RefusesEverything"


def test_the_slowest_backend_starts_first() -> None:
    order = schedule({"compiled": 0.005, "triton": 0.3, "reference": 0.005, "flex": 0.03})
    assert order == ["triton", "flex", "compiled", "reference"]


def test_the_probe_times_a_backend_and_gives_a_broken_one_zero() -> None:
    class Broken(ReferenceBackend):
        def forward(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("no")

    assert probe_seconds(BackendEntry("reference", ReferenceBackend, "built-in"), "cpu") > 0
    assert probe_seconds(BackendEntry("broken", Broken, "spec"), "cpu") == 0.0


def test_a_spec_becomes_a_safe_file_name() -> None:
    assert file_stem("path/to/my.file.py:Class") == "path_to_my_file_py_Class"
    assert file_stem("../..") == "backend"


def test_the_main_job_writes_conformance_bench_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    code = main(
        [
            "run",
            "--backend",
            "reference",
            "--profile",
            "kill",
            "--workload",
            "decode-sweep",
            "--out",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed

    # conformance: one JUnit report, every test of it for this backend, none failed
    root = ET.parse(out / "conformance" / "reference.xml").getroot()
    suite = root.find("testsuite")
    assert suite is not None
    cases = list(suite.iter("testcase"))
    tests = int(suite.get("tests", "0"))
    assert tests == len(cases) > 10
    assert (suite.get("failures"), suite.get("errors")) == ("0", "0")
    for case in cases:
        assert "[reference" in case.get("name", ""), case.get("name")  # parametrised by it
        assert [c.tag for c in case if c.tag in ("failure", "error")] == [], case.get("name")
    verdict = f"conformance: reference: PASSED: every property held for reference ({tests} tests)"
    assert verdict in printed

    # bench: every decode-sweep case for the backend and its peer, checked and timed
    record = load_results(out / "bench.json")
    workload = get_workload("decode-sweep")
    assert [w["name"] for w in record.workloads] == ["decode-sweep"]
    names = [spec.name for spec in workload.cases("cpu")]
    assert names
    who = ("reference", PEER_NAME)
    expected = {f"{workload.key}/{name}::{backend}" for name in names for backend in who}
    assert {c.id for c in record.cases} == expected
    for case in record.cases:
        assert case.status == "PASSED", (case.id, case.error)
        assert case.oracle is not None
        assert case.oracle["passed"], case.id
        assert case.forward is not None
        assert case.forward.samples_ns
        assert min(case.forward.samples_ns) > 0
        assert case.metrics is not None
        assert case.metrics["median_s"] > 0
        assert case.metrics["tokens_per_s"] > 0
        if case.role == "backend":
            assert case.backend == "reference"
            assert case.peer == f"{workload.key}/{case.case}::{PEER_NAME}"
            assert case.metrics["ratio_to_peer"] > 0

    # the report: built from both, each backend's conformance row and every case shown
    page = (out / "report" / "index.html").read_text()
    assert "profile kill" in page
    skipped = int(suite.get("skipped", "0"))  # outside the backend's claim: unsupported
    row = (
        f'<td>reference</td><td class="num">{tests - skipped}</td><td class="num">0</td>'
        f'<td class="num">{skipped}</td><td class="num">{tests}</td>'
    )
    assert row in page  # passed, failed, unsupported, tests
    for name in names:
        for backend in who:
            assert f"<td>decode-sweep</td><td>{name}</td><td>{backend}</td><td>PASSED</td>" in page
    for figure in ("time-vs-context", "ratio-to-peer", "conformance"):
        assert f'id="figure-{figure}"' in page
        assert (out / "report" / "figures" / f"{figure}.svg").is_file()
    assert f"report: {(out / 'report' / 'index.html').resolve()}" in printed


def test_a_failing_backend_fails_the_job_and_is_still_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    code = main(["run", "--backend", FAILING, "--profile", "kill", "--no-bench", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 1
    assert f"conformance FAILED for {FAILING}" in printed
    page = (out / "report" / "index.html").read_text()
    assert "RefusesEverything" in page


def test_an_unwritable_out_folder_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["run", "--backend", "reference", "--out", str(blocker / "run")]) == 2
    assert "cannot create" in capsys.readouterr().err
