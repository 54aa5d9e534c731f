"""The CI gate: verdicts from bootstrap intervals, statuses, baselines and the command line."""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from harness.cli.main import main
from harness.gate import (
    BaselineError,
    RunSamples,
    compare_case,
    device_class,
    judge,
    load_baseline,
    make_baseline,
    save_baseline,
)
from harness.gate.compare import performance_verdict
from harness.gate.verdicts import ORDER
from harness.results.store import RunRecord, load_results, save_results

DATA = Path(__file__).parent / "data" / "gate" / "bench-small.json"
SLOW_CASE = "decode-sweep@1/ctx=512::sdpa"


def _noisy(median: float, n: int, rng: np.random.Generator, spread: float = 0.03) -> list[int]:
    return [int(median * (1 + spread * x)) for x in rng.standard_normal(n)]


def _runs(factor: float, count: int, seed: int, drift: float = 0.02) -> list[RunSamples]:
    """``count`` runs of a backend at ``factor`` x a 1 ms peer, each run drifting a little."""
    rng = np.random.default_rng(seed)
    runs = []
    for _ in range(count):
        shift = 1 + drift * rng.standard_normal()
        runs.append(
            RunSamples(_noisy(1e6 * factor * shift, 30, rng), _noisy(1e6, 30, rng)),
        )
    return runs


def test_identical_runs_pass_with_an_interval_around_one() -> None:
    runs = _runs(2.0, 3, seed=1)
    change = compare_case("case", runs, runs)
    assert change.change == pytest.approx(1.0)
    assert change.low <= 1.0 <= change.high
    assert performance_verdict(change, 0.10) == "PASS"


def test_a_30_percent_slowdown_fails_and_a_speedup_is_improved() -> None:
    baseline = _runs(2.0, 3, seed=2)
    slower = compare_case("case", _runs(2.6, 1, seed=3), baseline)
    assert performance_verdict(slower, 0.10) == "FAIL"
    assert slower.low > 1.10
    faster = compare_case("case", _runs(1.4, 1, seed=4), baseline)
    assert performance_verdict(faster, 0.10) == "IMPROVED"


def test_a_small_slowdown_within_the_threshold_never_fails() -> None:
    baseline = _runs(2.0, 3, seed=5)
    verdicts = {
        performance_verdict(compare_case(f"c{i}", _runs(2.1, 1, seed=10 + i), baseline), 0.10)
        for i in range(20)
    }
    assert "FAIL" not in verdicts


def test_a_single_run_borrows_the_baselines_between_run_spread() -> None:
    """One tight candidate run against a drifting baseline gets a wider interval than alone."""
    baseline = _runs(2.0, 4, seed=6, drift=0.08)
    candidate = _runs(2.0, 1, seed=7, drift=0.0)
    lent = compare_case("case", candidate, baseline)
    alone = compare_case("case", candidate, baseline, spread=0.0)
    assert (lent.high - lent.low) > (alone.high - alone.low) * 1.2


@pytest.mark.parametrize(
    ("low", "high", "verdict"),
    [
        (1.11, 1.3, "FAIL"),
        (0.7, 0.9, "IMPROVED"),
        (0.95, 1.05, "PASS"),
        (1.05, 1.2, "INCONCLUSIVE"),
        (0.85, 0.95, "INCONCLUSIVE"),
    ],
)
def test_verdict_follows_where_the_whole_interval_lies(
    low: float, high: float, verdict: str
) -> None:
    from harness.gate.compare import Change

    change = Change(1.0, 1.0, (low + high) / 2, low, high, 1, 3)
    assert performance_verdict(change, 0.10) == verdict


# -- whole runs ---------------------------------------------------------------------


