"""The benchmark suites' options, parametrization and session state.

Device-correct timing: pytest-benchmark subtracts two readings of its timer
around each round. Every test runs in pedantic mode (one call per round, a
cache flush as ``setup`` outside the timed region) with the timer from
``harness.bench.timing.stamp_timer``: ``time.perf_counter`` on the CPU, and on
CUDA a stamp that records a device event, so ``end - start`` is the device
time between two events rather than host time of asynchronous launches.
pytest-benchmark disables itself under xdist; run these suites without
``-n``.

The contiguous-SDPA peer of each case is timed once per session with the
same clock, flush and number of rounds, and stored beside each backend's
record, so ratios to it come from the same run.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from harness.bench.case_check import (
    CaseCheck,
    PreparedCase,
    check_backend,
    check_output,
    prepare_case,
)
from harness.bench.ceilings import RunCeilings, run_ceilings
from harness.bench.environment import fingerprint
from harness.bench.peer import PEER_CLASS, PEER_NAME, ContiguousPeer
from harness.bench.run_results import case_metrics
from harness.bench.runner import PREPARE_TIMING, case_record
from harness.bench.timed_checks import CallTarget, PeerTarget, TimedCalls, case_calls
from harness.bench.timing import CacheFlusher, HostClock, TimingConfig, measure, stamp_timer
from harness.bench.workloads import CaseSpec, Workload, get_workload
from harness.core.registry import class_label, default_registry
from harness.results.store import CaseRecord, TimingRecord

SESSION = pytest.StashKey["BenchSession"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attn-harness-bench", "attn-harness benchmark suites")
    group.addoption(
        "--bench-backend",
        action="append",
        default=[],
        metavar="SPEC",
        help="backend to time (repeatable; default: every registered backend)",
    )
    group.addoption(
        "--bench-workload",
        action="append",
        default=[],
        metavar="NAME",
        help="only these workloads (repeatable; default: each file's own)",
    )
    group.addoption("--bench-device", choices=("cpu", "cuda"), default="cpu")
    group.addoption(
        "--bench-size", choices=("cpu", "gpu"), default=None, help="default: by --bench-device"
    )
    group.addoption("--bench-rounds", type=int, default=10, help="timed rounds per case (>= 5)")
    group.addoption("--bench-warmup", type=int, default=2, help="untimed rounds first")
    group.addoption("--bench-threads", type=int, default=None, help="intra-op threads")
    group.addoption("--bench-no-probe", action="store_true", help="skip the ceiling probe")
    group.addoption(
        "--bench-warm-cache", action="store_true", help="do not flush caches between rounds"
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("bench_rounds") < 5:
        raise pytest.UsageError("--bench-rounds must be >= 5 (every case keeps >= 5 samples)")
    if config.getoption("bench_device") == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--bench-device cuda: no CUDA device is available")


def pytest_collect_file(parent: pytest.Collector, file_path: Path) -> pytest.Module | None:
    """Collect ``bench_*.py`` here without touching the project's ``python_files``."""
    if file_path.suffix != ".py" or not file_path.name.startswith("bench_"):
        return None
    if parent.session.isinitpath(file_path):
        return None  # named on the command line: pytest's own collector takes it
    patterns = parent.config.getini("python_files")
    if any(fnmatch.fnmatch(file_path.name, p) for p in patterns):
        return None
    return pytest.Module.from_parent(parent, path=file_path)


def _size(config: pytest.Config) -> str:
    size = config.getoption("bench_size")
    return size or ("gpu" if config.getoption("bench_device") == "cuda" else "cpu")


def _backends(config: pytest.Config) -> list[str]:
    from harness.core.registry import default_registry

    chosen = list(config.getoption("bench_backend"))
    with contextlib.suppress(ValueError):  # the conformance plugin's --backend, if loaded
        chosen += [b for b in config.getoption("backend") if b not in chosen]
    return chosen or default_registry().names()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "bench_case" not in metafunc.fixturenames:
        return
    config = metafunc.config
    names = getattr(metafunc.module, "WORKLOADS", ())
    wanted = config.getoption("bench_workload")
    if wanted:
        names = [n for n in names if n in wanted]
    pairs = [(w, c) for w in map(get_workload, names) for c in w.cases(_size(config))]
    metafunc.parametrize("bench_case", pairs, ids=[f"{w.name}/{c.name}" for w, c in pairs])
    metafunc.parametrize("bench_backend", _backends(config))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    timer = stamp_timer(config.getoption("bench_device"))
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "bench_case" in callspec.params:
            workload, spec = callspec.params["bench_case"]
            group = f"{workload.key}/{spec.name}"
            item.add_marker(pytest.mark.benchmark(timer=timer, group=group))


