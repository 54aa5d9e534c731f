"""The benchmark runner: check every case against the oracle, then time it, beside its peer.

How it measures, for users: ``docs/benchmarks.md``.

For each workload case the runner builds the step once
(``harness.bench.case_check``, on ``harness.numerics.scenario``): one
``StepInputs`` shared by the peer and every backend, so the float64 oracle
and the naive output are computed once per case (``StepInputs.reference``
caches them) and every output is held to the conformance suite's bound
(``check_outputs``). It checks and times the no-paging peer (torch SDPA over
the same tokens held contiguously), and for each backend:

1. checks capabilities (``UNSUPPORTED`` outside the claim);
2. runs one validating instance and compares its output with the float64
   oracle (``REJECTED_VALID`` if it refuses a valid step, ``INCORRECT_SHAPE``
   / ``INCORRECT_NUMERICAL`` if the answer is wrong);
3. builds the timing instance (``validate=False`` where the constructor takes
   it), checks its first output too, then times ``prepare`` on the host
   clock and ``forward`` on the device clock, each on its own.

Only what passed is timed: an incorrect backend's record (or the peer's)
carries its failing status, the error and the oracle comparison, and no
samples or metrics, since a fast wrong answer is never a result and timing
it would only spend the run's time. Every exception is caught per (case,
backend), so one backend that raises leaves the other records intact;
``CaseTimeout`` ends a case that overruns its deadline (SIGALRM, main
thread only).

The CLI (``harness.cli.bench``) and the pytest-benchmark suites both compose
the pieces below and ``harness.bench.case_check``'s; neither re-implements
the checking.
"""

from __future__ import annotations

import datetime
import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from harness import __version__
from harness.bench.case_check import (
    CaseCheck,
    PreparedCase,
    case_id,
    check_backend,
    check_output,
    classify,
    describe,
    prepare_case,
)
from harness.bench.ceiling_evidence import (
    ceiling_key,
)
from harness.bench.ceilings import (
    Ceilings,
    ProbeRound,
    RunCeilings,
    probe,
    run_ceilings,
)
from harness.bench.environment import fingerprint
from harness.bench.peer import PEER_CLASS, PEER_NAME, ContiguousPeer
from harness.bench.run_results import case_metrics, finish_run, noisy_against
from harness.bench.sdpa_pin import first_kernel_that_runs, says_no_kernel
from harness.bench.sweep_plan import planned, serving, sweep_header
from harness.bench.sweep_plan import run_order as run_order  # where callers look for it
from harness.bench.timed_checks import (
    CallTarget,
    PeerTarget,
    Problem,
    case_calls,
)
from harness.bench.timing import (
    CacheFlusher,
    HostClock,
    Measurement,
    TimingConfig,
    capture_cuda_graph,
    device_type,
    last_level_cache_bytes,
    long_lived_objects_frozen,
    measure,
    timer_overhead,
)
from harness.bench.workloads import CaseSpec, Workload
from harness.core.deadlines import CaseTimeout, deadline
from harness.core.dtypes import dtype_name
from harness.core.registry import BackendEntry, class_label
from harness.core.shards import Shard
from harness.core.threads import fixed_threads, timing_threads
from harness.results.reliability import UNRELIABLE
from harness.results.store import CaseRecord, RunRecord, TimingRecord

MAX_RECHECKS = 2  # re-probes of one ceiling per run, each when a case exceeded it
PREPARE_TIMING = TimingConfig(
    warmup=1, min_samples=5, max_samples=50, budget_s=0.25, target_rel_ci=0.05, cold_cache=False
)


# -- the run -----------------------------------------------------------------------


@dataclass(frozen=True)
class BenchConfig:
    """Everything about a run that is not the backends and workloads."""

    device: str = "cpu"
    size: str | None = None  # workload size; default: "gpu" on CUDA, else "cpu"
    dtype: str | None = None  # every case in this dtype instead of its own (``in_dtype``)
    threads: int | None = None
    timing: TimingConfig = field(default_factory=TimingConfig)
    prepare_timing: TimingConfig = PREPARE_TIMING
    case_timeout_s: float | None = 600.0
    probe_ceilings: bool = True
    pin_sdpa: bool | None = None  # pin the peer's and sdpa's SDPA kernel; None: on CUDA only
    interleave: bool = False  # the workloads' cases taken in turn (``run_order``)
    last_start_s: float | None = None  # no case starts later than this after the run began
    shard: Shard | None = None  # run only this shard's cases (``sweep_plan.planned``)

    @property
    def pins_sdpa(self) -> bool:
        return device_type(self.device) == "cuda" if self.pin_sdpa is None else self.pin_sdpa

    @property
    def workload_size(self) -> str:
        if self.size is not None:
            return self.size
        return "gpu" if device_type(self.device) == "cuda" else "cpu"