def _steady(record: RunRecord) -> RunRecord:
    """The recorded run with each case's samples replaced by 30 steady ones around its median.

    The file was recorded on a loaded machine (some cases spread 2x); the
    tests of whole-run verdicts want a known, small noise.
    """
    rng = np.random.default_rng(0)
    for case in record.cases:
        if case.forward is not None:
            median = float(np.median(case.forward.samples_ns))
            case.forward.samples_ns = _noisy(median, 30, rng, spread=0.02)
    return record


@pytest.fixture
def run(tmp_path: Path) -> RunRecord:
    return _steady(load_results(DATA))


@pytest.fixture
def run_file(run: RunRecord, tmp_path: Path) -> Path:
    return save_results(run, tmp_path / "run.json")


def _slowed(run: RunRecord, case_id: str, factor: float) -> RunRecord:
    slowed = copy.deepcopy(run)
    forward = slowed.case(case_id).forward
    assert forward is not None
    forward.samples_ns = [int(s * factor) for s in forward.samples_ns]
    return slowed


def test_a_run_against_itself_passes_every_case(run: RunRecord) -> None:
    report = judge([run], [run, run, run], threshold=0.10)
    assert not report.failed
    compared = [c for c in report.cases if c.change is not None]
    assert len(compared) == 4  # two backends x two contexts; the peer is not compared
    assert {c.verdict for c in compared} <= {"PASS", "INCONCLUSIVE"}


def test_a_slowed_backend_fails_only_its_case(run: RunRecord) -> None:
    report = judge([_slowed(run, SLOW_CASE, 1.5)], [run, run, run], threshold=0.10)
    assert report.failed
    assert [c.key for c in report.cases if c.verdict == "FAIL"] == [SLOW_CASE]


def test_a_failing_status_fails_and_names_the_status(run: RunRecord) -> None:
    broken = copy.deepcopy(run)
    case = broken.case(SLOW_CASE)
    case.status, case.error, case.forward = "INCORRECT_NUMERICAL", "max error 3.0", None
    report = judge([broken], [run], threshold=0.10)
    failed = [c for c in report.cases if c.verdict == "FAIL"]
    assert [c.key for c in failed] == [SLOW_CASE]
    assert "INCORRECT_NUMERICAL: max error 3.0" in failed[0].detail


def test_a_lost_capability_fails_but_unsupported_on_both_sides_does_not(run: RunRecord) -> None:
    lost = copy.deepcopy(run)
    case = lost.case(SLOW_CASE)
    case.status, case.error, case.forward = "UNSUPPORTED", "no longer claimed", None
    report = judge([lost], [run], threshold=0.10)
    assert [c.verdict for c in report.cases if c.key == SLOW_CASE] == ["FAIL"]
    assert not judge([lost], [lost], threshold=0.10).failed


def test_missing_and_new_cases_are_listed_not_failed(run: RunRecord) -> None:
    fewer = copy.deepcopy(run)
    fewer.cases = [c for c in fewer.cases if not c.id.startswith("decode-sweep@1/ctx=2048")]
    report = judge([fewer], [run], threshold=0.10)
    assert not report.failed
    assert report.count("MISSING") == 3
    assert judge([run], [fewer], threshold=0.10).count("NEW") == 3


def test_match_compares_a_renamed_backend_with_the_baselines(run: RunRecord) -> None:
    renamed = copy.deepcopy(_slowed(run, SLOW_CASE, 1.5))
    for case in renamed.cases:
        if case.backend == "sdpa":
            case.backend = "my_copy.py:Sdpa"
    report = judge([renamed], [run, run, run], threshold=0.10, rename={"my_copy.py:Sdpa": "sdpa"})
    assert [c.key for c in report.cases if c.verdict == "FAIL"] == [SLOW_CASE]


def test_conformance_failures_fail_the_gate(run: RunRecord) -> None:
    report = judge([run], [run], threshold=0.10, conformance_failures=["sdpa · test_x"])
    assert report.failed


# -- baselines ----------------------------------------------------------------------


