"""``attn-harness ab`` end to end: real worker processes, a planted slowdown, a git revision."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.cli.ab import gate_report
from harness.cli.main import EXIT_FAILED, EXIT_OK, EXIT_USAGE, main
from harness.results.pairs import load_pair, rounds_log_ratios

ROOT = Path(__file__).resolve().parents[1]
SLOWED = "suites/mutants/slowdown.py:SlowedSdpa"
ONE_CASE = ["--workload", "decode-sweep", "--case", "ctx=512"]
QUICK = [
    "--min-rounds",
    "3",
    "--max-rounds",
    "40",
    "--samples",
    "5",
    "--threads",
    "1",
    "--cpus",
    "none",
    "--no-progress",
]
"""One thread a side: the other xdist worker holds the other core, and two threads each
would make every round a fight for it (rounds then scatter by 3x). Not pinned: the
scheduler keeps the timing side off the core the other worker's test holds (pinning
is checked on its own below)."""

pytestmark = [
    pytest.mark.integration,
    pytest.mark.xdist_group("ab"),
]  # both sides time: keep these off each other


def test_a_planted_2x_slowdown_fails_with_every_round_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 2x slowdown against a 50% threshold: decided in a few rounds even on a loaded machine.

    At the default 10% a round's evidence is small next to the spread of rounds timed
    beside the other xdist worker (a log-ratio spread of up to 0.9 on a loaded CI
    machine), and 40 rounds may end undecided.
    """
    monkeypatch.setenv("ATTN_HARNESS_SLOWDOWN", "1.0")  # each forward takes twice as long
    out, junit = tmp_path / "ab.json", tmp_path / "ab.xml"
    code = main(
        [
            "ab",
            "--base",
            "sdpa",
            "--candidate",
            SLOWED,
            *ONE_CASE,
            *QUICK,
            "--threshold",
            "0.5",
            "--out",
            str(out),
            "--junitxml",
            str(junit),
        ]
    )
    text = capsys.readouterr().out
    assert code == EXIT_FAILED, text
    assert "FAIL" in text
    assert "decode-sweep@1/ctx=512" in text
    assert "attn-harness ab: FAILED: 1 FAIL" in " ".join(text.split())
    record = load_pair(out)
    (case,) = record.cases
    assert case["verdict"] == "FAIL"
    assert case["base_status"] == case["candidate_status"] == "PASSED"
    assert len(case["rounds"]) >= 3
    assert {r["first"] for r in case["rounds"]} == {"base", "candidate"}
    assert all(len(r["base_ns"]) == len(r["candidate_ns"]) == 5 for r in case["rounds"])
    # The recorded ratio is the rounds' own (geometric mean of each round's median ratio),
    # and a FAIL means their mean log-ratio passed half the effect, log(1.5) / 2. Not
    # "ratio > 1.5": how much of the planted 2x a loaded machine shows varies (1.45 seen).
    mean_log_ratio = statistics.fmean(rounds_log_ratios(case))
    assert case["evidence"]["ratio"] == pytest.approx(math.exp(mean_log_ratio))
    assert case["evidence"]["ratio"] > math.sqrt(1.5)
    assert record.candidate["backend_class"].endswith("SlowedSdpa")
    assert gate_report(record).failed
    suite = ET.parse(junit).getroot()
    assert suite.get("failures") == "1"


def test_the_same_backend_on_both_sides_does_not_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A/A with a threshold of 50%: a FAIL would need evidence of a 1.5x slowdown.

    Every round runs in a fresh pair of workers: with one pair for the whole
    run, this test once FAILed at +42% under CI's load (one process slower
    than the other for its whole life). ``--alpha 0.01``: at the default 0.05 the test's
    own bound allows one false FAIL in 20 runs, too many for a test that must pass."""
    out = tmp_path / "aa.json"
    strict = ["--threshold", "0.5", "--alpha", "0.01"]
    code = main(["ab", "--base", "sdpa", *ONE_CASE, *QUICK, *strict, "--out", str(out)])
    assert code == EXIT_OK, capsys.readouterr().out
    record = load_pair(out)
    (case,) = record.cases
    assert record.timing["processes_per_side"] == len(case["rounds"]) >= 3


def test_the_base_from_a_git_revision_runs_in_a_worktree_that_is_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no revision to take the base from")
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    before = subprocess.run(
        ["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    out = tmp_path / "ab.json"
    code = main(
        [
            "ab",
            "--base",
            "reference",
            "--base-rev",
            "HEAD",
            *ONE_CASE,
            *QUICK,
            "--threshold",
            "3.0",  # the worktree's mechanics, not a verdict: a side against itself, beside
            # the other xdist worker's load, scatters by up to +95%
            "--out",
            str(out),
        ]
    )
    assert code == EXIT_OK, capsys.readouterr().out
    record = load_pair(out)
    assert record.base["commit"] == head
    assert record.base["revision"] == "HEAD"
    assert "attn-harness-ab-" in (record.base["source"] or "")  # loaded from the worktree
    assert record.candidate["commit"] is None
    assert str(ROOT) in (record.candidate["source"] or "")
    after = subprocess.run(
        ["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert after == before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--base-rev", "no-such-revision-xyz"], "--base-rev no-such-revision-xyz"),
        (["--workload", "no-such-workload"], "no-such-workload"),
        (["--case", "ctx=999999"], "--case ctx=999999"),
        (["--max-rounds", "3", "--min-rounds", "4"], "--max-rounds 3: below --min-rounds 4"),
        (["--samples", "3"], "--samples 3: need at least 5"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "ab.json"
    code = main(["ab", "--base", "sdpa", "--workload", "decode-sweep", *argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert message in err
    assert not out.exists()


def test_a_backend_that_does_not_load_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["ab", "--base", "sdpa", "--candidate", "no_such_pkg.mod:Cls", *ONE_CASE])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert "candidate" in err
    assert "no_such_pkg" in err


def test_the_record_is_refused_by_the_benchmark_loader_and_says_what_it_is(
    tmp_path: Path,
) -> None:
    from harness.results.pairs import PairRecordError

    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"schema_version": 1}))
    with pytest.raises(PairRecordError, match="not a paired comparison"):
        load_pair(path)


def test_by_default_both_sides_time_on_one_thread_on_the_last_usable_cpu() -> None:
    import argparse
    import os

    from harness.cli.ab import worker_settings

    args = argparse.Namespace(device="cpu", threads=None, cpus=None)
    settings = worker_settings(args)
    assert settings.threads == 1
    assert settings.cpus == (max(os.sched_getaffinity(0)),)
    assert settings.arguments()[-2:] == ["--cpus", str(max(os.sched_getaffinity(0)))]
    unpinned = worker_settings(argparse.Namespace(device="cpu", threads=None, cpus=()))
    assert unpinned.cpus is None
    assert "--cpus" not in unpinned.arguments()


def test_a_pinned_block_moves_every_thread_and_puts_them_back() -> None:
    import os
    import threading

    from harness.ab.worker import pinned

    def masks() -> dict[int, set[int]]:
        return {int(t): os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")}

    stop = threading.Event()
    helper = threading.Thread(target=stop.wait)  # a thread that exists before the block
    helper.start()
    try:
        before = masks()
        target = {max(os.sched_getaffinity(0))}
        with pinned(target):
            inside = masks()
        after = masks()
    finally:
        stop.set()
        helper.join()
    assert len(inside) >= 2
    assert all(mask == target for mask in inside.values())
    assert after == before
