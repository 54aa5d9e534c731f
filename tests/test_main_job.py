"""The main job: conformance workers, the benchmarks and the report from one command."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.cli.run_jobs import file_stem, probe_seconds, schedule
from harness.core.registry import BackendEntry
from reference_backends.reference import ReferenceBackend

MUTANT = "suites/mutants/backends.py:IgnoresPageOffset"


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
    suite = ET.parse(out / "conformance" / "reference.xml").getroot()
    assert int(suite.find("testsuite").get("tests")) > 10  # type: ignore[union-attr]
    assert (out / "bench.json").is_file()
    assert (out / "report" / "index.html").is_file()
    assert "conformance: reference: PASSED" in printed
    assert f"report: {(out / 'report' / 'index.html').resolve()}" in printed


def test_a_failing_backend_fails_the_job_and_is_still_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    code = main(["run", "--backend", MUTANT, "--profile", "kill", "--no-bench", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 1
    assert f"conformance FAILED for {MUTANT}" in printed
    page = (out / "report" / "index.html").read_text()
    assert "IgnoresPageOffset" in page


def test_an_unwritable_out_folder_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["run", "--backend", "reference", "--out", str(blocker / "run")]) == 2
    assert "cannot create" in capsys.readouterr().err
