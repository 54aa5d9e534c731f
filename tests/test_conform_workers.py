"""``attn-harness conform --workers N``: the suite spread over pytest-xdist workers reads
as it does in one process (verdicts, failure entries, coverage, JUnit, replay)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from harness.conformance.claim_coverage import CoverageLog
from harness.conformance.cost_budget import CostLedger, NotChecked
from harness.conformance.report import FailureEntry, Verdicts, printed_replay
from harness.conformance.runner import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from harness.conformance.triage_evidence import TriageLog
from harness.conformance.workers import (
    WorkerTallies,
    backend_in_nodeid,
    pack_tallies,
    unpack_tallies,
    xdist_arguments,
)
from harness.numerics.scenario import Scenario

pytestmark = pytest.mark.integration  # real processes: `nox -s integration`

FIXTURES = "tests/fixtures/conform_backends.py"


def _scenario(seed: int, dtype: str = "float32") -> Scenario:
    import torch

    return Scenario(
        dp_size=2,
        dp_rank=seed % 2,
        total_pages=8,
        dtype=getattr(torch, dtype),
        context_lens=(5 + seed,),
        query_lens=(1,),
        seed=seed,
    )


def test_coverage_of_two_halves_merged_is_the_coverage_of_the_whole():
    steps = [_scenario(i, "float16" if i % 3 else "float32") for i in range(6)]
    whole, first, second = CoverageLog(), CoverageLog(), CoverageLog()
    for i, step in enumerate(steps):
        whole.record("b", f"test_{i % 2}", [step])
        (first if i < 3 else second).record("b", f"test_{i % 2}", [step])
    first.merge(second)
    assert first.as_json() == whole.as_json()
    assert first.backends["b"].totals()["dtype"] == Counter(float32=2, float16=4)


def test_triage_evidence_and_cost_ledgers_merge_by_adding():
    step = _scenario(1)
    mine, theirs = TriageLog(), TriageLog()
    mine.held("b", "t", [step])
    theirs.held("b", "t", [step])
    theirs.failed("b", "t", [_scenario(2)])
    mine.merge(theirs)
    evidence = mine.tests("b")["t"]
    assert sum(evidence.held.values()) == 2
    assert sum(evidence.failed.values()) == 1

    run, worker = CostLedger(100.0), CostLedger(50.0)
    worker.charge("b", "t", 10, 2.0)
    worker.skipped.append(NotChecked("b", "t[x]", 9.0, False, "dp 2"))
    run.merge(worker)
    run.merge(worker)
    assert run.spent[("b", "t")] == 4.0
    assert run.checked_in("b", "t") == 2
    assert len(run.not_checked("b")) == 2
    assert "100 s of examples" in run.summary_lines("ci")[0]  # the run's budget, not a share


def test_failures_keep_collection_order_whatever_order_they_arrive_in():
    verdicts = Verdicts()
    for position in (7, 2, 9, 4):
        verdicts.add_failure(FailureEntry("b", f"t{position}", "", "", ""), position)
    assert [f.test for f in verdicts.failures] == ["t2", "t4", "t7", "t9"]


def test_the_backend_named_in_a_test_id():
    names = ["triton", "sglang-triton", "reference"]
    assert backend_in_nodeid("a.py::test_x[sglang-triton-float32]", names) == "sglang-triton"
    assert backend_in_nodeid("a.py::test_x[triton]", names) == "triton"
    assert backend_in_nodeid("a.py::test_x[triton-decode]", names) == "triton"
    assert backend_in_nodeid("a.py::test_x[other]", names) is None


def test_tallies_travel_as_bytes_and_nothing_else_is_accepted():
    log = CoverageLog()
    log.record("b", "t", [_scenario(3)])

    class Run:
        coverage, evidence, cost, deselected, collection = log, None, None, True, None

    back = unpack_tallies(pack_tallies(Run()))
    assert isinstance(back, WorkerTallies)
    assert back.deselected
    assert back.coverage.as_json() == log.as_json()
    import pickle

    with pytest.raises(TypeError, match="not its tallies"):
        unpack_tallies(pickle.dumps({"coverage": None}))


def test_one_worker_adds_no_xdist_arguments():
    assert xdist_arguments(1) == []
    assert xdist_arguments(3) == ["-p", "xdist", "-n", "3", "--dist", "worksteal"]


def _junit_cases(path: Path) -> list[tuple[str, str, str]]:
    root = ET.parse(path).getroot()
    cases = []
    for case in root.iter("testcase"):
        outcome = "failed" if case.find("failure") is not None else "passed"
        outcome = "skipped" if case.find("skipped") is not None else outcome
        cases.append((case.get("classname", ""), case.get("name", ""), outcome))
    return sorted(cases)


def _suite_properties(path: Path) -> dict[str, str]:
    root = ET.parse(path).getroot()
    suite = root.find("testsuite")
    assert suite is not None
    found = suite.find("properties")
    properties = {} if found is None else {p.get("name"): p.get("value") for p in found}
    # hypothesis's own plugin records its statistics only when it runs in the JUnit writer
    return {k: v for k, v in properties.items() if not k.startswith("hypothesis-statistics")}


SELECTION = ("-k", "test_outputs_match_oracle or test_only_mapped_slots_change")


def test_two_workers_give_the_verdicts_failures_coverage_and_junit_of_one(conform, tmp_path):
    """The same examples under ``ci`` in any process: the outputs match line for line."""
    runs = {}
    for workers in ("1", "2"):
        junit = tmp_path / f"w{workers}.xml"
        args = ["--backend", "reference", "--backend", f"{FIXTURES}:OffByOneScale"]
        runs[workers] = conform(
            *args, "--workers", workers, "--junitxml", str(junit), "--", *SELECTION
        )
        assert runs[workers].returncode == EXIT_FAILED, runs[workers].stdout[-3000:]
    one, two = (runs[w].stdout.splitlines() for w in ("1", "2"))
    assert two[0] == one[0] + " · 2 workers"  # the one header, saying how it ran
    table = [line for line in one if line.startswith(("property", "test_", "FAILED", "CAUSE"))]
    assert table
    assert table == [
        line for line in two if line.startswith(("property", "test_", "FAILED", "CAUSE"))
    ]
    assert one[-1].split(" in ")[0] == two[-1].split(" in ")[0]  # the closing verdict
    assert _junit_cases(tmp_path / "w1.xml") == _junit_cases(tmp_path / "w2.xml")
    assert _suite_properties(tmp_path / "w1.xml") == _suite_properties(tmp_path / "w2.xml")
    assert _suite_properties(tmp_path / "w2.xml")["coverage[reference].examples"] != "0"
    coverage = [json.loads((tmp_path / f"w{w}.coverage.json").read_text()) for w in "12"]
    assert coverage[0] == coverage[1]


def test_a_failure_found_by_a_worker_replays_in_one_process(conform):
    args = ("--backend", f"{FIXTURES}:OffByOneScale", "--workers", "2")
    found = conform(*args, "--", "-k", "test_outputs_match_oracle and float32")
    assert found.returncode == EXIT_FAILED, found.stdout[-3000:]
    command = printed_replay(found.stdout)
    assert "--workers" not in command
    again = conform(*command[4:], "--workers", "2")  # a replay ignores the workers asked for
    assert again.returncode == EXIT_FAILED
    assert "workers" not in again.stdout.splitlines()[0]
    entry = next(line for line in found.stdout.splitlines() if line.startswith("FAILED "))
    assert entry in again.stdout


def test_a_worker_that_dies_is_a_failure_naming_the_test(conform):
    result = conform(
        "--backend",
        f"{FIXTURES}:DiesInAWorker",
        "--workers",
        "2",
        "--",
        "-k",
        "test_outputs_match_oracle and float32",
        "--max-worker-restart",
        "0",
    )
    assert result.returncode == EXIT_FAILED
    out = result.stdout
    assert "its worker process died" in out, out[-3000:]
    assert "test_outputs_match_oracle[float32]" in out


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_workers_must_be_a_positive_count(conform, value):
    result = conform("--backend", "reference", "--workers", value)
    assert result.returncode == EXIT_USAGE
    assert "--workers" in result.stderr


def test_default_is_one_worker_per_usable_cpu(monkeypatch):
    from harness.cli import main as cli

    seen = {}

    def run_conformance(*args, **kwargs):
        seen.update(kwargs)
        return EXIT_OK

    monkeypatch.setattr("harness.conformance.runner.run_conformance", run_conformance)
    monkeypatch.setattr("harness.bench.environment.usable_cpus", lambda: 5)
    assert cli.main(["conform", "--backend", "reference"]) == EXIT_OK
    assert seen["workers"] == 5


def test_the_frozen_pool_is_fixed_boundaries_whatever_is_imported_and_is_undone(
    tmp_path, monkeypatch
):
    from hypothesis.internal.conjecture import providers

    from harness.conformance.draw_constants import freeze_pool, kernel_boundaries

    before = providers._get_local_constants
    undo = freeze_pool()
    assert callable(undo)
    try:
        pool = providers._get_local_constants()
        assert pool == kernel_boundaries()
        integers = pool.set_for_type("integer")
        assert {255, 256, 257, 8192, 32768, -32769} <= integers  # splits, int16's edge
        assert -5e4 in pool.set_for_type("float")  # a finite sentinel
        (tmp_path / "late_module.py").write_text("THRESHOLD = 987654321\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        __import__("late_module")
        assert providers._get_local_constants() == kernel_boundaries()
    finally:
        undo()
    assert providers._get_local_constants is before
