"""pytest-benchmark JSON from suites/benchmarks -> results schema, losslessly."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.results.pytest_benchmark import from_pytest_benchmark, main, to_pytest_benchmark
from harness.results.store import ResultsError, dumps, load_results, save_results
from tests.test_results import case, run

REPO = Path(__file__).resolve().parents[1]


def document() -> dict:
    """A small document shaped like the suites' output."""
    base = json.loads(dumps(run()))
    peer = case("contiguous-sdpa", role="peer", peer=None, prepare=None).to_json()
    peer["metrics"]["ratio_to_peer"] = peer["metrics"]["ratio_to_peer_ci"] = None
    entries = []
    for name in ("sdpa", "reference"):
        record = case(name).to_json()
        entries.append(
            {
                "group": "tiny@1/ctx=8",
                "name": f"test_decode_sweep[tiny/ctx=8-{name}]",
                "fullname": f"suites/benchmarks/bench_decode.py::{name}",
                "params": {"bench_backend": name},
                "param": f"tiny/ctx=8-{name}",
                "extra_info": {
                    "gbps": 4.0,
                    "status": "PASSED",
                    "attn_harness": {"record": record, "peer": peer},
                },
                "options": {"timer": "perf_counter", "disable_gc": False},
                "stats": {"min": 9.9e-07, "median": 1.03e-06, "rounds": 6, "iterations": 1},
            }
        )
    return {
        "machine_info": {"node": "box", "cpu": {"brand_raw": "AMD EPYC"}},
        "commit_info": {"id": "abc", "dirty": False},
        "benchmarks": entries,
        "datetime": "2026-01-01T00:00:00+00:00",
        "version": "5.3.1",
        "attn_harness": {
            "environment": base["environment"],
            "ceilings": base["ceilings"],
            "timing": base["timing"],
            "workloads": base["workloads"],
        },
    }


def test_conversion_is_lossless_and_valid(tmp_path):
    doc = document()
    record = from_pytest_benchmark(copy.deepcopy(doc))
    assert [c.backend for c in record.cases] == ["contiguous-sdpa", "sdpa", "reference"]
    assert record.cases[1].source["extra_info"] == {"gbps": 4.0, "status": "PASSED"}
    assert record.source["machine_info"]["node"] == "box"
    out = tmp_path / "r.json"
    save_results(record, out)
    assert to_pytest_benchmark(load_results(out)) == doc


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("attn_harness"), "not written by the suites"),
        (lambda d: d.pop("benchmarks"), "missing 'benchmarks'"),
        (lambda d: d["benchmarks"][0]["extra_info"].pop("attn_harness"), r"benchmarks\[0\]"),
        (lambda d: d["benchmarks"][1]["extra_info"]["attn_harness"].pop("peer"), "malformed"),
        (lambda d: d["attn_harness"].pop("ceilings"), "missing 'ceilings'"),
    ],
)
def test_foreign_or_damaged_documents_are_refused(mutate, message):
    doc = document()
    mutate(doc)
    with pytest.raises(ResultsError, match=message):
        from_pytest_benchmark(doc)


def test_command_line_errors_are_one_line_and_write_nothing(tmp_path, capsys):
    bad = tmp_path / "bench.json"
    bad.write_text("{not json")
    assert main([str(bad), str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert "not valid JSON" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out.json").exists()


def test_only_converted_records_can_be_turned_back():
    with pytest.raises(ResultsError, match="not converted"):
        to_pytest_benchmark(run())


def run_decode_suite(*options: str) -> subprocess.CompletedProcess[str]:
    """The pytest-benchmark decode suite's ctx=512 case, 5 quick rounds, in a process of its
    own: pytest-benchmark turns itself off in any process that says it is an xdist worker,
    and the calling test may run in one (nox -s tests)."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        "suites/benchmarks/bench_decode.py",
        "-k",
        "512",
        "-p",
        "no:cacheprovider",
        "-q",
        "--bench-rounds",
        "5",
        "--bench-warmup",
        "1",
        "--bench-no-probe",
        "--bench-warm-cache",
        *options,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_suite_end_to_end(tmp_path):
    """Run one real CPU case through pytest-benchmark, convert, and compare."""
    pytest.importorskip("pytest_benchmark")
    bench_json = tmp_path / "bench.json"
    done = run_decode_suite(
        "--bench-backend", "sdpa", "--benchmark-save-data", f"--benchmark-json={bench_json}"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads(bench_json.read_text())
    (entry,) = doc["benchmarks"]
    assert entry["extra_info"]["status"] == "PASSED"
    assert entry["extra_info"]["tokens"] == 4
    assert entry["extra_info"]["ratio_to_peer"] > 0
    out = tmp_path / "results.json"
    assert main([str(bench_json), str(out)]) == 0
    record = load_results(out)
    peer, sdpa = record.cases
    assert (peer.role, sdpa.backend) == ("peer", "sdpa")
    assert sdpa.forward.samples_ns == [round(s * 1e9) for s in entry["stats"]["data"]]
    assert len(sdpa.forward.samples_ns) == 5
    assert sdpa.forward.stop_reason == "fixed_rounds"
    assert len(peer.forward.samples_ns) == 5
    assert record.environment["threads"] >= 1
    assert to_pytest_benchmark(record) == doc