ProgressFn = Callable[[int, int, str], None]
Attempt = tuple[CaseCheck, dict[str, Any]]
"""A check's verdict and what its record keeps of the timing: ``forward``, ``prepare``,
``timed_checks``."""
SDPA_BACKEND_CLASSES = frozenset({"reference_backends.sdpa.SdpaBackend"})
"""Backends timed under a pinned SDPA kernel, like the peer: the ones that call SDPA."""


class _Runner:
    def __init__(
        self,
        config: BenchConfig,
        ceilings: RunCeilings,
        flusher: Callable[[], None] | None,
        progress: ProgressFn,
        total: int,
    ) -> None:
        self.config = config
        self.ceilings = ceilings
        self.flusher = flusher
        self.progress = progress
        self.total = total
        self.done = 0
        self.records: list[CaseRecord] = []
        self.graph_mode = config.timing.cuda_graph and device_type(config.device) == "cuda"
        self.started = time.monotonic()  # the first probe round's start
        self.dtypes: tuple[torch.dtype, ...] = (torch.float32,)
        self.rechecks: dict[str, int] = {}
        self.flags: list[str] = []

    def _tick(self, label: str) -> None:
        self.done += 1
        self.progress(self.done, self.total, label)

    def _time_forward(self, target: CallTarget, case: PreparedCase) -> TimedForward:
        """Time ``target`` on fresh inputs, every call watched (``harness.bench.timed_checks``)."""
        config = self.config.timing
        calls = case_calls(case, target, config)
        pool = calls.pool
        timing = replace(config, max_samples=min(config.max_samples, pool.size - config.warmup))
        call: Callable[[], object] = target
        if self.graph_mode:
            call = capture_cuda_graph(target, self.config.device)
            timing = replace(timing, cuda_graph=False)
        m = measure(
            call, device=self.config.device, config=timing, flusher=self.flusher, hooks=calls
        )
        if self.graph_mode:
            m = replace(m, clock=f"{m.clock}+cuda_graph")
        calls.judge_repeat(m.samples_ns, timing.warmup)
        if device_type(self.config.device) == "cuda":  # no work left in flight for the next
            torch.cuda.synchronize(self.config.device)
        return TimedForward(TimingRecord.from_measurement(m), calls.problem, calls.record())

    def _time_prepare(self, fn: Callable[[], object]) -> TimingRecord:
        is_cuda = device_type(self.config.device) == "cuda"
        setup = (lambda: torch.cuda.synchronize()) if is_cuda else None
        m = measure(
            fn,
            device=self.config.device,
            config=self.config.prepare_timing,
            clock=HostClock(),
            flusher=setup,
        )
        return TimingRecord.from_measurement(m)

    def _record(self, case: PreparedCase, backend: str, status: str, **kw: Any) -> CaseRecord:
        record = case_record(case, backend, status, **kw)
        self.records.append(record)
        return record

    def _finish(self, record: CaseRecord, case: PreparedCase, peer: CaseRecord | None) -> None:
        """Metrics now (flags come in ``finish_run``); a rate above a ceiling re-probes it."""
        if not record.valid or record.forward is None:
            return
        peer_forward = peer.forward if peer is not None and peer.valid else None
        record.metrics, _ = case_metrics(case.spec, record.forward, self.ceilings, peer_forward)
        above = [ceiling_key(kind, record) for kind in (record.metrics.get("withheld") or [])]
        if self.recheck(above, record.id):
            record.metrics, _ = case_metrics(case.spec, record.forward, self.ceilings, peer_forward)

    def recheck(self, keys: Sequence[str], case: str) -> bool:
        """Probe again the ceilings ``keys`` that ``case`` exceeded, at most
        ``MAX_RECHECKS`` times each: the machine was fast enough just now, so a
        busy probe shows here. True when anything was probed."""
        keys = [k for k in keys if self.rechecks.get(k, 0) < MAX_RECHECKS]
        if not (keys and self.config.probe_ceilings and self.ceilings.measured is not None):
            return False
        for key in keys:
            self.rechecks[key] = self.rechecks.get(key, 0) + 1
        dtypes = tuple(d for d in self.dtypes if f"matmul_{dtype_name(d)}" in keys)
        measured = probe(self.config.device, dtypes=dtypes, copy="copy" in keys)
        self.add_round(f"recheck: {case}", measured)
        return True

    def add_round(self, when: str, measured: Ceilings) -> None:
        at_s = time.monotonic() - self.started
        self.ceilings = self.ceilings.with_round(ProbeRound(when, at_s, measured))

    def _pinned(
        self, attempt: Callable[[], Attempt], uses_sdpa: bool
    ) -> tuple[str | None, Attempt]:
        """Check and time under one pinned SDPA kernel where that applies (see ``sdpa_pin``)."""
        if not (uses_sdpa and self.config.pins_sdpa):
            return None, attempt()
        return first_kernel_that_runs(attempt, lambda got: says_no_kernel(got[0].error))

    def _peer_attempt(self, case: PreparedCase) -> Attempt:
        timings: dict[str, Any] = {}
        try:
            with deadline(self.config.case_timeout_s):
                peer = ContiguousPeer(case.inputs)
                quantized = case.spec.variant.quantized
                if quantized:
                    case.store_new_tokens()
                verdict = check_output(case, peer.assemble(peer()))
                if verdict.status == "PASSED":  # a wrong peer gives no ratio: do not time it
                    timed = self._time_forward(PeerTarget(peer, quantized), case)
                    verdict = timed.verdict(verdict, "peer: ")
                    timings.update(forward=timed.forward, timed_checks=timed.checks)
        except CaseTimeout as exc:
            verdict, timings = CaseCheck("TIMEOUT", f"peer: {describe(exc)}"), {}
        except Exception as exc:  # the harness's own peer failed: say so, keep going
            verdict, timings = CaseCheck("RUNTIME_ERROR", f"peer: {describe(exc)}"), {}
        return verdict, timings

    def _peer_fields(self, case: PreparedCase) -> dict[str, Any]:
        kernel, (verdict, timings) = self._pinned(lambda: self._peer_attempt(case), True)
        return dict(
            status=verdict.status,
            backend_class=PEER_CLASS,
            error=verdict.error,
            oracle=verdict.oracle,
            sdpa_kernel=kernel,
            **timings,
        )

    def run_peer(self, case: PreparedCase) -> CaseRecord:
        record = case_record(case, PEER_NAME, **self._peer_fields(case))
        self.records.append(record)
        self._finish(record, case, None)
        self._tick(f"{case.prefix} {PEER_NAME}")
        return record

    def _backend_fields(
        self, entry: BackendEntry, case: PreparedCase, peer: CaseRecord
    ) -> dict[str, Any]:
        backend_class = class_label(entry.cls)
        kernel, (verdict, timings) = self._pinned(
            lambda: self._backend_attempt(entry, case), backend_class in SDPA_BACKEND_CLASSES
        )
        return dict(
            status=verdict.status,
            backend_class=backend_class,
            error=verdict.error,
            oracle=verdict.oracle,
            peer=peer.id,
            sdpa_kernel=kernel,
            **timings,
        )

    def run_backend(self, entry: BackendEntry, case: PreparedCase, peer: CaseRecord) -> CaseRecord:
        record = case_record(case, entry.name, **self._backend_fields(entry, case, peer))
        self.records.append(record)
        self._finish(record, case, peer)
        self._tick(f"{case.prefix} {entry.name}")
        return record

    def remeasure_noisy(
        self,
        case: PreparedCase,
        peer: CaseRecord,
        timed: Sequence[tuple[BackendEntry, CaseRecord]],
    ) -> None:
        """Time again, once, the peer and each backend whose timing is not a result
        (``harness.results.reliability``), one after the other; ``finish_run`` flags
        what still is not."""
        noisy: list[tuple[BackendEntry, CaseRecord, str]] = []
        for entry, record in timed:
            why = noisy_against(record, peer)
            if why is not None:
                noisy.append((entry, record, why))
        peer_noise = noisy_against(peer, None)
        if not noisy and peer_noise is None:
            return
        because = peer_noise or f"{UNRELIABLE}: a backend's ratio to it was"
        _refill(peer, self._peer_fields(case), because)
        self._finish(peer, case, None)
        for entry, record, why in noisy:
            _refill(record, self._backend_fields(entry, case, peer), why)
            self._finish(record, case, peer)

    def _backend_attempt(self, entry: BackendEntry, case: PreparedCase) -> Attempt:
        timings: dict[str, Any] = {}
        try:
            with deadline(self.config.case_timeout_s):
                checked = check_backend(entry, case, graph_mode=self.graph_mode)
                verdict = checked.verdict
                if checked.timed is not None:  # PASSED: only a correct answer is timed
                    timings["prepare"] = self._time_prepare(checked.prepare_fn(case))
                    timed = self._time_forward(checked.target(case), case)
                    verdict = timed.verdict(verdict)
                    timings.update(forward=timed.forward, timed_checks=timed.checks)
        except CaseTimeout as exc:
            verdict, timings = CaseCheck("TIMEOUT", describe(exc)), {}
        except Exception as exc:  # raised while timing: its samples are not a result
            verdict, timings = CaseCheck(classify(exc), f"during timing: {describe(exc)}"), {}
        return verdict, timings

    def run_case(
        self, workload: Workload, spec: CaseSpec, backends: Sequence[BackendEntry]
    ) -> None:
        try:
            case = prepare_case(workload, spec, self.config.device)
        except Exception as exc:  # e.g. out of memory: every record of this case says so
            for name in [PEER_NAME, *(b.name for b in backends)]:
                self.records.append(
                    CaseRecord(
                        id=case_id(workload, spec.name, name),
                        role="peer" if name == PEER_NAME else "backend",
                        backend=name,
                        workload=workload.name,
                        workload_version=workload.version,
                        case=spec.name,
                        spec=spec.to_json(),
                        status="RUNTIME_ERROR",
                        error=f"building the case's inputs failed: {describe(exc)}",
                    )
                )
                self._tick(f"{workload.key}/{spec.name} {name}")
            return
        peer = self.run_peer(case)
        timed = [(entry, self.run_backend(entry, case, peer)) for entry in backends]
        self.remeasure_noisy(case, peer, timed)
        del case
        gc.collect()
        if device_type(self.config.device) == "cuda":
            torch.cuda.empty_cache()