@dataclass
class BenchSession:
    """State shared by every benchmark test of one pytest session."""

    device: str
    size: str
    rounds: int
    warmup: int
    threads: int
    cold_cache: bool
    ceilings: RunCeilings
    environment: dict[str, Any]
    flusher: CacheFlusher | None
    peers: dict[str, CaseRecord] = field(default_factory=dict)
    workloads: dict[str, Workload] = field(default_factory=dict)
    _case: PreparedCase | None = None

    @property
    def clock_name(self) -> str:
        return "cuda_event" if self.device == "cuda" else "perf_counter"

    def case(self, workload: Workload, spec: CaseSpec) -> PreparedCase:
        """The case's inputs, kept while consecutive tests share them."""
        self.workloads[workload.name] = workload
        current = self._case
        if current is None or (current.workload, current.spec) != (workload, spec):
            self._case = None  # free the previous case first
            current = self._case = prepare_case(workload, spec, self.device)
        return current

    def timing_config(self) -> TimingConfig:
        return TimingConfig(
            warmup=self.warmup,
            min_samples=self.rounds,
            max_samples=self.rounds,
            target_rel_ci=0.0,
            budget_s=float("inf"),
            cold_cache=self.cold_cache,
        )

    def record(self, case: PreparedCase, backend: str, verdict: CaseCheck, **kw: Any) -> CaseRecord:
        return case_record(
            case, backend, verdict.status, error=verdict.error, oracle=verdict.oracle, **kw
        )

    def peer(self, case: PreparedCase) -> CaseRecord:
        """The case's contiguous-SDPA peer: checked, then (if it passed) timed like the backends."""
        if case.prefix in self.peers:
            return self.peers[case.prefix]
        forward = None
        try:
            peer = ContiguousPeer(case.inputs)
            quantized = case.spec.variant.quantized
            if quantized:
                case.store_new_tokens()
            verdict = check_output(case, peer.assemble(peer()))
            if verdict.status == "PASSED":  # a wrong answer is never timed, the peer's neither
                config = self.timing_config()
                calls = self.timed_calls(case, PeerTarget(peer, quantized))
                m = measure(
                    calls.target,
                    device=self.device,
                    config=config,
                    flusher=self.flusher,
                    hooks=calls,
                )
                calls.judge_repeat(m.samples_ns, config.warmup)
                if calls.problem is None:
                    forward = TimingRecord.from_measurement(m)
                else:
                    verdict = CaseCheck(calls.problem.status, f"peer: {calls.problem.cause}")
        except Exception as exc:  # reported on the peer's record; ratios are then absent
            verdict = CaseCheck("RUNTIME_ERROR", f"peer: {type(exc).__name__}: {exc}")
        record = self.record(case, PEER_NAME, verdict, backend_class=PEER_CLASS, forward=forward)
        if record.valid and record.forward is not None:
            record.metrics, flags = case_metrics(case.spec, record.forward, self.ceilings, None)
            record.flags.extend(flags)
        self.peers[case.prefix] = record
        return record

    def timed_calls(self, case: PreparedCase, target: CallTarget) -> TimedCalls:
        """Fresh inputs for every timed call of ``case``, each call's output watched."""
        return case_calls(case, target, self.timing_config())

    def time_prepare(self, fn: Any) -> TimingRecord:
        sync = torch.cuda.synchronize if self.device == "cuda" else None
        m = measure(fn, device=self.device, config=PREPARE_TIMING, clock=HostClock(), flusher=sync)
        return TimingRecord.from_measurement(m)

    def metadata(self) -> dict[str, Any]:
        """What ``pytest_benchmark_update_json`` adds to the JSON for the converter."""
        return {
            "environment": self.environment,
            "ceilings": self.ceilings.to_json(),
            "timing": {
                "device": self.device,
                "clock": self.clock_name,
                "threads": self.threads,
                "cold_cache": self.cold_cache,
                "cuda_graph": False,
                "flush_bytes": 0 if self.flusher is None else self.flusher.nbytes,
                "config": {"rounds": self.rounds, "warmup_rounds": self.warmup, "mode": "pedantic"},
                "overhead": None,
            },
            "workloads": [
                {
                    "name": w.name,
                    "version": w.version,
                    "size": self.size,
                    "kind": w.kind,
                    "description": w.description,
                }
                for w in self.workloads.values()
            ],
        }


