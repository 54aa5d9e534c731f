"""``conform --shard K/N`` and ``attn-harness merge``: the shards of a run read as the run.

The merged verdict table, failure entries, coverage file and JUnit test
cases must equal an unsharded run's; files that are not every shard of one
run must be refused, naming the problem.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from harness.cli.main import main
from harness.conformance.claim_coverage import BackendCoverage, CoverageLog, StatefulRun
from harness.conformance.cost_budget import CostLedger, NotChecked
from harness.conformance.tally_json import (
    cost_from_json,
    cost_to_json,
    coverage_from_json,
    coverage_to_json,
    evidence_from_json,
    evidence_to_json,
)
from harness.conformance.triage_evidence import TestEvidence as Evidence
from harness.conformance.triage_evidence import TriageLog

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "tests" / "data" / "gate" / "bench-small.json"
FIXTURES = "tests/fixtures/conform_backends.py"
QUICK = "constructor or bind_rejects or foreign_slot"
"""Quick properties of every kind (rejections, a drawn property) for runs of a few seconds."""


def test_tallies_survive_json_unchanged() -> None:
    coverage = CoverageLog(
        {
            "b": BackendCoverage(
                examples=Counter({"test_x": 3}),
                by_test={
                    "test_x": {"dtype": Counter({"float16": 2}), "pair": Counter({"a & b": 1})}
                },
                stateful=[StatefulRun(4, {"step", "bind"}, Counter({"no pages": 2}))],
            )
        }
    )
    key = (("dtype", frozenset({"float16", "float32"})), ("layout", frozenset({"shared"})))
    evidence = TriageLog({"b": {"test_x": Evidence(Counter({key: 2}), Counter({key: 1}))}})
    ledger = CostLedger(40.0)
    ledger.charge("b", "test_x", 10, 1.5)
    ledger.skipped.append(NotChecked("b", "test_x[b]", 9.0, True, "dp 2", "stateful step"))
    ledger.failing.add(("b", "test_x"))
    for encode, decode, value in [
        (coverage_to_json, coverage_from_json, coverage),
        (evidence_to_json, evidence_from_json, evidence),
    ]:
        text = json.dumps(encode(value))
        assert decode(json.loads(text)) == value
    back = cost_from_json(json.loads(json.dumps(cost_to_json(ledger))))
    assert back is not None
    assert (back.budget_s, back.spent, back.checked) == (40.0, ledger.spent, ledger.checked)
    assert (back.skipped, back.failing) == (ledger.skipped, ledger.failing)
    assert coverage_from_json(None) is None


def conform(
    tmp_path: Path, name: str, backend: str, *extra: str, shard: str | None = None
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``attn-harness conform`` in a process of its own (as a CI shard runs it)."""
    junit = tmp_path / f"{name}.xml"
    args = ["conform", "--backend", backend, "--workers", "1", "--junitxml", str(junit)]
    args += ["--shard", shard] if shard else []
    return harness(*args, "--", *extra), junit


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def closing(text: str) -> list[str]:
    """What a run prints, without its duration (the merge adds up the shards' seconds)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("property"))
    return [re.sub(r" in \d+ s$", "", line) for line in lines[start:] if "merged" not in line]


def cases(junit: Path) -> Counter[tuple[str, str]]:
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    outcome = {True: "failed", False: "passed"}
    return Counter(
        (case.get("name", ""), outcome[case.find("failure") is not None])
        for case in suite.findall("testcase")
    )


@pytest.mark.integration
@pytest.mark.parametrize(("backend", "code"), [("reference", 0), (f"{FIXTURES}:OffByOneScale", 1)])
def test_two_shards_merged_read_as_the_unsharded_run(
    tmp_path: Path, backend: str, code: int
) -> None:
    extra = ("-k", f"{QUICK} or outputs_match", "--max-shrinks", "2")
    whole, junit = conform(tmp_path, "whole", backend, *extra)
    assert whole.returncode == code, whole.stdout + whole.stderr
    parts = []
    for k in (1, 2):
        shard, part = conform(tmp_path, f"shard{k}", backend, *extra, shard=f"{k}/2")
        assert shard.returncode in (0, 1), shard.stdout + shard.stderr
        parts.append(part)
    merged = tmp_path / "merged" / "all.xml"
    merge = harness("merge", "--out", str(merged), *map(str, reversed(parts)))
    assert merge.returncode == code, merge.stdout + merge.stderr
    assert closing(merge.stdout) == closing(
        whole.stdout
    )  # verdict table, failure entries, coverage lines
    assert cases(merged) == cases(junit)
    for path in (merged, junit):
        assert path.with_suffix(".coverage.json").exists()
    coverage = json.loads(merged.with_suffix(".coverage.json").read_text())
    assert coverage == json.loads(junit.with_suffix(".coverage.json").read_text())
    assert "shard" not in coverage  # the merged file is a whole run's


@pytest.mark.integration
def test_files_that_are_not_every_shard_of_one_run_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = ("-k", QUICK)
    _, one = conform(tmp_path, "one", "reference", *extra, shard="1/2")
    _, two = conform(tmp_path, "two", "reference", *extra, shard="2/2")
    _, other = conform(tmp_path, "other", "reference", *extra, "--examples", "3", shard="2/2")
    _, fewer = conform(tmp_path, "fewer", "reference", "-k", "constructor", shard="2/2")
    _, whole = conform(tmp_path, "whole", "reference", *extra)
    capsys.readouterr()
    out = str(tmp_path / "m.xml")
    for shards, message in [
        ([one], "conformance shard 2/2 missing: a merge needs all 2 (given: "),
        ([one, one, two], "given more than once"),
        ([one, other], "shards of different runs: their options differ (examples 3 against None)"),
        ([one, fewer], "their test selections (-k, -m) differ"),
        ([one, RESULTS], "the shards mix kinds: "),
        ([one, whole], "not a shard (run with conform --shard K/N)"),
    ]:
        assert main(["merge", "--out", out, *map(str, shards)]) == 2
        err = capsys.readouterr().err
        assert message in err
        assert "Traceback" not in err
    assert not Path(out).exists()  # nothing written for a refused merge
    two.with_suffix(".coverage.json").unlink()
    assert main(["merge", "--out", out, str(one), str(two)]) == 2
    assert "its coverage file two.coverage.json is missing" in capsys.readouterr().err


def test_a_shard_needs_a_junit_file_to_merge(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conform", "--backend", "reference", "--shard", "1/2"]) == 2
    assert "--shard 1/2 needs --junitxml FILE" in capsys.readouterr().err
    assert main(["conform", "--backend", "reference", "--shard", "3/2"]) == 2
    assert "1 <= K <= N" in capsys.readouterr().err


@pytest.mark.integration
def test_run_shards_merge_into_the_whole_main_job(tmp_path: Path) -> None:
    folders = [tmp_path / f"run-{k}" for k in (1, 2)]
    for k, folder in enumerate(folders, start=1):
        shard = harness(
            "run", "--backend", "reference", "--profile", "kill", "--workload", "decode-sweep",
            "--shard", f"{k}/2", "--out", str(folder),
        )  # fmt: skip
        assert shard.returncode == 0, shard.stdout + shard.stderr
        assert f"shard {k}/2 of each" in shard.stdout
    merged = tmp_path / "run"
    merge = harness("merge", "--out", str(merged), *map(str, folders))
    assert merge.returncode == 0, merge.stdout + merge.stderr
    parts = [cases(f / "conformance" / "reference.xml") for f in folders]
    assert cases(merged / "conformance" / "reference.xml") == parts[0] + parts[1]
    assert not set(parts[0]) & set(parts[1])  # each test in one shard
    coverage = json.loads((merged / "conformance" / "reference.coverage.json").read_text())
    assert "shard" not in coverage
    from harness.results.store import load_results

    bench = load_results(merged / "bench.json")
    shard_ids = [c.id for f in folders for c in load_results(f / "bench.json").cases]
    assert sorted(c.id for c in bench.cases) == sorted(shard_ids)
    assert {c.workload for c in bench.cases} == {"decode-sweep"}
    assert (merged / "report" / "index.html").exists()
    (folders[1] / "bench.json").unlink()
    again = harness("merge", "--out", str(tmp_path / "again"), *map(str, folders))
    assert again.returncode == 2
    assert "some shards ran the benchmarks and some did not" in again.stderr