def _refill(record: CaseRecord, fields: dict[str, Any], why: str) -> None:
    """``record`` measured again (``why``: what its first timing was): the new attempt's
    fields, no stale timing or metrics, and the reason kept in its ``timed_checks``."""
    record.forward = record.prepare = record.timed_checks = record.metrics = None
    for name, value in fields.items():
        setattr(record, name, value)
    if record.timed_checks is not None:
        record.timed_checks["measured_again"] = why


@dataclass(frozen=True)
class TimedForward:
    """A forward timing, what its checks found, and what the record keeps of them."""

    forward: TimingRecord
    problem: Problem | None
    checks: dict[str, Any]

    def verdict(self, checked: CaseCheck, prefix: str = "") -> CaseCheck:
        """``checked`` (the check before timing), unless the timed calls failed theirs."""
        if self.problem is None:
            return checked
        return CaseCheck(self.problem.status, prefix + self.problem.cause, checked.oracle)


def case_record(case: PreparedCase, backend: str, status: str, **kw: Any) -> CaseRecord:
    """The results-schema record of one (case, backend), peer or not."""
    return CaseRecord(
        id=case.case_id(backend),
        role="peer" if backend == PEER_NAME else "backend",
        backend=backend,
        workload=case.workload.name,
        workload_version=case.workload.version,
        case=case.spec.name,
        spec=case.spec.to_json(),
        status=status,
        **kw,
    )


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