def test_device_class_names_kind_model_and_cpus() -> None:
    assert device_class({"device": "cpu", "cpu_model": "AMD EPYC", "cpus_allowed": 2}) == (
        "cpu-amd-epyc-2cpu"
    )
    assert device_class({"device": "cuda:0", "device_name": "NVIDIA H200"}) == "cuda-nvidia-h200"


def test_a_baseline_needs_three_runs_of_one_class(run: RunRecord) -> None:
    with pytest.raises(BaselineError, match="at least 3 runs"):
        make_baseline([run, run])
    other = copy.deepcopy(run)
    other.environment["cpus_allowed"] = 64
    with pytest.raises(BaselineError, match="different device classes"):
        make_baseline([run, run, other])


def test_a_baseline_refuses_a_partial_run(run: RunRecord) -> None:
    cut = copy.deepcopy(run)
    cut.partial = True
    with pytest.raises(BaselineError, match=r"run\(s\) \[2\] are marked partial"):
        make_baseline([run, cut, run])


def test_a_baseline_round_trips_and_a_results_file_reads_as_one(
    run: RunRecord, tmp_path: Path
) -> None:
    path = save_baseline(make_baseline([run, run, run]), tmp_path / "b" / "baseline.json")
    loaded = load_baseline(path)
    assert loaded.device_class == device_class(run.environment)
    assert len(loaded.runs) == 3
    assert [c.id for c in loaded.runs[0].cases] == [c.id for c in run.cases]
    assert len(load_baseline(DATA).runs) == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not valid JSON"),
        ('{"schema": "other"}', "neither a baseline"),
        ('{"schema": "attn-harness/baseline", "schema_version": 9, "runs": []}', "version 9"),
        ('{"schema": "attn-harness/baseline", "schema_version": 1, "runs": []}', "non-empty"),
    ],
)
def test_a_bad_baseline_is_refused_with_its_reason(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "baseline.json"
    path.write_text(content)
    with pytest.raises(BaselineError, match=message):
        load_baseline(path)


# -- the command line ---------------------------------------------------------------


@pytest.fixture
def baseline_file(run: RunRecord, tmp_path: Path) -> Path:
    return save_baseline(make_baseline([run, run, run]), tmp_path / "baseline.json")


def test_gate_passes_a_run_against_its_own_baseline(
    baseline_file: Path, run_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junit = tmp_path / "gate.xml"
    code = main(["gate", "--baseline", str(baseline_file), str(run_file), "--junitxml", str(junit)])
    assert code == 0
    assert "attn-harness gate: PASSED" in capsys.readouterr().out
    suite = ET.parse(junit).getroot()
    assert suite.get("failures") == "0"
    assert int(suite.get("tests", "0")) == 6


def test_gate_fails_a_slowed_copy_and_says_which_case(
    run: RunRecord, baseline_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slowed = save_results(_slowed(run, SLOW_CASE, 1.3), tmp_path / "slow.json")
    junit = tmp_path / "gate.xml"
    code = main(["gate", "--baseline", str(baseline_file), str(slowed), "--junitxml", str(junit)])
    out = capsys.readouterr().out
    assert code == 1
    assert f"FAIL     {SLOW_CASE}" in out
    assert "attn-harness gate: FAILED" in out
    failures = ET.parse(junit).getroot().findall(".//failure")
    assert len(failures) == 1


def test_gate_refuses_another_device_class_unless_forced(
    run: RunRecord, baseline_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    moved = copy.deepcopy(run)
    moved.environment["cpu_model"] = "Intel Xeon"
    other = save_results(moved, tmp_path / "other.json")
    assert main(["gate", "--baseline", str(baseline_file), str(other)]) == 2
    assert "the baseline is for cpu-amd-epyc-2cpu" in capsys.readouterr().err
    assert main(["gate", "--baseline", str(baseline_file), str(other), "--force"]) == 0


@pytest.mark.parametrize(
    "content",
    ['{"schema": "attn-harness/results", "schema_version": 2}', "{not json", ""],
)
def test_gate_exits_2_on_unusable_results_and_writes_nothing(
    baseline_file: Path, tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    junit = tmp_path / "gate.xml"
    code = main(["gate", "--baseline", str(baseline_file), str(bad), "--junitxml", str(junit)])
    assert code == 2
    assert "bad.json" in capsys.readouterr().err
    assert not junit.exists()


def test_gate_exits_2_on_an_unknown_status(baseline_file: Path, tmp_path: Path) -> None:
    document = json.loads(DATA.read_text())
    document["cases"][1]["status"] = "FASTER_THAN_LIGHT"
    bad = tmp_path / "status.json"
    bad.write_text(json.dumps(document))
    assert main(["gate", "--baseline", str(baseline_file), str(bad)]) == 2


def test_baseline_command_pools_runs_and_refuses_too_few(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pooled.json"
    assert main(["baseline", str(DATA), str(DATA), str(DATA), "--out", str(out)]) == 0
    assert len(load_baseline(out).runs) == 3
    assert main(["baseline", str(DATA), "--out", str(tmp_path / "one.json")]) == 2
    assert "at least 3 runs" in capsys.readouterr().err
    assert not (tmp_path / "one.json").exists()


def test_gate_fails_on_a_failed_conformance_test_and_names_it(
    baseline_file: Path, run_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = Path(__file__).parent / "data" / "report" / "conform.xml"
    passing = tmp_path / "passing.xml"
    passing.write_text(report.read_text())
    assert main(["gate", "--baseline", str(baseline_file), str(run_file), str(passing)]) == 0
    failing = tmp_path / "failing.xml"
    tree = ET.parse(report)
    case = tree.getroot().find(".//testcase[@name='test_only_mapped_slots_change[sdpa]']")
    assert case is not None
    ET.SubElement(case, "failure", message="slot 7 changed")
    tree.write(failing)
    capsys.readouterr()
    assert main(["gate", "--baseline", str(baseline_file), str(run_file), str(failing)]) == 1
    assert "FAIL conformance: sdpa · test_only_mapped_slots_change (failing.xml)" in (
        capsys.readouterr().out
    )


def test_a_folder_of_baselines_is_searched_by_device_class(
    run: RunRecord, run_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "baselines"
    folder.mkdir()
    assert main(["gate", "--baseline", str(folder), str(run_file)]) == 2
    assert "no baseline for cpu-amd-epyc-2cpu" in capsys.readouterr().err
    assert main(["gate", "--baseline", str(folder), str(run_file), "--no-baseline-ok"]) == 0
    assert "performance NOT compared" in capsys.readouterr().out
    save_baseline(make_baseline([run, run, run]), folder / "cpu-amd-epyc-2cpu" / "baseline.json")
    assert main(["gate", "--baseline", str(folder), str(run_file)]) == 0
    assert "3 baseline run(s) (cpu-amd-epyc-2cpu)" in capsys.readouterr().out


def test_three_runs_are_pooled_by_their_median_so_one_burst_moves_nothing() -> None:
    from harness.gate.compare import pooled_ratio

    rng = np.random.default_rng(8)
    steady = _runs(2.0, 2, seed=9, drift=0.0)
    burst = RunSamples(_noisy(6e6, 30, rng), _noisy(1e6, 30, rng))  # 3x: a neighbour's burst
    assert pooled_ratio([*steady, burst]) == pytest.approx(2.0, rel=0.05)
    change = compare_case("case", [*steady, burst], _runs(2.0, 3, seed=10, drift=0.0))
    assert change.low <= 1.0 <= change.high
    assert performance_verdict(change, 0.10) != "FAIL"
    # with seven runs the burst is outvoted in almost every resample too
    many = compare_case("case", [*_runs(2.0, 6, seed=11, drift=0.0), burst], steady * 2)
    assert many.high < 1.10


def test_without_a_baseline_a_failing_status_still_fails(
    run: RunRecord, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = copy.deepcopy(run)
    case = broken.case(SLOW_CASE)
    case.status, case.error, case.forward = "RUNTIME_ERROR", "CUDA error: boom", None
    path = save_results(broken, tmp_path / "broken.json")
    folder = tmp_path / "baselines"
    folder.mkdir()
    code = main(["gate", "--baseline", str(folder), str(path), "--no-baseline-ok"])
    out = capsys.readouterr().out
    assert code == 1
    assert f"FAIL     {SLOW_CASE}" in out
    assert "RUNTIME_ERROR: CUDA error: boom" in out


# -- the output's width ------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
COMMITTED_BASELINE = "reports/baselines/cpu-intel-r-xeon-r-processor-2cpu/baseline.json"
PARTIAL_RUN = "reports/gpu-check-cpu-rehearsal-2026-12-01/bench-cpu.json"
"""A committed partial run against the committed baseline of its machine: most cases MISSING."""
VERDICTS = ORDER


def _missing_by_workload() -> dict[str, int]:
    """The baseline's cases the partial run lacks, per workload: what the gate must count.

    Read from the two files, so refreshing the committed baseline (``nox -s baseline``)
    changes the expected counts with it."""
    from collections import Counter

    from harness.gate.verdicts import case_key

    def keys(runs: list[RunRecord]) -> set[str]:
        return {case_key(case) for run in runs for case in run.cases}

    baseline = keys(load_baseline(ROOT / COMMITTED_BASELINE).runs)
    candidate = keys([load_results(ROOT / PARTIAL_RUN)])
    missing = Counter(key.split("@", 1)[0] for key in baseline - candidate)
    assert sum(missing.values()) > 20, "the partial run must miss many cases for this test"
    return dict(sorted(missing.items()))


def _gate_output(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], columns: int, *extra: str
) -> list[str]:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["gate", "--baseline", COMMITTED_BASELINE, PARTIAL_RUN, *extra]) == 0
    return capsys.readouterr().out.splitlines()


def _case_rows(lines: list[str]) -> list[str]:
    return [line for line in lines if line.split(" ", 1)[0] in VERDICTS]


@pytest.mark.parametrize("columns", [80, 120])
def test_gate_fits_the_terminal_and_counts_many_missing_cases_on_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], columns: int
) -> None:
    lines = _gate_output(monkeypatch, capsys, columns)
    assert max(len(line) for line in lines) <= columns
    text = " ".join(" ".join(lines).split())
    missing = _missing_by_workload()
    per_workload = ", ".join(f"{name} x {count}" for name, count in missing.items())
    total = sum(missing.values())
    assert f"{total} cases MISSING (in the baseline, not in the candidate): {per_workload}" in text
    assert "(-v lists them)" in text
    assert not [row for row in _case_rows(lines) if row.startswith("MISSING")]
    assert len(_case_rows(lines)) == 4  # the INCONCLUSIVE case past the threshold, 3 NEW
    assert "(2 more cases, each within the threshold or not compared" in text
    assert (
        f"attn-harness gate: PASSED: 2 INCONCLUSIVE, {total} MISSING, 3 NEW, 1 UNCOMPARED" in text
    )


def test_gate_verbose_lists_every_case_within_the_width(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    junit = tmp_path / "gate.xml"
    lines = _gate_output(monkeypatch, capsys, 80, "-v", "--junitxml", str(junit))
    assert max(len(line) for line in lines) <= 80
    rows = _case_rows(lines)
    assert (
        len(rows) == 2 + sum(_missing_by_workload().values()) + 3 + 1
    )  # every case, one row each (continuations indented)
    keys = {row.split()[1] for row in rows}
    assert "decode-sweep@1/ctx=1024::contiguous-sdpa" in keys  # case names are kept whole
    assert int(ET.parse(junit).getroot().get("tests", "0")) == len(rows)
