"""The benchmark runner's verdicts in bfloat16 at CPU sizes, and the one oracle they share.

The runner must hold backends to the conformance suite's bound: an all-zeros
output and a single dropped key fail in bf16 at 1k contexts, the built-in
reference passes the same case. One run (module-scoped, five samples, no
ceiling probe) feeds every test here, so the file stays at a few seconds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import harness.numerics.oracle as oracle
import harness.numerics.scenario as scenario
from harness.bench.peer import PEER_NAME
from harness.bench.runner import BenchConfig, run_benchmarks
from harness.bench.timed_checks import CHECKED_CALLS
from harness.bench.timing import MIN_SAMPLES, TimingConfig
from harness.bench.workloads import CaseSpec, Workload
from harness.core.registry import BackendEntry
from harness.results.store import CaseRecord, RunRecord, load_results, save_results
from reference_backends import BUILTIN_BACKENDS
from suites.mutants.backends import DropsLastToken
from tests.fixtures.bench_backends import ZerosBackend

# H=32 KV=8 D=128, page 16: CaseSpec's defaults, the production head geometry
CASES = (
    CaseSpec("decode ctx=1024 x4", (1024,) * 4, (1,) * 4, dtype="bfloat16"),
    CaseSpec("extend 16/1024 + 8/1000", (1024, 1000), (16, 8), dtype="bfloat16"),
)
BF16 = Workload("bf16-verdicts", 1, "mixed", "tests only", CASES, CASES)
FEWEST = TimingConfig(
    warmup=0, min_samples=MIN_SAMPLES, max_samples=MIN_SAMPLES, budget_s=0.0, cold_cache=False
)
CONFIG = BenchConfig(timing=FEWEST, prepare_timing=FEWEST, probe_ceilings=False)
WRONG = ("zeros", "drops-last-key")
COUNTED = {  # where each is looked up when the bench checks an output
    "oracle_attention": oracle,
    "naive_attention": oracle,
    "compare": scenario,
}


def _counting(calls: Counter[str], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return fn(*args, **kwargs)

    return wrapper


Run = tuple[RunRecord, Counter[str]]


@pytest.fixture(scope="module")
def bf16_run() -> Run:
    """The reference, a zeros backend and a dropped-key backend on the bf16 cases, counted."""
    calls: Counter[str] = Counter()
    backends = [
        BackendEntry("reference", BUILTIN_BACKENDS["reference"], "built-in"),
        BackendEntry("zeros", ZerosBackend, "test"),
        BackendEntry("drops-last-key", DropsLastToken, "test"),
    ]
    with pytest.MonkeyPatch.context() as mp:
        for name, module in COUNTED.items():
            mp.setattr(module, name, _counting(calls, name, getattr(module, name)))
        record = run_benchmarks(backends, [BF16], CONFIG)
    return record, calls


def _records(record: RunRecord, backend: str) -> list[CaseRecord]:
    found = [c for c in record.cases if c.backend == backend]
    assert [c.case for c in found] == [c.name for c in CASES]
    return found


def test_reference_and_peer_pass_in_bf16_and_are_timed(bf16_run: Run) -> None:
    record, _ = bf16_run
    for name in ("reference", PEER_NAME):
        for c in _records(record, name):
            assert c.status == "PASSED", c.error
            assert c.oracle is not None
            assert c.oracle["worst_ratio"] < 0.25  # a correct computation: well inside
            assert c.forward is not None
            assert len(c.forward.samples_ns) == MIN_SAMPLES
            assert c.metrics is not None
            assert (c.metrics["ratio_to_peer"] is None) == (c.role == "peer")


@pytest.mark.parametrize("backend", WRONG)
def test_wrong_answers_are_incorrect_numerical_and_never_timed(bf16_run: Run, backend: str) -> None:
    record, _ = bf16_run
    for c in _records(record, backend):
        assert c.status == "INCORRECT_NUMERICAL", c.oracle
        assert c.error is not None
        assert c.oracle is not None
        assert "vs float64 oracle" in c.error
        assert not c.oracle["passed"]
        assert c.oracle["worst_ratio"] > 1
        assert c.forward is None
        assert c.prepare is None
        assert c.metrics is None
        assert not c.valid


def test_oracle_and_naive_are_computed_once_per_case_for_every_backend_and_the_peer(
    bf16_run: Run,
) -> None:
    record, calls = bf16_run
    layers = 1  # every CaseSpec is one layer
    # the check before timing, and each timed call held to the oracle: the same calls
    # (two seeded ones and the final) in every timing, so one oracle each per case
    per_case = 1 + CHECKED_CALLS + 1
    assert calls["oracle_attention"] == layers * len(CASES) * per_case
    assert calls["naive_attention"] == layers * len(CASES) * per_case
    checked = [c for c in record.cases if c.oracle is not None]
    assert len(checked) == 4 * len(CASES)  # the peer and three backends per case
    assert calls["compare"] >= len(checked)  # each through check_outputs, the cached oracle


def test_a_run_with_untimed_failures_is_a_valid_results_file(bf16_run: Run, tmp_path: Path) -> None:
    record, _ = bf16_run
    loaded = load_results(save_results(record, tmp_path / "r.json"))
    statuses = {(c.case, c.backend): c.status for c in loaded.cases}
    assert statuses == {(c.case, c.backend): c.status for c in record.cases}
    assert all(c.forward is None for c in loaded.cases if c.backend in WRONG)