KeepFn = Callable[[RunRecord], None]
"""Given the run's record after every case (``partial`` until the last), e.g. to save it."""


def run_benchmarks(
    backends: Sequence[BackendEntry],
    workloads: Sequence[Workload],
    config: BenchConfig | None = None,
    *,
    progress: ProgressFn | None = None,
    command: Sequence[str] | None = None,
    keep: KeepFn | None = None,
) -> RunRecord:
    """Run every (case, backend) of ``workloads`` and return the run's record.

    ``keep`` is given the record after every case, marked ``partial`` until the
    last, so a run stopped at any point (Ctrl-C, a time limit) leaves every case
    it finished; the last call gets the finished record. No case starts past
    ``config.last_start_s``; a run so cut short is returned ``partial``, with a flag.
    With ``config.shard`` only that shard's cases run (``harness.bench.sweep_plan``),
    and its record says which sweep it is a shard of; ``keep`` gets even a shard
    with no cases (its file proves to a merge that the shard ran).
    """
    config = config or BenchConfig()
    plan = planned(backends, workloads, config)
    sweep = sweep_header(backends, workloads, config)
    dtypes = tuple(dict.fromkeys(spec.torch_dtype for _, _, spec in plan)) or (torch.float32,)
    _, threads_source = timing_threads(config.threads)
    done: dict[int, list[CaseRecord]] = {}  # by the case's place in workload order

    def in_order() -> list[CaseRecord]:
        return [record for place in sorted(done) for record in done[place]]

    with fixed_threads(config.threads) as threads:
        environment = fingerprint(config.device, threads=threads)
        overhead = timer_overhead(config.device)
        started = time.monotonic()
        probed = config.probe_ceilings and bool(plan)
        ceilings = run_ceilings(config.device, dtypes=dtypes, measure_probe=probed)
        flusher = CacheFlusher(config.device) if config.timing.cold_cache else None
        runner = _Runner(
            config,
            ceilings,
            flusher,
            progress or (lambda done, total, label: None),
            total=sum(len(serving(backends, w)) + 1 for _, w, _ in plan),
        )
        runner.started, runner.dtypes = started, dtypes
        header = RunHeader(config, environment, threads, threads_source, overhead, flusher, sweep)

        def record(cases: list[CaseRecord], partial: bool) -> RunRecord:
            return header.record(workloads, command, runner.ceilings, cases, runner.flags, partial)

        with long_lived_objects_frozen():
            for place, workload, spec in plan:
                if _past(config.last_start_s, started):
                    runner.flags.append(f"out of time: {len(plan) - len(done)} cases not started")
                    break
                first = len(runner.records)
                runner.run_case(workload, spec, serving(backends, workload))
                done[place] = runner.records[first:]
                if keep is not None and len(done) < len(plan):
                    keep(record(in_order(), partial=True))
        finished = len(done) == len(plan)
        if config.probe_ceilings and finished and plan:
            runner.add_round("after", probe(config.device, dtypes=dtypes))
        cases = in_order()
        finish_run(cases, runner.ceilings, runner.flags, 2 * last_level_cache_bytes(config.device))
    final = record(cases, partial=not finished)
    if keep is not None and (cases or sweep is not None):
        keep(final)
    return final


