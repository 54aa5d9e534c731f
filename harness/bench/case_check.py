"""One benchmark case's inputs, and each backend checked on them before anything is timed.

``prepare_case`` builds a workload case's step once: one ``StepInputs``
shared by the peer and every backend, so the float64 oracle is computed once
per case, and ``check_output`` holds an output to the conformance suite's
bound. ``check_backend`` is steps 1-3 of ``harness.bench.runner``'s
docstring, up to the timing; ``classify`` names the status of a backend that
raised.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from harness.bench.fresh_inputs import InputPool
from harness.bench.timed_checks import BackendTarget
from harness.bench.timing import device_type
from harness.bench.workloads import CaseSpec, Workload
from harness.core.contract import Capabilities, LayerCache, capabilities_of
from harness.core.deadlines import CaseTimeout
from harness.core.errors import Unsupported
from harness.core.registry import BackendEntry
from harness.numerics.scenario import (
    StepInputs,
    backend_for,
    check_outputs,
    make_step_inputs,
    scenario_caches,
    store_step_tokens,
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

    A backend that owns its page format, or whose engine keeps unused cache
    memory finite, gets its own copy of the caches (``caches_for``): the same
    pages holding the same K/V, in its format, unused memory as its engine
    keeps it. Every backend so runs on the same pages.
    """

    workload: Workload
    spec: CaseSpec
    device: str
    inputs: StepInputs
    pool: InputPool | None = field(default=None, init=False)  # its timed calls' fresh inputs
    _copies: dict[tuple[str, str], list[LayerCache]] = field(init=False, repr=False)
    _pristine: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._copies = {}
        self._pristine = {}
        self._keep(self.inputs.caches)

    def _keep(self, caches: list[LayerCache]) -> None:
        self._pristine[id(caches)] = [(c.key.clone(), c.value.clone()) for c in caches]

    def caches_for(self, caps: Capabilities) -> list[LayerCache]:
        """The caches a backend with this claim runs on (see the class docstring)."""
        fmt = caps.page_format
        if fmt is None and caps.unused_cache == "any":
            return self.inputs.caches
        key = ("" if fmt is None else fmt.name, caps.unused_cache)
        if key not in self._copies:
            own = replace(self.inputs.scenario, page_format=fmt, unused_cache=caps.unused_cache)
            if fmt is not None:
                own = replace(own, cache_layout=fmt.name)
            copies = scenario_caches(own)  # unused memory as the engine keeps it
            for copy, built in zip(copies, self.inputs.caches, strict=True):
                for mine, theirs in (
                    (copy.key_nhd, built.key_nhd),
                    (copy.value_nhd, built.value_nhd),
                ):
                    written = ~theirs.float().isnan()
                    mine.copy_(torch.where(written, theirs, mine))
            self._keep(copies)
            self._copies[key] = copies
        return self._copies[key]

    def restore_caches(self, caches: list[LayerCache] | None = None) -> None:
        """The caches (by default the shared ones) back to their contents as built."""
        caches = self.inputs.caches if caches is None else caches
        for cache, (key, value) in zip(caches, self._pristine[id(caches)], strict=True):
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
class CaseCheck:
    """The outcome of checking one output (or one failure) of a case."""

    status: str
    error: str | None = None
    oracle: dict[str, Any] | None = None


def check_output(case: PreparedCase, output: object) -> CaseCheck:
    """Compare one forward output with the float64 oracle via ``harness.numerics.scenario``."""
    expected = case.inputs.output_shape(0)
    dtype = case.inputs.queries[0].dtype
    if not isinstance(output, torch.Tensor):
        return CaseCheck(
            "INCORRECT_SHAPE", f"forward returned {type(output).__name__}, not a tensor"
        )
    if tuple(output.shape) != expected or output.dtype != dtype:
        return CaseCheck(
            "INCORRECT_SHAPE",
            f"forward returned {tuple(output.shape)} {output.dtype}, expected {expected} {dtype}",
        )
    if output.device.type != torch.device(case.device).type:
        return CaseCheck("INCORRECT_SHAPE", f"forward returned a tensor on {output.device}")
    if case.spec.variant.quantized:  # the oracle reads this backend's FP8 stores, once checked
        problem = case.inputs.write_problem(0)
        if problem is not None:
            return CaseCheck("INCORRECT_NUMERICAL", problem)
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
        return CaseCheck("PASSED", None, oracle)
    return CaseCheck("INCORRECT_NUMERICAL", f"vs float64 oracle: {comparison.describe()}", oracle)


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
        kv_lora_rank=spec.kv_lora_rank,
        **spec.variant.claim(),
    )


