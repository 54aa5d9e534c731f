"""The main job: conformance workers, the benchmarks and the report from one command."""

from __future__ import annotations

import dataclasses
import io
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from harness.bench.peer import PEER_NAME
from harness.bench.runner import BenchConfig, run_benchmarks
from harness.bench.timing import TimingConfig
from harness.bench.workloads import CaseSpec, Workload, get_workload
from harness.cli.main import main
from harness.cli.run_jobs import (
    WIDTH,
    Done,
    _child_env,
    closing_verdict,
    file_stem,
    heartbeat,
    printer,
    probe_seconds,
    schedule,
)
from harness.core.registry import BackendEntry
from harness.core.threads import timing_threads
from harness.processes.progress_file import Progress
from harness.results.store import load_results, save_results
from reference_backends.reference import ReferenceBackend

pytestmark = pytest.mark.integration  # real processes: `nox -s integration`

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
    skipped = int(suite.get("skipped", "0"))
    counted = f"{tests} tests; {skipped} unsupported, not run" if skipped else f"{tests} tests"
    verdict = f"conformance: reference: PASSED: every property held for reference ({counted})"
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
    assert f"main job: 1 backend ({FAILING})" in printed  # not "1 backends"
    assert f"conformance FAILED for {FAILING}" in printed
    page = (out / "report" / "index.html").read_text()
    assert "RefusesEverything" in page


def test_an_unwritable_out_folder_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["run", "--backend", "reference", "--out", str(blocker / "run")]) == 2
    assert f"{blocker} is not a directory" in capsys.readouterr().err


# -- progress with content, and the closing verdict ------------------------------------