def _past(limit_s: float | None, started: float) -> bool:
    return limit_s is not None and time.monotonic() - started > limit_s


@dataclass(frozen=True)
class RunHeader:
    """What a run's record says about the run itself, fixed before its first case."""

    config: BenchConfig
    environment: dict[str, Any]
    threads: int
    threads_source: str
    overhead: Measurement  # the timer's own cost per sample
    flusher: CacheFlusher | None
    shard: dict[str, Any] | None = None  # ``sweep_plan.sweep_header``: a shard's sweep

    def record(
        self,
        workloads: Sequence[Workload],
        command: Sequence[str] | None,
        ceilings: RunCeilings,
        cases: list[CaseRecord],
        flags: list[str],
        partial: bool,
    ) -> RunRecord:
        config = self.config
        return RunRecord(
            created=_now(),
            tool={
                "name": "attn-harness bench",
                "version": __version__,
                "command": list(command or []),
            },
            environment=self.environment,
            ceilings=ceilings.to_json(),
            timing={
                "device": config.device,
                "clock": self.overhead.clock,
                "threads": self.threads,
                "threads_source": self.threads_source,
                "cold_cache": config.timing.cold_cache,
                "cuda_graph": config.timing.cuda_graph,
                "flush_bytes": getattr(self.flusher, "nbytes", 0),
                "config": asdict(config.timing),
                "prepare_config": asdict(config.prepare_timing),
                "case_timeout_s": config.case_timeout_s,
                "overhead": TimingRecord.from_measurement(self.overhead).to_json(),
            },
            workloads=[
                {
                    "name": w.name,
                    "version": w.version,
                    "size": config.workload_size,
                    "kind": w.kind,
                    "description": w.description,
                }
                for w in workloads
            ],
            cases=list(cases),
            partial=partial,
            flags=list(flags),
            shard=self.shard,
        )
