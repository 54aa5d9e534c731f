"""``attn-harness dist`` with real rank processes over gloo: passes, planted bugs, faults.

Each run starts dp_size Python processes; every failure must end the whole
group with an error naming the rank and the step, leave no process behind
(checked by process id and process group), and exit non-zero.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from harness.cli.main import main

pytestmark = pytest.mark.integration  # real processes: `nox -s integration`

ROOT = Path(__file__).resolve().parents[1]


def run_dist(
    tmp_path: Path, *args: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict[str, Any], str]:
    out = tmp_path / "dist.json"
    code = main(["dist", *args, "--json", str(out)])
    text = capsys.readouterr().out
    return code, json.loads(out.read_text()), text


def assert_no_process_left(record: dict[str, Any]) -> None:
    assert record["survivors"] == []
    assert record["pids"]
    for pid in record["pids"]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # the rank itself
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)  # anything it started (each rank leads its own group)


@pytest.mark.parametrize("backend", ["reference-mla", "compiled-mla"])
def test_an_mla_backend_runs_real_dp_on_latent_caches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: str
) -> None:
    """Per-rank latent pools, idle ranks among them: every rank's outputs (the value width)
    checked against the oracle, none of a wrong width, nothing left running."""
    code, record, text = run_dist(
        tmp_path, "--dp-size", "3", "--backend", backend, "--steps", "6", "--graph",
        capsys=capsys,
    )  # fmt: skip
    assert code == 0, text
    assert "PASSED" in text
    assert any(0 in s["counts"] for s in record["summary"]["steps"])  # an idle rank
    assert_no_process_left(record)


@pytest.mark.parametrize(("dp_size", "extra"), [(2, []), (4, ["--graph"])])
def test_a_correct_backend_passes_every_step_on_every_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dp_size: int, extra: list[str]
) -> None:
    code, record, text = run_dist(
        tmp_path, "--dp-size", str(dp_size), "--backend", "sdpa", "--steps", "8", *extra,
        capsys=capsys,
    )  # fmt: skip
    assert code == 0, text
    assert "PASSED" in text
    steps = record["summary"]["steps"]
    assert len(steps) == 8
    ran = [s for s in steps if s["padded"]]
    assert ran
    for step in ran:
        assert step["padded"] >= max(step["counts"])
        if "--graph" in extra:
            assert step["padded"] in (1, 2, 4, 8) or step["padded"] % 16 == 0
        else:
            assert step["padded"] == max(step["counts"])
        for rank in step["ranks"]:
            if rank["tokens"]:
                assert 0 <= rank["oracle_ratio"] <= 1
                assert 0 <= rank["shared_ratio"] <= 1
    # some rank ran a dummy batch while others worked
    assert any(0 in s["counts"] for s in ran)
    assert_no_process_left(record)


def test_a_backend_that_ignores_page_offset_fails_on_the_rank_whose_pool_is_offset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, record, text = run_dist(
        tmp_path, "--dp-size", "2", "--backend", "suites.mutants.backends:IgnoresPageOffset",
        "--steps", "4", capsys=capsys,
    )  # fmt: skip
    assert code == 1, text
    assert record["failed_rank"] == 1  # rank 0's pool starts at page 0: it cannot tell
    assert "rank 1" in record["message"]
    assert_no_process_left(record)


def test_a_backend_that_writes_padding_rows_is_caught_by_the_canary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, record, _ = run_dist(
        tmp_path, "--dp-size", "2", "--backend", "suites.mutants.backends:WritesPaddingSlots",
        "--steps", "6", "--graph", capsys=capsys,
    )  # fmt: skip
    assert code == 1
    assert "changed layer" in record["message"]
    assert "(raised on 2 of 2 ranks)" in record["message"]
    assert_no_process_left(record)


def test_a_backend_that_pads_with_one_token_rows_runs_them_on_every_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"{ROOT / 'tests' / 'test_padding_convention.py'}:OneTokenPadding"
    code, record, text = run_dist(
        tmp_path, "--dp-size", "2", "--backend", spec, "--steps", "6", "--graph", capsys=capsys,
    )  # fmt: skip
    assert code == 0, text
    assert any(s["padded"] > max(s["counts"]) for s in record["summary"]["steps"])
    assert_no_process_left(record)


@pytest.mark.parametrize(
    ("fault", "dp_size", "expected"),
    [  # each fault once, both group sizes among them: the launcher's handling is one
        ("raise@1:3", 4, "rank 1 failed at step 3 (forward): PlantedFault"),
        ("kill@1:3", 2, "rank 1 was killed by SIGKILL at step 3 (forward)"),
        ("hang@1:3", 4, "rank 1 hung at step 3 (forward): no rank moved for"),
    ],
)
def test_a_failing_hung_or_killed_rank_ends_the_run_naming_rank_and_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fault: str, dp_size: int, expected: str
) -> None:
    timeout = 3.0
    started = time.monotonic()
    code, record, text = run_dist(
        tmp_path, "--dp-size", str(dp_size), "--backend", "reference", "--steps", "5",
        "--inject", fault, "--timeout", str(timeout), capsys=capsys,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert code == 1, text
    assert expected in record["message"]
    assert (record["failed_rank"], record["failed_step"]) == (1, 2)  # 0-based in the record
    assert_no_process_left(record)
    assert elapsed < 90  # startup on a loaded 2-core machine, plus the timeout; never a hang


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("count-length@2:2", "from rank 2: its token-count list has 5 entries"),
        ("negative-count@0:3", "from rank 0: negative token count -1"),
        ("overclaim@3:2", "from rank 3: it claims"),
    ],
)
def test_bad_dp_metadata_raises_the_same_error_on_every_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fault: str, expected: str
) -> None:
    code, record, _ = run_dist(
        tmp_path, "--dp-size", "4", "--backend", "sdpa", "--steps", "4", "--inject", fault,
        "--timeout", "20", capsys=capsys,
    )  # fmt: skip
    assert code == 1
    assert expected in record["message"]
    assert "(raised on 4 of 4 ranks)" in record["message"]  # no rank left waiting
    assert_no_process_left(record)


def test_a_backend_that_is_not_dp_aware_is_refused_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = tmp_path / "plain.py"
    backend.write_text(
        "from reference_backends.reference import ReferenceBackend\n"
        "class Plain(ReferenceBackend):\n"
        "    def __init__(self, *, num_heads, num_kv_heads, head_dim, scale):\n"
        "        super().__init__(num_heads=num_heads, num_kv_heads=num_kv_heads,\n"
        "                         head_dim=head_dim, scale=scale)\n"
    )
    summary = tmp_path / "dist.json"
    args = ["dist", "--dp-size", "2", "--backend", f"{backend}:Plain", "--json", str(summary)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "neither dp_size/dp_rank nor **kwargs" in err[0]
    assert not summary.exists()  # refused before any rank started: nothing written


def test_an_unknown_backend_or_a_fault_outside_the_group_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = tmp_path / "dist.json"
    assert main(["dist", "--dp-size", "2", "--backend", "nosuch", "--json", str(summary)]) == 2
    assert "nosuch" in capsys.readouterr().err
    assert not summary.exists()  # refused before any rank started: nothing written
    assert main(["dist", "--dp-size", "2", "--backend", "sdpa", "--inject", "raise@2:1"]) == 2
    assert "rank 2 >= dp_size 2" in capsys.readouterr().err


@pytest.mark.skipif(
    shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(),
    reason="torchrun not installed",
)
def test_the_worker_also_runs_under_torchrun(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    result = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "harness.dist.worker",
         "--backend", "sdpa", "--steps", "4"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "step 4/4" in result.stdout


BACKENDS = ROOT / "tests" / "fixtures" / "dist_backends.py"
CHEATS = ROOT / "tests" / "fixtures" / "cheating_backends.py"


def test_a_backend_without_padding_runs_unpadded_and_idle_ranks_still_join(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, record, text = run_dist(
        tmp_path, "--dp-size", "3", "--backend", f"{BACKENDS}:NoPadding", "--steps", "6",
        "--timeout", "30", capsys=capsys,
    )  # fmt: skip
    assert code == 0, text
    assert record["summary"]["padding"].startswith("off")
    ran = [s for s in record["summary"]["steps"] if s["ranks"]]
    assert any(0 in s["counts"] for s in ran)  # an idle rank took part without a forward
    assert main(["dist", "--dp-size", "2", "--backend", f"{BACKENDS}:NoPadding", "--graph"]) == 2
    assert "claims no graph-mode padding" in capsys.readouterr().err


def test_a_narrow_claim_runs_inside_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, record, text = run_dist(
        tmp_path, "--dp-size", "2", "--backend", f"{BACKENDS}:NarrowClaim", "--steps", "3",
        capsys=capsys,
    )  # fmt: skip
    assert code == 0, text
    assert (record["summary"]["setup"]["page_size"], record["summary"]["setup"]["head_dim"]) == (
        8,
        64,
    )


def test_a_constructor_failing_on_one_rank_is_that_rank_s_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, record, _ = run_dist(
        tmp_path, "--dp-size", "2", "--backend", f"{BACKENDS}:NoRankOne", "--steps", "2",
        capsys=capsys,
    )  # fmt: skip
    assert code == 1  # the backend failed; the run was asked for correctly
    assert record["failed_rank"] == 1
    assert "dp_rank 1 raised RuntimeError: no device for dp_rank 1" in record["message"]
    assert_no_process_left(record)


def test_a_shared_error_names_the_rank_it_is_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, record, _ = run_dist(
        tmp_path, "--dp-size", "3", "--backend", "sdpa", "--steps", "3",
        "--inject", "overclaim@2:2", capsys=capsys,
    )  # fmt: skip
    assert code == 1
    assert record["failed_rank"] == 2


def test_a_fault_in_a_step_no_rank_has_tokens_still_fires(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, record, _ = run_dist(
        tmp_path, "--dp-size", "2", "--backend", "sdpa", "--steps", "3",
        "--inject", "kill@1:1", capsys=capsys,
    )  # fmt: skip
    assert record["summary"] is None or record["summary"]["steps"][0]["padded"] == 0
    assert code == 1
    assert "rank 1 was killed by SIGKILL at step 1" in record["message"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--inject", "raise@1:9"], "step 9 is outside the run's steps 1..3"),
        (["--inject", "raise@1:0"], "step 0 is outside"),
        (
            ["--json", "/dev/null/folder/x.json"],
            "--json: /dev/null/folder/x.json: /dev/null is not a directory",
        ),
        (["--dist-backend", "nccl"], "no CUDA device"),
    ],
)
def test_bad_command_lines_are_refused_before_any_rank_starts(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    if "--dist-backend" in args:
        args = [*args, "--device", "cuda"]
    assert main(["dist", "--dp-size", "2", "--backend", "sdpa", "--steps", "3", *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_any_seed_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A seed whose derived tensor seeds pass 2**63 still runs, checks every step, and is used."""
    from harness.dist.schedule import DistSetup, RankSchedule

    seed = 100_000
    code, record, text = run_dist(
        tmp_path, "--dp-size", "2", "--backend", "sdpa", "--steps", "3", "--seed", str(seed),
        capsys=capsys,
    )  # fmt: skip
    assert code == 0, text
    assert f"seed {seed}" in text
    assert "PASSED: 2 ranks, 3 of 3 steps checked" in text
    assert (record["exit_code"], record["message"], record["failed_rank"]) == (0, "passed", None)
    summary = record["summary"]
    assert summary["setup"]["seed"] == seed
    assert summary["checked_steps"] == 3
    # the ranks drew their requests from this seed, not another: the counts they exchanged
    # are the ones its schedules give, replayed here (seed 0: [[0, 0], [16, 21], [32, 18]])
    schedules = [RankSchedule(DistSetup(dp_size=2, steps=3, seed=seed), r) for r in range(2)]
    expected = []
    for step in range(3):
        expected.append([schedule.plan(step) for schedule in schedules])
        for schedule in schedules:
            schedule.build(step, 0)  # consumes the step's tokens, as the rank's forward did
    assert [s["counts"] for s in summary["steps"]] == expected
    for step in summary["steps"]:
        assert step["padded"] == max(step["counts"])  # no --graph: padded to the largest
        assert [r["rank"] for r in step["ranks"]] == [0, 1]
        for rank in step["ranks"]:
            assert rank["tokens"] == step["counts"][rank["rank"]]
            if rank["tokens"]:  # checked against the oracle and the shared pool, in bounds
                assert 0 <= rank["oracle_ratio"] <= 1
                assert 0 <= rank["shared_ratio"] <= 1
    assert_no_process_left(record)


