"""The benchmark runner: check every case against the oracle, then time it, beside its peer.

How it measures, for users: ``docs/benchmarks.md``.

For each workload case the runner builds the step once (``harness.numerics.scenario``):
one ``StepInputs`` shared by the peer and every backend, so the float64 oracle
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
the pieces below; neither re-implements the checking.
"""

from __future__ import annotations

import datetime
import gc
import inspect
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from harness import __version__
from harness.bench.ceilings import RunCeilings, run_ceilings
from harness.bench.environment import fingerprint
from harness.bench.metrics import rates, roofline
from harness.bench.peer import PEER_CLASS, PEER_NAME, ContiguousPeer
from harness.bench.sdpa_pin import first_kernel_that_runs, says_no_kernel
from harness.bench.timing import (
    CacheFlusher,
    HostClock,
    TimingConfig,
    device_type,
    fixed_threads,
    measure,
    timer_overhead,
)
from harness.bench.workloads import CaseSpec, Workload
from harness.core.contract import capabilities_of
from harness.core.deadlines import CaseTimeout, deadline
from harness.core.errors import Unsupported
from harness.core.registry import BackendEntry, class_label
from harness.numerics.scenario import (
    StepInputs,
    backend_for,
    check_outputs,
    make_step_inputs,
    store_step_tokens,
)
from harness.results.statistics import bootstrap_ratio_ci
from harness.results.store import FAILING_STATUSES, CaseRecord, RunRecord, TimingRecord

PREPARE_TIMING = TimingConfig(
    warmup=1, min_samples=5, max_samples=50, budget_s=0.25, target_rel_ci=0.05, cold_cache=False
)


def classify(exc: BaseException) -> str:
    """The status of a case whose backend raised ``exc`` on valid input."""
    if isinstance(exc, CaseTimeout):
        return "TIMEOUT"
    if isinstance(exc, Unsupported):
        return "UNSUPPORTED"
    if isinstance(exc, ValueError):
        return "REJECTED_VALID"
    return "RUNTIME_ERROR"


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# -- one case's inputs and its peer ------------------------------------------------


