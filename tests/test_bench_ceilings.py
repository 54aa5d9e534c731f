"""Ceilings on a busy machine: probe rounds, rechecks, the contradiction rule, flags in the verdict.

Nothing here depends on how fast this machine is: the probe and the first
round are replaced by fixed figures, or records are built with fixed samples.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import harness.bench.ceiling_evidence as ceiling_evidence
import harness.bench.runner as bench
from harness.bench.ceilings import Ceilings, ProbeRound, RunCeilings
from harness.bench.run_results import finish_run
from harness.bench.runner import BenchConfig, run_benchmarks
from harness.bench.table import bench_verdict, flag_summary, render
from harness.bench.timing import TimingConfig
from harness.bench.workloads import CaseSpec, Workload
from harness.core.registry import BackendEntry
from harness.results.store import CaseRecord, RunRecord, TimingRecord, dumps, load_results, loads
from reference_backends import SdpaBackend

SPEC = CaseSpec("decode", (9, 5, 13), (1, 1, 1), seed=1, num_heads=4, num_kv_heads=2, head_dim=16)
ONE = Workload("one", 2, "decode", "tests only", (SPEC,), (SPEC,))
FAST = TimingConfig(warmup=1, min_samples=5, max_samples=5, cold_cache=False)
PROBED = BenchConfig(timing=FAST, prepare_timing=FAST, probe_ceilings=True)
HUGE = 1e30  # no real step comes near it


def _measured(bandwidth: float, flops: float) -> Ceilings:
    return Ceilings("measured", "fake", bandwidth, {"float32": flops}, {"threads": 1})


def _record(name: str, median_ns: int, role: str = "backend") -> CaseRecord:
    forward = TimingRecord([median_ns] * 5, [], "perf_counter_ns", 1, "converged")
    return CaseRecord(
        id=f"one@2/decode::{name}",
        role=role,
        backend=name,
        workload="one",
        workload_version=2,
        case="decode",
        spec=SPEC.to_json(),
        status="PASSED",
        forward=forward,
    )


def _run(cases: list[CaseRecord], ceilings: RunCeilings, flags: list[str]) -> RunRecord:
    return RunRecord(
        created="2026-12-02T00:00:00+00:00",
        tool={"name": "attn-harness bench", "version": "0"},
        environment={},
        ceilings=ceilings.to_json(),
        timing={},
        workloads=[],
        cases=cases,
        flags=flags,
    )


def test_a_ceiling_one_case_exceeds_withholds_every_fraction_against_it() -> None:
    fast, slow = _record("fast", 1_000), _record("slow", 100_000)  # 100x apart
    # the fast case at twice it (a busy probe; above IMPOSSIBLE_MARGIN is another matter),
    # the slow one at 0.02x
    between = SPEC.work().bytes / 2_000e-9
    rounds = [ProbeRound("before", 0.0, _measured(between, HUGE))]
    rounds.append(ProbeRound("after", 5.0, _measured(between / 2, HUGE)))
    ceilings = RunCeilings(None, None)
    for r in rounds:
        ceilings = ceilings.with_round(r)
    flags: list[str] = []
    finish_run([fast, slow], ceilings, flags)

    assert fast.metrics is not None
    assert slow.metrics is not None
    for case in (fast, slow):
        assert case.metrics["bandwidth_fraction"] is None
        assert case.metrics["roofline_fraction"] is None
        assert case.metrics["bound"] is None
        assert case.metrics["withheld"] == ["bandwidth"]
        assert case.metrics["compute_fraction"] is not None  # that ceiling holds
    assert len(fast.flags) == 1
    assert fast.flags[0].startswith("measurement error: bandwidth at 200% of its ceiling")
    assert slow.flags == []  # under the ceiling: no flag of its own, only the run's
    assert flags == [
        f"ceiling contradicted: 1 case reached {between * 2 / 1e9:.3g} GB/s, above the copy "
        f"bandwidth ceiling of {between / 1e9:.3g} GB/s (best of 2 probes); bandwidth "
        "fractions withheld for 2 cases",
        f"ceiling spread: copy bandwidth {between / 2e9:.3g} GB/s to {between / 1e9:.3g} GB/s "
        "over 2 probes (50%); the machine was busy during some, the best is used",
    ]
    verdict = bench_verdict(_run([fast, slow], ceilings, flags))
    assert verdict == (
        "passed (2 PASSED), 3 flags: 1 ceiling contradicted (1 case reached "
        f"{between * 2 / 1e9:.3g} GB/s, above the copy bandwidth ceiling of "
        f"{between / 1e9:.3g} GB/s), 1 ceiling spread (copy bandwidth {between / 2e9:.3g} "
        f"GB/s to {between / 1e9:.3g} GB/s over 2 probes), 1 measurement error (bandwidth at "
        "200% of its ceiling)"
    )


def test_under_every_ceiling_nothing_is_withheld_or_flagged() -> None:
    case = _record("ok", 1_000_000)
    flags: list[str] = []
    finish_run(
        [case],
        RunCeilings(None, None).with_round(ProbeRound("before", 0, _measured(HUGE, HUGE))),
        flags,
    )
    assert case.metrics is not None
    assert case.metrics["roofline_fraction"] is not None
    assert "withheld" not in case.metrics
    assert (case.flags, flags) == ([], [])


def test_a_case_above_a_busy_probe_reprobes_it_and_the_quiet_figure_is_kept(monkeypatch) -> None:
    busy = RunCeilings(None, None).with_round(ProbeRound("before", 0.0, _measured(1.0, 1.0)))
    monkeypatch.setattr(bench, "run_ceilings", lambda *a, **k: busy)
    calls: list[dict[str, object]] = []

    def quiet(device: str, **kw: object) -> Ceilings:
        calls.append(kw)
        return Ceilings(
            "measured",
            "fake",
            HUGE if kw.get("copy", True) else None,
            {"float32": HUGE},
            {"threads": 1},
        )

    monkeypatch.setattr(bench, "probe", quiet)
    record = run_benchmarks([BackendEntry("sdpa", SdpaBackend, "test")], [ONE], PROBED)

    whens = [r["when"] for r in record.ceilings["probes"]]
    first = record.cases[0].id  # the peer: the first rate to exceed the busy figures
    assert whens == ["before", f"recheck: {first}", "after"]  # one recheck: it fixed both
    assert calls[0]["copy"] is True  # the recheck probed both ceilings the case exceeded
    assert record.ceilings["measured"]["matmul_flops"] == {"float32": HUGE}
    for case in record.cases:
        # no measurement error left; a tiny case on a loaded machine may be unreliable
        assert [f for f in case.flags if not f.startswith("unreliable")] == []
        assert case.metrics is not None
        assert 0 < case.metrics["roofline_fraction"] < 1
    assert [f.split(":")[0] for f in record.flags] == ["ceiling spread", "ceiling spread"]
    text = render(record)
    assert "ceilings (measured, best of 3 probes, widest spread 100% (copy))" in text
    assert "run flag: ceiling spread: copy bandwidth" in text
    # the backend's case; the peer's is counted only where it did not pass
    assert text.splitlines()[-1].startswith("bench: passed (1 PASSED), 2 flags: 2 ceiling spread")
    assert loads(dumps(record)).flags == record.flags  # valid against the schema, kept


def test_rechecks_stop_after_two_per_ceiling(monkeypatch) -> None:
    busy = RunCeilings(None, None).with_round(ProbeRound("before", 0.0, _measured(1.0, 1.0)))
    monkeypatch.setattr(bench, "run_ceilings", lambda *a, **k: busy)
    monkeypatch.setattr(bench, "probe", lambda device, **kw: _measured(1.0, 1.0))
    # these 1 byte/s ceilings stand for busy probes, not for a machine a case outran
    monkeypatch.setattr(ceiling_evidence, "IMPOSSIBLE_MARGIN", float("inf"))
    two = Workload("two", 1, "decode", "tests only", (SPEC, SPEC), (SPEC, SPEC))
    record = run_benchmarks([BackendEntry("sdpa", SdpaBackend, "test")], [two], PROBED)
    whens = [r["when"].split(":")[0] for r in record.ceilings["probes"]]
    assert whens == ["before", "recheck", "recheck", "after"]
    assert all(any(f.startswith("measurement error") for f in c.flags) for c in record.cases)
    assert record.flags[0].startswith("ceiling contradicted: 4 cases reached")


def test_flag_summary_counts_kinds_and_names_the_commonest() -> None:
    assert flag_summary([]) == "no flags"
    flags = [
        "measurement error: compute at 220% of its ceiling; fraction withheld (x)",
        "measurement error: compute at 180% of its ceiling; fraction withheld (x)",
        "ceiling spread: float32 matmul 36 GFLOP/s to 107 GFLOP/s over 3 probes (66%); y",
        "a: 1",
        "b: 2",
    ]
    assert flag_summary(flags[:1]) == (
        "1 flag: 1 measurement error (compute at 220% of its ceiling)"
    )
    assert flag_summary(flags) == (
        "5 flags: 2 measurement error (compute at 220% of its ceiling, ...), 1 ceiling spread "
        "(float32 matmul 36 GFLOP/s to 107 GFLOP/s over 3 probes), 1 a (1), 1 more"
    )


def test_a_failed_or_partial_run_says_so() -> None:
    bad = _record("bad", 1_000)
    bad.status, bad.forward = "INCORRECT_NUMERICAL", None
    run = _run([bad], RunCeilings(None, None), [])
    assert bench_verdict(run) == "FAILED (1 INCORRECT_NUMERICAL), no flags"
    run.partial = True
    assert bench_verdict(run).startswith("FAILED (1 INCORRECT_NUMERICAL, partial)")


def test_a_results_file_from_before_probe_rounds_still_loads(tmp_path: Path) -> None:
    config = BenchConfig(timing=FAST, prepare_timing=FAST, probe_ceilings=False)
    data = json.loads(dumps(run_benchmarks([], [ONE], config)))
    assert "probes" not in data["ceilings"]  # no probe: no rounds
    assert "flags" not in data  # no run flags: the old shape
    del data["timing"]["threads_source"]  # written since threads were explained
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    loaded = load_results(path)
    assert loaded.flags == []
    assert RunCeilings.from_json(loaded.ceilings).probes == ()


@pytest.mark.parametrize("threads", [None, 1])
def test_the_results_say_how_many_threads_timed_and_why(threads: int | None, monkeypatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    config = BenchConfig(timing=FAST, prepare_timing=FAST, probe_ceilings=False, threads=threads)
    record = run_benchmarks([], [ONE], config)
    assert record.timing["threads_source"] == ("--threads" if threads else "torch's default")
    assert f"torch threads {record.timing['threads']} ({record.timing['threads_source']})" in (
        render(record)
    )