@dataclass
class CheckedBackend:
    """A backend after its oracle check.

    ``timed`` is the prepared instance to time, and is set only when the
    verdict is ``PASSED``: a wrong answer is never timed.
    """

    verdict: CaseCheck
    timed: Any = None
    graph_mode: bool = False  # the timed instance is prepared for CUDA-graph capture

    def target(self, case: PreparedCase) -> BackendTarget:
        """The timed instance's ``forward`` over input buffers of its own (refilled before
        every timed call), on the caches it was checked on."""
        caches = case.caches_for(capabilities_of(type(self.timed)))
        return BackendTarget.over(
            self.timed, case.forward_args(), caches, case.spec.variant.quantized
        )

    def prepare_fn(self, case: PreparedCase) -> Callable[[], object]:
        backend, metadata, graph = self.timed, case.inputs.step.metadata, self.graph_mode
        return lambda: backend.prepare(metadata, graph_mode=graph)


def _run_once(backend: Any, case: PreparedCase, graph_mode: bool = False) -> object:
    caches = case.caches_for(capabilities_of(type(backend)))
    case.restore_caches(caches)  # each instance starts from the caches as built, never another's
    backend.bind_kv_caches(caches)
    backend.prepare(case.inputs.step.metadata, graph_mode=graph_mode)
    return backend.forward(*case.forward_args(), 0)


def check_backend(
    entry: BackendEntry, case: PreparedCase, *, graph_mode: bool = False
) -> CheckedBackend:
    """Steps 1-3 of ``harness.bench.runner``'s docstring, up to (not including) the timing.

    ``graph_mode=True`` (CUDA-graph timing) prepares the timed instance with
    ``graph_mode=True``, which promises no host synchronisation in
    ``forward``, and needs the backend to claim graph mode.
    """
    try:
        reason = unsupported_reason(entry, case.spec, case.device, graph_mode)
    except TypeError as exc:  # a malformed capabilities() claim
        return CheckedBackend(CaseCheck("RUNTIME_ERROR", describe(exc)))
    if reason is not None:
        return CheckedBackend(CaseCheck("UNSUPPORTED", reason))
    try:
        output = _run_once(build_backend(entry, case.spec, for_timing=False), case)
    except Exception as exc:
        return CheckedBackend(CaseCheck(classify(exc), describe(exc)))
    verdict = check_output(case, output)
    if verdict.status != "PASSED":  # nothing to time: do not build the timing instance
        return CheckedBackend(verdict)
    try:
        timed = build_backend(entry, case.spec, for_timing=True)
        first = _run_once(timed, case, graph_mode)
    except Exception as exc:
        return CheckedBackend(CaseCheck(classify(exc), f"timing instance: {describe(exc)}"))
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


def timing_instance(
    entry: BackendEntry, case: PreparedCase, *, graph_mode: bool = False
) -> CheckedBackend:
    """The timing instance alone, run once: for a case these inputs and this code already passed.

    ``attn-harness ab`` checks every case once, then times each round in
    fresh processes that rebuild the same seeded inputs; checking again
    there would only repeat the float64 oracle. A failure is still a verdict.
    """
    try:
        timed = build_backend(entry, case.spec, for_timing=True)
        _run_once(timed, case, graph_mode)
    except Exception as exc:
        return CheckedBackend(CaseCheck(classify(exc), f"timing instance: {describe(exc)}"))
    return CheckedBackend(CaseCheck("PASSED"), timed, graph_mode)