@dataclass
class PreparedCase:
    """A workload case with its deterministic inputs on the device.

    ``inputs`` is built once and shared by the peer and every backend, so
    its cached oracle (``StepInputs.reference``) is computed once per case.
    Backends write into the shared caches, so ``restore_caches`` puts back
    their state as built before each run: otherwise a backend that skips
    writing the new K/V would pass on what an earlier backend wrote, and one
    that writes stray slots would fail the backends after it.
    """

    workload: Workload
    spec: CaseSpec
    device: str
    inputs: StepInputs
    _pristine: list[tuple[torch.Tensor, torch.Tensor]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._pristine = [(c.key.clone(), c.value.clone()) for c in self.inputs.caches]

    def restore_caches(self) -> None:
        """Every cache back to its contents as built (new tokens' slots unwritten)."""
        for cache, (key, value) in zip(self.inputs.caches, self._pristine, strict=True):
            cache.key.copy_(key)
            cache.value.copy_(value)

    def store_new_tokens(self) -> None:
        """Write the step's new K/V as a correct backend would (the peer writes none).

        Only the FP8 peer's check needs it: its oracle reads the cache.
        """
        self.restore_caches()
        store_step_tokens(self.inputs)

    @property
    def prefix(self) -> str:
        return f"{self.workload.key}/{self.spec.name}"

    def case_id(self, backend: str) -> str:
        return case_id(self.workload, self.spec.name, backend)

    def forward_args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.inputs.queries[0], self.inputs.keys[0], self.inputs.values[0]


def case_id(workload: Workload, case: str, backend: str) -> str:
    """A record's id: ``workload@version/case::backend``, e.g. ``decode-sweep@1/ctx=512::sdpa``.

    ``::`` sets the backend apart, since a backend spec may hold slashes of its
    own (``/abs/path/file.py:Class``): joined with ``/`` that gave ``...//abs/...``.
    Ids are opaque to readers, so files written with the old ``/`` form still load.
    """
    return f"{workload.key}/{case}::{backend}"


def prepare_case(workload: Workload, spec: CaseSpec, device: str) -> PreparedCase:
    return PreparedCase(workload, spec, device, make_step_inputs(spec.scenario(device)))


# -- checking a backend ------------------------------------------------------------


@dataclass
class Verdict:
    """The outcome of checking one output (or one failure) of a case."""

    status: str
    error: str | None = None
    oracle: dict[str, Any] | None = None


def check_output(case: PreparedCase, output: object) -> Verdict:
    """Compare one forward output with the float64 oracle via ``harness.numerics.scenario``."""
    expected = tuple(case.inputs.queries[0].shape)
    dtype = case.inputs.queries[0].dtype
    if not isinstance(output, torch.Tensor):
        return Verdict("INCORRECT_SHAPE", f"forward returned {type(output).__name__}, not a tensor")
    if tuple(output.shape) != expected or output.dtype != dtype:
        return Verdict(
            "INCORRECT_SHAPE",
            f"forward returned {tuple(output.shape)} {output.dtype}, expected {expected} {dtype}",
        )
    if output.device.type != torch.device(case.device).type:
        return Verdict("INCORRECT_SHAPE", f"forward returned a tensor on {output.device}")
    if case.spec.variant.quantized:  # the oracle reads this backend's FP8 stores, once checked
        problem = case.inputs.write_problem(0)
        if problem is not None:
            return Verdict("INCORRECT_NUMERICAL", problem)
        case.inputs.forget_references()
    comparison = check_outputs(case.inputs, [output])[0]
    oracle = {
        "passed": comparison.passed,
        "worst_ratio": comparison.worst_ratio,
        "worst_error": comparison.worst_error,
        "worst_bound": comparison.worst_bound,
        "checked_tokens": comparison.checked_tokens,
        "nonfinite": comparison.nonfinite,
        "detail": comparison.describe(),
    }
    if comparison.passed:
        return Verdict("PASSED", None, oracle)
    return Verdict("INCORRECT_NUMERICAL", f"vs float64 oracle: {comparison.describe()}", oracle)


def accepts_validate(cls: type) -> bool:
    """Whether the constructor names ``validate`` (never guessed from ``**kwargs``)."""
    try:
        return "validate" in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


def build_backend(entry: BackendEntry, spec: CaseSpec, *, for_timing: bool) -> Any:
    """Construct ``entry`` for ``spec``; for timing, with validation off where it can be."""
    kwargs: dict[str, Any] = {}
    if for_timing and accepts_validate(entry.cls):
        kwargs["validate"] = False
    return backend_for(entry, spec.scenario(), **kwargs)


def unsupported_reason(
    entry: BackendEntry, spec: CaseSpec, device: str, graph_mode: bool = False
) -> str | None:
    if spec.dp_size > 1 and not entry.accepts_dp:
        return f"not DP-aware: cannot serve dp_size={spec.dp_size}"
    caps = capabilities_of(entry.cls)
    if device_type(device) in caps.interpreted_devices:
        return f"runs interpreted on {device_type(device)}: its time says nothing, not timed"
    return caps.unsupported_reason(
        dtype=spec.torch_dtype,
        device=device_type(device),
        page_size=spec.page_size,
        head_dim=spec.head_dim,
        seq_len=max(spec.context_lens),
        causal=spec.causal,
        dp_size=spec.dp_size,
        graph_mode=graph_mode,
        **spec.variant.claim(),
    )


@dataclass
class CheckedBackend:
    """A backend after its oracle check.

    ``timed`` is the prepared instance to time, and is set only when the
    verdict is ``PASSED``: a wrong answer is never timed.
    """

    verdict: Verdict
    timed: Any = None
    graph_mode: bool = False  # the timed instance is prepared for CUDA-graph capture

    def forward_fn(self, case: PreparedCase) -> Callable[[], object]:
        query, key, value = case.forward_args()
        backend = self.timed
        return lambda: backend.forward(query, key, value, 0)

    def prepare_fn(self, case: PreparedCase) -> Callable[[], object]:
        backend, metadata, graph = self.timed, case.inputs.step.metadata, self.graph_mode
        return lambda: backend.prepare(metadata, graph_mode=graph)


def _run_once(backend: Any, case: PreparedCase, graph_mode: bool = False) -> object:
    case.restore_caches()  # each instance starts from the caches as built, never another's
    backend.bind_kv_caches(case.inputs.caches)
    backend.prepare(case.inputs.step.metadata, graph_mode=graph_mode)
    return backend.forward(*case.forward_args(), 0)


def check_backend(
    entry: BackendEntry, case: PreparedCase, *, graph_mode: bool = False
) -> CheckedBackend:
    """Steps 1-3 of the module docstring, up to (not including) the timing.

    ``graph_mode=True`` (CUDA-graph timing) prepares the timed instance with
    ``graph_mode=True``, which promises no host synchronisation in
    ``forward``, and needs the backend to claim graph mode.
    """
    try:
        reason = unsupported_reason(entry, case.spec, case.device, graph_mode)
    except TypeError as exc:  # a malformed capabilities() claim
        return CheckedBackend(Verdict("RUNTIME_ERROR", describe(exc)))
    if reason is not None:
        return CheckedBackend(Verdict("UNSUPPORTED", reason))
    try:
        output = _run_once(build_backend(entry, case.spec, for_timing=False), case)
    except Exception as exc:
        return CheckedBackend(Verdict(classify(exc), describe(exc)))
    verdict = check_output(case, output)
    if verdict.status != "PASSED":  # nothing to time: do not build the timing instance
        return CheckedBackend(verdict)
    try:
        timed = build_backend(entry, case.spec, for_timing=True)
        first = _run_once(timed, case, graph_mode)
    except Exception as exc:
        return CheckedBackend(Verdict(classify(exc), f"timing instance: {describe(exc)}"))
    identical = (
        isinstance(first, torch.Tensor)
        and isinstance(output, torch.Tensor)
        and torch.equal(first, output)
    )
    if not identical:  # same inputs, so the cached oracle is reused
        again = check_output(case, first)
        if again.status != "PASSED":
            again.error = f"with validate=False: {again.error}"
            return CheckedBackend(again)
    return CheckedBackend(verdict, timed, graph_mode)


# -- metrics -----------------------------------------------------------------------


def case_metrics(
    spec: CaseSpec,
    forward: TimingRecord,
    ceilings: RunCeilings,
    peer: TimingRecord | None,
) -> tuple[dict[str, Any], list[str]]:
    """Rates, roofline fractions and the ratio to the peer, from the forward median."""
    work = spec.work()
    seconds = forward.summary().median * 1e-9
    achieved = rates(work, seconds)
    used = ceilings.used
    roof = roofline(
        work,
        seconds,
        bandwidth=None if used is None else used.memory_bandwidth,
        flops=None if used is None else used.flops_for(spec.dtype),
    )
    ratio = ratio_ci = None
    if peer is not None:
        ratio = forward.summary().median / peer.summary().median
        ratio_ci = list(bootstrap_ratio_ci(forward.samples_ns, peer.samples_ns))
    metrics = {
        "tokens": work.num_tokens,
        "flops": work.flops,
        "bytes": work.bytes,
        "arithmetic_intensity": work.arithmetic_intensity,
        "median_s": seconds,
        "tokens_per_s": achieved.tokens_per_s,
        "tflops": achieved.tflops,
        "gbps": achieved.gbps,
        "bandwidth_fraction": roof.bandwidth_fraction,
        "compute_fraction": roof.compute_fraction,
        "roofline_fraction": roof.roofline_fraction,
        "bound": roof.bound,
        "ceiling_source": None if used is None else used.source,
        "ratio_to_peer": ratio,
        "ratio_to_peer_ci": ratio_ci,
    }
    return metrics, list(roof.flags)


# -- the run -----------------------------------------------------------------------


@dataclass(frozen=True)
class BenchConfig:
    """Everything about a run that is not the backends and workloads."""

    device: str = "cpu"
    size: str | None = None  # workload size; default: "gpu" on CUDA, else "cpu"
    threads: int | None = None
    timing: TimingConfig = field(default_factory=TimingConfig)
    prepare_timing: TimingConfig = PREPARE_TIMING
    case_timeout_s: float | None = 600.0
    probe_ceilings: bool = True
    pin_sdpa: bool | None = None  # pin the peer's and sdpa's SDPA kernel; None: on CUDA only

    @property
    def pins_sdpa(self) -> bool:
        return device_type(self.device) == "cuda" if self.pin_sdpa is None else self.pin_sdpa

    @property
    def workload_size(self) -> str:
        if self.size is not None:
            return self.size
        return "gpu" if device_type(self.device) == "cuda" else "cpu"


ProgressFn = Callable[[int, int, str], None]
Attempt = tuple[Verdict, dict[str, TimingRecord]]
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

    def _tick(self, label: str) -> None:
        self.done += 1
        self.progress(self.done, self.total, label)

    def _time_forward(self, fn: Callable[[], object]) -> TimingRecord:
        m = measure(
            fn,
            device=self.config.device,
            config=self.config.timing,
            flusher=self.flusher,
        )
        return TimingRecord.from_measurement(m)

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
        if not record.valid or record.forward is None:
            return
        peer_forward = peer.forward if peer is not None and peer.valid else None
        record.metrics, flags = case_metrics(case.spec, record.forward, self.ceilings, peer_forward)
        record.flags.extend(flags)

    def _pinned(
        self, attempt: Callable[[], Attempt], uses_sdpa: bool
    ) -> tuple[str | None, Attempt]:
        """Check and time under one pinned SDPA kernel where that applies (see ``sdpa_pin``)."""
        if not (uses_sdpa and self.config.pins_sdpa):
            return None, attempt()
        return first_kernel_that_runs(attempt, lambda got: says_no_kernel(got[0].error))

    def _peer_attempt(self, case: PreparedCase) -> Attempt:
        timings: dict[str, TimingRecord] = {}
        try:
            with deadline(self.config.case_timeout_s):
                peer = ContiguousPeer(case.inputs)
                if case.spec.variant.quantized:
                    case.store_new_tokens()
                verdict = check_output(case, peer.assemble(peer()))
                if verdict.status == "PASSED":  # a wrong peer gives no ratio: do not time it
                    timings["forward"] = self._time_forward(peer)
        except CaseTimeout as exc:
            verdict, timings = Verdict("TIMEOUT", f"peer: {describe(exc)}"), {}
        except Exception as exc:  # the harness's own peer failed: say so, keep going
            verdict, timings = Verdict("RUNTIME_ERROR", f"peer: {describe(exc)}"), {}
        return verdict, timings

    def run_peer(self, case: PreparedCase) -> CaseRecord:
        kernel, (verdict, timings) = self._pinned(lambda: self._peer_attempt(case), True)
        record = self._record(
            case,
            PEER_NAME,
            verdict.status,
            backend_class=PEER_CLASS,
            error=verdict.error,
            oracle=verdict.oracle,
            sdpa_kernel=kernel,
            **timings,
        )
        self._finish(record, case, None)
        self._tick(f"{case.prefix} {PEER_NAME}")
        return record

    def run_backend(self, entry: BackendEntry, case: PreparedCase, peer: CaseRecord) -> None:
        backend_class = class_label(entry.cls)
        kernel, (verdict, timings) = self._pinned(
            lambda: self._backend_attempt(entry, case), backend_class in SDPA_BACKEND_CLASSES
        )
        record = self._record(
            case,
            entry.name,
            verdict.status,
            backend_class=backend_class,
            error=verdict.error,
            oracle=verdict.oracle,
            peer=peer.id,
            sdpa_kernel=kernel,
            **timings,
        )
        self._finish(record, case, peer)
        self._tick(f"{case.prefix} {entry.name}")

    def _backend_attempt(self, entry: BackendEntry, case: PreparedCase) -> Attempt:
        timings: dict[str, TimingRecord] = {}
        try:
            with deadline(self.config.case_timeout_s):
                checked = check_backend(entry, case, graph_mode=self.graph_mode)
                verdict = checked.verdict
                if checked.timed is not None:  # PASSED: only a correct answer is timed
                    timings["prepare"] = self._time_prepare(checked.prepare_fn(case))
                    timings["forward"] = self._time_forward(checked.forward_fn(case))
        except CaseTimeout as exc:
            verdict, timings = Verdict("TIMEOUT", describe(exc)), {}
        except Exception as exc:  # raised while timing: its samples are not a result
            verdict, timings = Verdict(classify(exc), f"during timing: {describe(exc)}"), {}
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
        for entry in backends:
            self.run_backend(entry, case, peer)
        del case
        gc.collect()
        if device_type(self.config.device) == "cuda":
            torch.cuda.empty_cache()


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


def run_benchmarks(
    backends: Sequence[BackendEntry],
    workloads: Sequence[Workload],
    config: BenchConfig | None = None,
    *,
    progress: ProgressFn | None = None,
    command: Sequence[str] | None = None,
) -> RunRecord:
    """Run every (case, backend) of ``workloads`` and return the run's record."""
    config = config or BenchConfig()
    size = config.workload_size
    plan = [(w, spec) for w in workloads for spec in w.cases(size)]
    dtypes = tuple(dict.fromkeys(spec.torch_dtype for _, spec in plan))
    with fixed_threads(config.threads) as threads:
        environment = fingerprint(config.device, threads=threads)
        overhead = timer_overhead(config.device)
        ceilings = run_ceilings(
            config.device,
            dtypes=dtypes or (torch.float32,),
            measure_probe=config.probe_ceilings,
        )
        flusher = CacheFlusher(config.device) if config.timing.cold_cache else None
        runner = _Runner(
            config,
            ceilings,
            flusher,
            progress or (lambda done, total, label: None),
            total=len(plan) * (len(backends) + 1),
        )
        for workload, spec in plan:
            runner.run_case(workload, spec, backends)
    return RunRecord(
        created=_now(),
        tool={"name": "attn-harness bench", "version": __version__, "command": list(command or [])},
        environment=environment,
        ceilings=ceilings.to_json(),
        timing={
            "device": config.device,
            "clock": overhead.clock,
            "threads": threads,
            "cold_cache": config.timing.cold_cache,
            "cuda_graph": config.timing.cuda_graph,
            "flush_bytes": getattr(flusher, "nbytes", 0),
            "config": asdict(config.timing),
            "prepare_config": asdict(config.prepare_timing),
            "case_timeout_s": config.case_timeout_s,
            "overhead": TimingRecord.from_measurement(overhead).to_json(),
        },
        workloads=[
            {
                "name": w.name,
                "version": w.version,
                "size": size,
                "kind": w.kind,
                "description": w.description,
            }
            for w in workloads
        ],
        cases=runner.records,
    )


def failed(record: RunRecord) -> bool:
    """A run fails when any case failed, or when nothing at all passed."""
    statuses = [c.status for c in record.cases]
    return any(s in FAILING_STATUSES for s in statuses) or "PASSED" not in statuses
