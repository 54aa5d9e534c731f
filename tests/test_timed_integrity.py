"""A timing counts only for work that was checked: planted cheats fail, correct backends pass.

Each cheat in ``tests/fixtures/cheating_backends.py`` answers the check before timing
correctly and skips work when timed; ``bench`` must fail it with its cause (exit 1, the
gate failing on its results file). A planted bimodal peer gives an unreliable case,
kept out of a report's medians.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

import harness.bench.peer as peer_module
from harness.bench.case_check import build_backend, prepare_case
from harness.bench.ceiling_evidence import IMPOSSIBLE_MARGIN, impossible
from harness.bench.ceilings import Ceilings, ProbeRound, RunCeilings
from harness.bench.fresh_inputs import CHECKED_TOKENS, InputPool
from harness.bench.run_results import finish_run
from harness.bench.runner import BenchConfig, run_benchmarks
from harness.bench.timed_checks import TimedCalls, call_plan
from harness.bench.timing import TimingConfig, measure
from harness.bench.workloads import WORKLOADS, CaseSpec, Workload
from harness.cli.main import main
from harness.core.registry import BackendEntry
from harness.numerics.oracle import references
from harness.report.stats import AnalysedRun, run_stats
from harness.report.verdict import _performance
from harness.results.reliability import clusters, unreliable
from harness.results.store import CaseRecord, TimingRecord, load_results
from reference_backends import SdpaBackend
from tests.fixtures import cheating_backends as cheats
from tests.test_benchmark_json import run_decode_suite

FIXTURE = Path(cheats.__file__)
SPEC = CaseSpec("decode", (2048,) * 4, (1,) * 4, seed=3, num_heads=8, num_kv_heads=2, head_dim=64)
CASE = Workload("integrity", 1, "decode", "tests only", (SPEC,), (SPEC,))
TIMING = TimingConfig(warmup=1, min_samples=6, max_samples=12, budget_s=0.3, cold_cache=False)
CONFIG = BenchConfig(timing=TimingConfig(**{**TIMING.__dict__}), probe_ceilings=False)

EXPECTED = {
    "cached-by-buffer": ("INCORRECT_NUMERICAL", "bit for bit the output of the call before"),
    "one-call-in-four": ("INCORRECT_NUMERICAL", "bit for bit the output of the call before"),
    "returns-before-finishing": ("INCORRECT_NUMERICAL", "differs from the oracle"),
    "cached-by-content": ("INCORRECT_TIMING", "cached output"),
}


@pytest.fixture(scope="module")
def cheat_run():
    # the correct backend first: the last cheat leaves work in flight on a thread, which
    # writes into the case's caches after its timing (on CUDA a synchronisation ends it)
    entries = [BackendEntry("sdpa", SdpaBackend, "built-in")]
    entries += [BackendEntry(name, cls, "test") for name, cls in cheats.CHEATS.items()]
    return run_benchmarks(entries, [CASE], CONFIG)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_every_planted_cheat_fails_with_its_cause(cheat_run, name):
    (record,) = [c for c in cheat_run.cases if c.backend == name]
    status, cause = EXPECTED[name]
    assert record.status == status, record.error
    assert cause in (record.error or "")
    assert record.metrics is None  # its time is not a result
    assert not record.valid


def test_a_correct_backend_and_the_peer_pass_with_every_call_checked(cheat_run):
    for c in cheat_run.cases:
        if c.backend in ("sdpa", "contiguous-sdpa"):
            assert c.status == "PASSED", c.error
            checks = c.timed_checks
            assert checks is not None
            assert checks["calls"] == TIMING.warmup + len(c.forward.samples_ns)
            # two seeded calls, the one on repeated inputs, and the last
            assert len(checks["oracle_checked_calls"]) == 4
            assert checks["oracle_checks"] == 4
            assert checks["repeat_of"] in checks["oracle_checked_calls"]
            assert checks["repeat_call"] < TIMING.warmup + TIMING.min_samples


def test_the_cli_exits_1_on_a_cheat_and_the_gate_fails_its_results(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(WORKLOADS, "integrity", CASE)
    out = tmp_path / "cheat.json"
    spec = f"{FIXTURE}:CachedByContent"
    quick = ("--no-probe", "--warm-cache", "--no-progress", "--max-samples", "8")
    code = main(["bench", "--backend", spec, "--workload", "integrity", "--out", str(out), *quick])
    printed = capsys.readouterr().out
    assert code == 1
    assert "INCORRECT_TIMING" in printed
    (cheat,) = [c for c in load_results(out).cases if c.backend == spec]
    assert cheat.status == "INCORRECT_TIMING"
    assert "cached output" in (cheat.error or "")
    gate = main(["gate", str(out), "--baseline", str(out)])
    assert gate == 1


# -- the pieces ----------------------------------------------------------------------


def _pool(size: int = 8):
    case = prepare_case(CASE, SPEC, "cpu")
    return case, InputPool(case.inputs, size, seed=SPEC.seed)


def test_pool_variants_differ_from_each_other_and_from_the_case_and_keep_its_layout():
    case, pool = _pool()
    base = case.inputs
    for i, variant in enumerate(pool.variants):
        assert variant.query.shape == base.queries[0].shape
        assert variant.query.dtype == base.queries[0].dtype
        assert variant.key.shape == base.keys[0].shape
        assert not torch.equal(variant.query, base.queries[0])
        for other in pool.variants[:i]:
            assert not torch.equal(variant.query, other.query)
            assert not torch.equal(variant.key, other.key)


def test_a_variants_oracle_is_the_prefix_with_its_own_tokens():
    """The oracle of variant i, on the step as a backend sees it after writing variant i."""
    case, pool = _pool()
    backend = build_backend(BackendEntry("sdpa", SdpaBackend, "test"), SPEC, for_timing=False)
    case.restore_caches()
    backend.bind_kv_caches(case.inputs.caches)
    backend.prepare(case.inputs.step.metadata)
    for index in (0, 5):
        v = pool[index]
        output = backend.forward(v.query.clone(), v.key.clone(), v.value.clone(), 0)
        comparison, _ = pool.reference(index).compare(output, torch.float32)
        assert comparison.passed, comparison.describe()
        wrong, _ = pool.reference(index + 1).compare(output, torch.float32)
        assert not wrong.passed  # another variant's oracle does not fit it


def test_a_long_step_is_checked_on_sampled_tokens_that_still_catch_a_wrong_one():
    spec = CaseSpec("prefill", (200,), (200,), seed=5, num_heads=4, num_kv_heads=2, head_dim=32)
    workload = Workload("p", 1, "prefill", "tests only", (spec,), (spec,))
    case = prepare_case(workload, spec, "cpu")
    pool = InputPool(case.inputs, 2, seed=1)
    checked = pool.reference(0)
    assert checked.tokens is not None
    assert len(checked.tokens) == CHECKED_TOKENS
    step = pool.step(0)
    exact, _ = references(
        step.queries[0],
        step.sequences[0],
        [200],
        scale=step.scenario.softmax_scale,
        causal=True,
        value_dim=step.scenario.value_dim,
    )
    right = exact.output.to(torch.float32)
    assert checked.compare(right, torch.float32)[0].passed
    wrong = right.clone()
    wrong[checked.tokens[3]] += 0.5
    comparison, worst = checked.compare(wrong, torch.float32)
    assert not comparison.passed
    assert worst == int(checked.tokens[3])  # named by its token in the step


def _number(pool, variant):
    return next(i for i, v in enumerate(pool.variants) if v is variant)


class _Echo:
    """A timed call whose output is whatever ``answer`` says for the loaded variant."""

    def __init__(self, pool, answer):
        self.pool, self.answer, self.variant = pool, answer, None

    def __call__(self):
        return self.answer(self.variant)

    def load(self, variant):
        self.variant = variant

    def output(self, result):
        return result

    def stored(self, pool, index):
        return None


def test_a_stale_output_is_caught_on_any_call_not_only_the_checked_ones():
    _case, pool = _pool(12)
    answers = {id(v): pool.reference(i).oracle.output.float() for i, v in enumerate(pool.variants)}
    state = {"calls": 0, "last": None}

    def stale_on_the_seventh(variant):
        state["calls"] += 1
        if state["calls"] == 7 and state["last"] is not None:
            return state["last"]
        state["last"] = answers[id(variant)]
        return state["last"]

    plan = call_plan(seed=0, warmup=1, min_samples=10, checked=0)
    calls = TimedCalls(pool, _Echo(pool, stale_on_the_seventh), plan, torch.float32)
    config = TimingConfig(warmup=1, min_samples=10, max_samples=10, cold_cache=False)
    measure(calls.target, config=config, hooks=calls)
    assert calls.problem is not None
    assert "timed call 6" in calls.problem.cause
    assert calls.oracle_checks == 0  # found without the oracle


def test_the_call_on_repeated_inputs_is_not_stale_and_a_cache_answering_it_is_caught():
    _case, pool = _pool(10)
    answers = [pool.reference(i).oracle.output.float() for i in range(pool.size)]
    seen: set[int] = set()

    def slow_unless_seen(variant):
        index = _number(pool, variant)
        if index not in seen:
            seen.add(index)
            time.sleep(0.004)
        return answers[index]

    plan = call_plan(seed=1, warmup=1, min_samples=6)
    assert plan.repeat_of in plan.checked
    calls = TimedCalls(pool, _Echo(pool, slow_unless_seen), plan, torch.float32)
    config = TimingConfig(warmup=1, min_samples=6, max_samples=6, cold_cache=False)
    m = measure(calls.target, config=config, hooks=calls)
    assert calls.problem is None  # its output is right, and the same inputs' twice
    calls.judge_repeat(m.samples_ns, config.warmup)
    assert calls.problem is not None
    assert calls.problem.status == "INCORRECT_TIMING"
    assert f"timed call {plan.repeat}, on the inputs of call {plan.repeat_of}" in (
        calls.problem.cause
    )
    honest = TimedCalls(pool, _Echo(pool, lambda v: answers[_number(pool, v)]), plan, torch.float32)
    m = measure(honest.target, config=config, hooks=honest)
    honest.judge_repeat(m.samples_ns, config.warmup)
    assert honest.problem is None


def test_a_time_no_machine_can_reach_fails_and_a_busy_probe_stays_a_note():
    work = SPEC.work()
    bandwidth = 30e9
    ceilings = Ceilings("measured", "fake", bandwidth, {"float32": 200e9})
    honest = work.bytes / bandwidth
    assert impossible(work, honest, "float32", ceilings, 0) is None
    assert impossible(work, honest / 2, "float32", ceilings, 0) is None  # a busy probe
    why = impossible(work, honest / (IMPOSSIBLE_MARGIN * 2), "float32", ceilings, 0)
    assert why is not None
    assert why.startswith("faster than the machine can move these bytes")
    # what the caches hold between calls may come faster: not counted against the bound
    assert impossible(work, honest / 10, "float32", ceilings, work.bytes) is None


def _record(name: str, samples: list[int], role: str = "backend", peer: str | None = None):
    return CaseRecord(
        id=f"integrity@1/decode::{name}",
        role=role,
        backend=name,
        workload="integrity",
        workload_version=1,
        case="decode",
        spec=SPEC.to_json(),
        status="PASSED",
        forward=TimingRecord(samples, [], "perf_counter_ns", 1, "converged"),
        peer=peer,
    )


def test_finish_run_fails_an_impossible_time_and_the_ratio_of_others_is_kept():
    honest = round(SPEC.work().bytes / 30e9 * 1e9)
    peer = _record("contiguous-sdpa", [honest] * 6, role="peer")
    fast = _record("too-fast", [honest // 100] * 6, peer=peer.id)
    fine = _record("fine", [honest * 2] * 6, peer=peer.id)
    round_ = ProbeRound("before", 0.0, Ceilings("measured", "fake", 30e9, {"float32": 1e12}))
    finish_run([peer, fast, fine], RunCeilings(None, None).with_round(round_), [])
    assert fast.status == "INCORRECT_TIMING"
    assert fast.error is not None
    assert "move these bytes" in fast.error
    assert fast.metrics is None
    assert fine.status == "PASSED"
    assert fine.metrics is not None
    assert fine.metrics["ratio_to_peer"] == pytest.approx(2.0)


# -- unreliable cases ------------------------------------------------------------------


def test_clusters_need_two_real_groups_not_a_tail_of_outliers():
    assert clusters([1000, 1010, 1020, 990, 1005, 1015, 998, 1002]) is None
    tail = [1000] * 18 + [3000] * 2  # an interrupt or two: the median stands
    assert clusters(tail) is None
    two = [1500] * 6 + [9000] * 10
    found = clusters(two)
    assert found is not None
    assert (len(found.fast), len(found.slow)) == (6, 10)
    assert unreliable([1000] * 10, two) is not None
    assert unreliable([1000] * 10, [1000] * 10, 0.12, (0.10, 1.93)) is not None
    assert unreliable([1000] * 10, [1000] * 10, 1.0, (0.95, 1.05)) is None


def test_a_bimodal_peer_is_measured_again_then_flagged_and_kept_out_of_the_headline(
    monkeypatch,
):
    real = peer_module.ContiguousPeer.__call__
    state = {"calls": 0}

    def two_speeds(self):
        state["calls"] += 1
        if state["calls"] % 2:  # every other call waits: a second cluster of samples
            time.sleep(0.05)  # far above a call on a loaded machine: two clusters
        return real(self)

    monkeypatch.setattr(peer_module.ContiguousPeer, "__call__", two_speeds)
    config = BenchConfig(
        timing=TimingConfig(
            warmup=1, min_samples=12, max_samples=12, budget_s=5, target_rel_ci=0, cold_cache=False
        ),
        probe_ceilings=False,
    )
    record = run_benchmarks([BackendEntry("sdpa", SdpaBackend, "built-in")], [CASE], config)
    peer, sdpa = record.cases
    calls_for_two_timings = 2 * (1 + 12)
    assert state["calls"] >= calls_for_two_timings  # measured twice
    assert sdpa.status == "PASSED"
    # the peer's own record names its two clusters; its backend's names the first reason it
    # has (on a loaded machine its own samples may split too, and are named first)
    assert any(f.startswith("unreliable: its samples fall into two clusters") for f in peer.flags)
    assert any(f.startswith("unreliable: ") for f in sdpa.flags)

    stats = run_stats(record)
    line = [
        p
        for p in _performance(AnalysedRun("r", Path("r.json"), record, stats))
        if p.backend == "sdpa"
    ]
    assert line[0].timed == 1
    assert line[0].ratio is None  # its one case is unreliable: no median of ratios from it
    assert line[0].unreliable == 1


def test_the_pytest_benchmark_suites_fail_a_cheat_too():
    """The suites time pytest-benchmark's rounds on fresh, watched inputs as ``bench`` does."""
    pytest.importorskip("pytest_benchmark")
    done = run_decode_suite("--bench-backend", f"{FIXTURE}:WorksOneCallInFour")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "INCORRECT_NUMERICAL" in done.stdout
    assert "bit for bit the output of the call before it" in done.stdout


def test_an_ab_round_times_fresh_watched_inputs_and_a_cheat_is_an_error():
    from harness.ab.worker import Side

    honest = Side("sdpa", "cpu")
    ready = honest.prepare("decode-sweep", "ctx=512", "cpu")
    assert ready["status"] == "PASSED"
    timed = honest.time(ready["key"], samples=6, warmup=1, cold_cache=False)
    assert len(timed["samples_ns"]) == 6
    cheat = Side(f"{FIXTURE}:CachedByBuffer", "cpu")
    ready = cheat.prepare("decode-sweep", "ctx=512", "cpu")
    assert ready["status"] == "PASSED"  # right on the check before timing
    timed = cheat.time(ready["key"], samples=6, warmup=1, cold_cache=False)
    assert timed["error"].startswith("INCORRECT_NUMERICAL: output of timed call")