class PedanticRounds:
    """pytest-benchmark's rounds given fresh inputs and watched as ``measure``'s calls are
    (``harness.bench.timed_checks``): ``setup`` (outside the timed region) keeps the last
    round's output, loads the next round's inputs and flushes the caches; the timed
    ``call`` only stores its output."""

    def __init__(self, calls: TimedCalls, flusher: Callable[[], None] | None) -> None:
        self.calls, self.flusher = calls, flusher
        self.index = -1
        self.output: object = None
        self.forward = calls.target

    def call(self) -> None:
        self.output = self.forward()

    def setup(self) -> None:
        if self.index >= 0:
            self.finish()
        self.index += 1  # the rounds, warm-up ones first, number the pool: the last is final
        self.calls.load(self.index)
        if self.flusher is not None:
            self.flusher()

    def finish(self) -> None:
        self.calls.keep(self.index, self.output)
        self.calls.settle()


@pytest.fixture(scope="session")
def bench_session(pytestconfig: pytest.Config) -> Iterator[BenchSession]:
    device = pytestconfig.getoption("bench_device")
    before = torch.get_num_threads()
    threads = pytestconfig.getoption("bench_threads") or before
    torch.set_num_threads(threads)
    cold = not pytestconfig.getoption("bench_warm_cache")
    try:
        session = BenchSession(
            device=device,
            size=_size(pytestconfig),
            rounds=pytestconfig.getoption("bench_rounds"),
            warmup=pytestconfig.getoption("bench_warmup"),
            threads=threads,
            cold_cache=cold,
            ceilings=run_ceilings(
                device,
                dtypes=(torch.float32, torch.bfloat16),
                measure_probe=not pytestconfig.getoption("bench_no_probe"),
            ),
            environment=fingerprint(device, threads=threads),
            flusher=CacheFlusher(device) if cold else None,
        )
        pytestconfig.stash[SESSION] = session
        yield session
    finally:
        torch.set_num_threads(before)


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(
    config: pytest.Config, benchmarks: list[Any], output_json: dict[str, Any]
) -> None:
    session = config.stash.get(SESSION, None)
    if session is not None:
        output_json["attn_harness"] = session.metadata()


FLAT_METRICS = (
    "tokens",
    "flops",
    "bytes",
    "median_s",
    "tokens_per_s",
    "tflops",
    "gbps",
    "bandwidth_fraction",
    "compute_fraction",
    "roofline_fraction",
    "ratio_to_peer",
)


@pytest.fixture
def bench_run(
    benchmark: Any,
    bench_session: BenchSession,
    bench_case: tuple[Workload, CaseSpec],
    bench_backend: str,
) -> Callable[[], None]:
    """Check the case against the oracle, time it with pytest-benchmark, fill ``extra_info``."""

    def run() -> None:
        s = bench_session
        workload, spec = bench_case
        case = s.case(workload, spec)
        peer = s.peer(case)
        entry = default_registry().resolve(bench_backend)
        checked = check_backend(entry, case)
        verdict = checked.verdict
        if verdict.status == "UNSUPPORTED":
            pytest.skip(f"{entry.name}: {verdict.error}")
        if verdict.status != "PASSED":
            message = f"{verdict.status}: {entry.name} on {case.prefix}: {verdict.error}"
            pytest.fail(message, pytrace=False)
        prepare = s.time_prepare(checked.prepare_fn(case))
        rounds = PedanticRounds(s.timed_calls(case, checked.target(case)), s.flusher)
        benchmark.pedantic(
            rounds.call,
            setup=rounds.setup,
            rounds=s.rounds,
            warmup_rounds=s.warmup,
            iterations=1,
        )
        rounds.finish()
        if not benchmark.disabled and benchmark.stats is not None:
            timed = [round(d * 1e9) for d in benchmark.stats.stats.data]
            rounds.calls.judge_repeat(timed, s.warmup)
        problem = rounds.calls.problem
        if problem is not None:
            pytest.fail(f"{problem.status}: {entry.name} on {case.prefix}: {problem.cause}", False)
        if benchmark.disabled or benchmark.stats is None:
            return  # --benchmark-disable: a correctness run only
        forward = TimingRecord(
            samples_ns=[max(0, round(d * 1e9)) for d in benchmark.stats.stats.data],
            warmup_ns=[],
            clock=s.clock_name,
            threads=s.threads,
            stop_reason="fixed_rounds",
            flush_bytes=0 if s.flusher is None else s.flusher.nbytes,
        )
        record = s.record(
            case,
            entry.name,
            verdict,
            backend_class=class_label(entry),
            forward=forward,
            prepare=prepare,
            peer=peer.id,
        )
        peer_forward = peer.forward if peer.valid else None
        metrics, flags = case_metrics(spec, forward, s.ceilings, peer_forward)
        record.metrics = metrics
        record.flags.extend(flags)
        benchmark.extra_info.update({k: metrics[k] for k in FLAT_METRICS})
        benchmark.extra_info["status"] = record.status
        benchmark.extra_info["flags"] = list(record.flags)
        benchmark.extra_info["attn_harness"] = {"record": record.to_json(), "peer": peer.to_json()}

    return run