def _log(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_the_heartbeat_reads_each_steps_progress_as_data() -> None:
    triton = Done.of(Progress(12, 49, 240.0, "test_b[triton]"))
    flex = Done.of(Progress(30, 49))
    assert triton == Done(12, 49, 240.0)
    assert Done.of(None) is None  # a step that wrote no progress yet
    running = [
        ("triton", triton, 310.0),
        ("flex", flex, 300.0),  # its own rate: 19 more at 10 s each
        ("sdpa", None, 12.0),
    ]
    assert heartbeat("conformance", running, waiting=2) == (
        "conformance: triton 12/49 (~4 min left), flex 30/49 (~3 min), sdpa 12 s; 2 waiting"
    )


def test_conform_and_bench_write_their_progress_for_a_parent(tmp_path, monkeypatch) -> None:
    """What the main job reads: ``conform``'s tests done with its estimate, ``bench``'s
    cases, one JSON line per step, in the file ``ATTN_HARNESS_PROGRESS`` names."""
    from harness.cli.bench import Progress as BenchBar
    from harness.processes.progress_file import PROGRESS_ENV, read_progress

    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv(PROGRESS_ENV, str(path))
    bar = BenchBar(enabled=False)
    bar(11, 120, "decode-sweep@1/ctx=512 sdpa")
    bar(12, 120, "x")
    assert read_progress(path) == Progress(12, 120, None, "x")


def test_a_heartbeat_fits_its_width_by_dropping_detail_in_turn() -> None:
    long = "tests/fixtures/conform_backends.py:RefusesEverything"
    running = [(long, Done(3, 49, 540.0), 40.0), ("flex", Done(30, 49), 300.0)]
    full = heartbeat("conformance", running, 1, width=200)
    assert full == f"conformance: {long} 3/49 (~9 min left), flex 30/49 (~3 min); 1 waiting"
    no_estimates = heartbeat("conformance", running, 1, width=len(full) - 1)
    assert no_estimates == f"conformance: {long} 3/49, flex 30/49; 1 waiting"
    cut = heartbeat("conformance", running, 1, width=len(no_estimates) - 1)
    assert cut == "conformance: tests/fixtu~ 3/49, flex 30/49; 1 waiting"
    many = [(f"backend{i}", Done(i, 49), 9.0) for i in range(1, 20)]
    line = heartbeat("conformance", many, 0)
    assert len(line) <= WIDTH - 10
    assert line.endswith("more")
    assert line.startswith("conformance: backend1 1/49, backend2 2/49,")


def test_the_bench_heartbeat_counts_cases() -> None:
    assert heartbeat("bench", [("cases", Done(12, 120), 20.0)]) == "bench: cases 12/120"
    assert heartbeat("bench", [("cases", Done(30, 120), 50.0)]) == (
        "bench: cases 30/120 (~2 min left)"  # a quarter done: 90 more at 1.7 s each
    )


def test_on_a_terminal_progress_is_one_live_line_that_the_next_line_replaces() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    say = printer(screen)
    say.live("conformance: triton 12/49 (~4 min left)")
    say.live("conformance: triton 13/49 (~4 min left)")
    say("conformance: triton: PASSED")
    text = screen.getvalue()
    assert text.count("\r\x1b[K") == 3  # two redraws, then cleared for the real line
    assert text.endswith("s] conformance: triton: PASSED\n")
    assert text.count("\n") == 1  # the live line never leaves a line behind
    plain = io.StringIO()
    say = printer(plain)
    say.live("conformance: triton 12/49")  # no terminal: nothing
    assert plain.getvalue() == ""


SPEC = CaseSpec("decode", (9, 5), (1, 1), seed=1, num_heads=4, num_kv_heads=2, head_dim=16)
SPEC2 = dataclasses.replace(SPEC, name="decode2")
TINY = Workload("tiny", 1, "decode", "tests only", (SPEC, SPEC2), (SPEC, SPEC2))
FAST = TimingConfig(warmup=1, min_samples=5, max_samples=5, cold_cache=False)


def _results(path: Path, flags: list[str], case_flags: list[str], status: str = "PASSED") -> None:
    """A results file as the bench writes it: the peer of two cases, flags put in."""
    config = BenchConfig(timing=FAST, prepare_timing=FAST, probe_ceilings=False)
    record = run_benchmarks([], [TINY], config)
    first, second = record.cases
    first.flags = case_flags
    second.status, second.forward, second.metrics = status, None, None
    if status == "PASSED":
        second.status = "UNSUPPORTED"
    record.flags = flags
    save_results(record, path)


def test_the_closing_verdict_counts_every_flag_of_the_results_file(tmp_path: Path) -> None:
    results, log = tmp_path / "bench.json", tmp_path / "bench.log"
    error = "measurement error: compute at 220% of its ceiling; fraction withheld (x)"
    spread = "ceiling spread: float32 matmul 36 GFLOP/s to 107 GFLOP/s over 3 probes (66%); y"
    _results(results, [spread], [error])
    assert closing_verdict([], 0, results, log) == (
        "main job: conformance passed; bench passed (no backend cases; peer: 1 PASSED, "
        "1 UNSUPPORTED), 2 flags: "
        "1 ceiling spread (float32 matmul 36 GFLOP/s to 107 GFLOP/s over 3 probes), "
        "1 measurement error (compute at 220% of its ceiling)"
    )
    assert closing_verdict(["flex"], None, results, log) == (
        "main job: conformance FAILED for flex"
    )
    _results(results, [], [], status="TIMEOUT")
    assert closing_verdict([], 1, results, log).endswith(
        "bench FAILED (no backend cases; peer: 1 PASSED, 1 TIMEOUT), no flags"
    )


def test_without_results_the_verdict_says_why(tmp_path: Path) -> None:
    log = _log(tmp_path / "bench.log", "attn-harness bench: error: results not saved: full")
    assert closing_verdict([], 2, tmp_path / "bench.json", log) == (
        "main job: conformance passed; bench FAILED: no results (exit 2): "
        "attn-harness bench: error: results not saved: full"
    )


def test_conformance_runs_on_one_thread_and_the_bench_as_a_plain_bench(monkeypatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert _child_env(one_thread=True)["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in _child_env(one_thread=False)  # torch's default, as alone
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert _child_env(one_thread=False)["OMP_NUM_THREADS"] == "3"  # the user's, for both
    assert timing_threads() == (torch.get_num_threads(), "OMP_NUM_THREADS=3")
    assert timing_threads(2) == (2, "--threads")


def test_no_time_left_is_guessed_before_a_quarter_of_the_tests_are_done() -> None:
    """One slow first test would otherwise read as an hour left (it said 51 min, then done)."""
    from harness.conformance.progress import progress_line

    assert progress_line(300.0, "x", 2, 49) == "[  300 s] x: 2/49 tests done"
    assert Done(2, 49).estimate(300.0) is None
    assert progress_line(300.0, "x", 13, 49).endswith("tests done, about 14 min left")
    assert Done(13, 49).estimate(300.0) == "14 min"
    assert Done(13, 49, left_s=90.0).estimate(300.0) == "2 min"  # the step's own, first
