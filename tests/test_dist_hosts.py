"""``attn-harness dist`` across hosts: two launchers on 127.0.0.1 stand for two machines.

Each "host" is its own ``attn-harness dist --nnodes 2 --node-rank R --master
127.0.0.1:PORT`` process running its share of the ranks; they meet only
through the rendezvous store, as two machines would. A fault on node 1 must
end node 0's ranks too, with the rank (and its host) named, exit 1 on both,
within the timeout, nothing left running on either.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from harness.dist.rendezvous import NodePlan, node_of, node_ranks

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_node(tmp_path: Path, node: int, port: int, *args: str) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "harness", "dist", "--dp-size", "4", "--backend", "reference",
        "--nnodes", "2", "--node-rank", str(node), "--master", f"127.0.0.1:{port}",
        "--json", str(tmp_path / f"node{node}.json"), *args,
    ]  # fmt: skip
    return subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )


def two_hosts(tmp_path: Path, *args: str) -> tuple[list[int], list[dict[str, Any]], list[str]]:
    """Run nodes 1 and 0 to the end; their exit codes, ``--json`` records and outputs."""
    port = free_port()
    nodes = [start_node(tmp_path, n, port, *args) for n in (1, 0)][::-1]
    outputs = [p.communicate(timeout=240)[0] for p in nodes]
    records = [json.loads((tmp_path / f"node{n}.json").read_text()) for n in (0, 1)]
    return [p.returncode for p in nodes], records, outputs


def assert_nothing_left(record: dict[str, Any]) -> None:
    assert record["survivors"] == []
    for pid in record["pids"]:
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)


@pytest.mark.integration
def test_two_hosts_run_dp_4_with_ranks_numbered_across_hosts(tmp_path: Path) -> None:
    codes, records, outputs = two_hosts(tmp_path, "--steps", "4")
    assert codes == [0, 0], outputs
    for record, output in zip(records, outputs, strict=True):
        assert "PASSED: 4 ranks on 2 hosts, 3 of 4 steps checked" in output
        summary = record["summary"]  # node 1 reads the group's summary from node 0
        assert summary["dp_size"] == 4
        assert summary["checked_steps"] == 3
        ranks = {r["rank"] for step in summary["steps"] for r in step["ranks"]}
        assert ranks == {0, 1, 2, 3}  # every rank's outputs reached the oracle check
        assert len(record["pids"]) == 2  # each host ran its two ranks
        assert_nothing_left(record)
    assert "node 1 of 2: ranks 2-3" in outputs[1]


@pytest.mark.integration
@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("raise@3:2", "rank 3 failed at step 2 (forward): PlantedFault"),
        ("hang@2:2", "rank 2 hung at step 2 (forward)"),
    ],
)
def test_a_fault_on_node_1_ends_node_0_naming_the_rank_and_its_host(
    tmp_path: Path, fault: str, expected: str
) -> None:
    timeout = 5.0
    started = time.monotonic()
    codes, records, outputs = two_hosts(
        tmp_path, "--steps", "4", "--inject", fault, "--timeout", str(timeout)
    )
    elapsed = time.monotonic() - started
    assert codes == [1, 1], outputs
    rank = int(fault.split("@")[1].split(":")[0])
    for record in records:  # both hosts give the same cause, claimed once
        assert expected in record["message"]
        assert f"[rank {rank} runs on node 1 (" in record["message"]
        assert (record["failed_rank"], record["failed_step"]) == (rank, 1)
        assert_nothing_left(record)
    assert records[0]["message"] == records[1]["message"]
    assert elapsed < 120  # two startups on a loaded 2-core machine, plus the timeout


@pytest.mark.integration
def test_a_killed_host_is_named_by_the_other(tmp_path: Path) -> None:
    port = free_port()
    args = ("--steps", "400", "--timeout", "5")
    node1 = start_node(tmp_path, 1, port, *args)
    node0 = start_node(tmp_path, 0, port, *args)
    assert node0.stdout is not None
    for line in node0.stdout:  # the group is running steps
        if line.startswith("step 3/"):
            break
    node1.send_signal(signal.SIGKILL)  # the whole host gone: its launcher, then its ranks
    node1.wait()
    killed = time.monotonic()
    node0.communicate(timeout=120)
    assert node0.returncode == 1
    record = json.loads((tmp_path / "node0.json").read_text())
    assert "node 1 (" in record["message"]
    assert "stopped answering" in record["message"]
    assert time.monotonic() - killed < 60
    assert_nothing_left(record)


@pytest.mark.integration
@pytest.mark.skipif(
    shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(),
    reason="torchrun not installed",
)
def test_the_worker_runs_across_hosts_under_torchrun(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    port = free_port()
    nodes = [
        subprocess.Popen(
            [
                torchrun,
                "--nnodes",
                "2",
                "--node-rank",
                str(node),
                "--nproc-per-node",
                "2",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                "-m",
                "harness.dist.worker",
                "--backend",
                "sdpa",
                "--steps",
                "4",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
        )
        for node in (0, 1)
    ]
    outputs = [p.communicate(timeout=240)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outputs
    assert "step 4/4" in outputs[0]  # global rank 0 (on node 0) checks and prints


def test_ranks_are_dealt_to_hosts_balanced_contiguous_and_in_order() -> None:
    for dp_size in range(1, 20):
        for nnodes in range(1, dp_size + 1):
            shares = [node_ranks(dp_size, nnodes, n) for n in range(nnodes)]
            assert [r for share in shares for r in share] == list(range(dp_size))
            assert max(map(len, shares)) - min(map(len, shares)) <= 1
            assert all(node_of(r, dp_size, nnodes) == n for n, s in enumerate(shares) for r in s)
    with pytest.raises(ValueError, match="a host would run no rank"):
        node_ranks(2, 3, 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nnodes": 0}, "--nnodes must be >= 1"),
        ({"nnodes": 2, "node_rank": 2, "port": 29500}, "--node-rank 2 is outside 0..1"),
        ({"nnodes": 2, "node_rank": 1}, "needs a port"),
    ],
)
def test_a_bad_node_plan_names_its_field(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NodePlan(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("10.0.0.1:29500", ("10.0.0.1", 29500)), ("[::1]:80", ("::1", 80)), ("head:1", ("head", 1))],
)
def test_master_is_host_colon_port(text: str, parsed: tuple[str, int]) -> None:
    assert NodePlan.parse_master(text) == parsed


@pytest.mark.parametrize("text", ["head", "head:", ":29500", "head:0", "head:70000", "head:x"])
def test_a_bad_master_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        NodePlan.parse_master(text)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nnodes", "2"], "--nnodes 2 needs --master HOST:PORT"),
        (["--nnodes", "2", "--node-rank", "2", "--master", "h:1"], "--node-rank 2 is outside"),
        (["--nnodes", "3", "--master", "h:1"], "--dp-size 2 < --nnodes 3"),
        (["--master", "nohostport"], "expected --master HOST:PORT"),
    ],
)
def test_bad_host_options_are_refused_before_any_rank_starts(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    from harness.cli.main import main

    assert main(["dist", "--dp-size", "2", "--backend", "sdpa", *args]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_a_host_chooses_nccl_and_gpus_by_its_own_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.dist import group

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(group, "_gpus", lambda: 8)
    assert group.ranks_on_this_host(16) == 8  # dp 16 over two hosts of 8 GPUs
    assert group.local_index(11) == 3
    assert group.dist_backend("auto", "cuda", 8) == "nccl"
    assert group.dist_backend("auto", "cuda", 9) == "gloo"
    assert group.rank_device("cuda", group.local_index(11)) == "cuda:3"
    problem = group.group_problem("nccl", "cuda", 9)
    assert problem is not None
    assert "8 visible for this host's 9 ranks" in problem
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert group.ranks_on_this_host(4) == 4  # one host: every rank is here


def test_a_host_without_node_0_gives_up_naming_the_address() -> None:
    from harness.dist.rendezvous import RendezvousError, _wait_for_node_0

    port = free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(RendezvousError, match=f"node 0's rendezvous at 127.0.0.1:{port} did not"):
        _wait_for_node_0("127.0.0.1", port, 1.0)
    assert time.monotonic() - started < 10


@pytest.mark.integration
def test_ctrl_c_stops_a_host_waiting_for_node_0_at_once(tmp_path: Path) -> None:
    node1 = start_node(tmp_path, 1, free_port())
    time.sleep(5)  # torch imported, waiting for node 0
    node1.send_signal(signal.SIGINT)
    out, _ = node1.communicate(timeout=30)
    assert node1.returncode == 130, out
    assert "interrupted (SIGINT)" in out