def _workers_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"harness.dist.worker" in command and marker.encode() in command:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
@pytest.mark.parametrize("how", [signal_name for signal_name in ("SIGTERM", "SIGKILL")])
def test_a_terminated_or_killed_launcher_leaves_no_rank_behind(how: str) -> None:
    import signal

    marker = str(7_000_000 + os.getpid())  # a seed no other run uses: finds this run's ranks
    launcher = subprocess.Popen(
        [sys.executable, "-m", "harness", "dist", "--dp-size", "2", "--backend", "sdpa",
         "--steps", "4", "--seed", marker, "--inject", "hang@0:2", "--timeout", "120"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while len(_workers_with(marker)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(_workers_with(marker)) == 2
    time.sleep(3)  # into the hang
    launcher.send_signal(getattr(signal, how))
    launcher.wait(timeout=60)
    deadline = time.monotonic() + 15
    while _workers_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _workers_with(marker) == []


def test_dist_bench_writes_a_scaling_results_file_the_report_draws(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.results.store import load_results

    out = tmp_path / "scaling.json"
    code = main([
        "dist-bench", "--backend", "sdpa", "--dp-sizes", "1,2", "--sequences", "4",
        "--context", "64", "--steps", "5", "--warmup", "1", "--out", str(out),
    ])  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0, text
    record = load_results(out)
    assert [c.spec["dp_size"] for c in record.cases] == [1, 2]
    assert all(c.status == "PASSED" for c in record.cases)
    assert all(c.oracle and c.oracle["passed"] for c in record.cases)
    assert all(c.metrics and c.metrics["tokens"] == 4 for c in record.cases)
    assert record.workloads[0]["kind"] == "dp-scaling"
    report = tmp_path / "report"
    assert main(["report", str(out), "--out", str(report)]) == 0
    assert (report / "figures" / "dp-scaling.png").exists()


def test_dist_bench_fails_a_backend_that_skips_work_on_timed_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every timed step reads fresh inputs on every rank and is watched, as in ``bench``."""
    from harness.results.store import load_results

    cheat = f"{CHEATS}:CachedByBuffer"
    out = tmp_path / "scaling.json"
    code = main([
        "dist-bench", "--backend", cheat, "--dp-sizes", "1,2", "--sequences", "4",
        "--context", "64", "--steps", "5", "--warmup", "1", "--out", str(out),
    ])  # fmt: skip
    text = capsys.readouterr().out
    assert code == 1, text
    for case in load_results(out).cases:
        assert case.status == "INCORRECT_NUMERICAL"
        assert case.error is not None
        assert case.error.startswith("rank ")
        assert "bit for bit the output of the call before it" in case.error
        assert case.oracle is not None
        assert case.oracle["passed"]  # right on the step checked before timing


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "nosuch"], "nosuch"),
        (["--backend", f"{BACKENDS}:TwoRanksAtMost", "--dp-sizes", "1-3"], "dp_size <= 2"),
        (["--backend", "sdpa", "--dp-sizes", "1-8", "--sequences", "4"], "a rank with none"),
    ],
)
def test_dist_bench_refuses_what_it_cannot_run_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    out = tmp_path / "scaling.json"
    assert main(["dist-bench", *args, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
