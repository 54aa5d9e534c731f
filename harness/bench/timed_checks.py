"""The timed calls checked: what a benchmark times is work that was done, and done right.

Checking a backend once and then timing it leaves the timed calls unwatched, and a
kernel that skips work there wins (flashinfer-bench #228: outputs cached; #414: a
stale CUDA-graph replay). So, on the CPU and on CUDA, graph replays included:

* every timed call reads fresh inputs (``harness.bench.fresh_inputs``), copied into
  the buffers it reads before the cache flush, outside the timed region;
* every timed call's output is compared, bit for bit, with the call's before it:
  for other inputs an equal output is a stale one (a cache keyed by the buffer, work
  done on one call in N, a replay of another input's graph);
* ``CHECKED_CALLS`` calls drawn at random among the first ones every timing makes
  (seeded by the case, so every backend's are the same calls and one oracle serves
  them all), the repeated one and the last call are held to the float64 oracle, as
  the check before timing is (an FP8 cache's oracle reads what that call stored);
* one sample every timing takes reads the inputs of an earlier checked call again
  (``CallPlan``): a backend that does the work takes as long as on fresh ones, a cache
  keyed by the inputs' bytes answers at once (``TimedCalls.judge_repeat``). It costs
  no extra call, and the sample is as good as any for a backend that computes.

A problem found here fails the case: ``INCORRECT_NUMERICAL`` for a wrong or stale
output, ``INCORRECT_TIMING`` for a time that cannot be the work (this, and a rate
above what the machine can do: ``harness.bench.ceiling_evidence.impossible``).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from harness.bench.fresh_inputs import InputPool, Variant, case_pool
from harness.bench.peer import ContiguousPeer
from harness.bench.table import format_ns
from harness.core.contract import LayerCache
from harness.numerics.oracle import SequenceKV
from harness.numerics.scenario import store_step_tokens

if TYPE_CHECKING:
    from harness.bench.case_check import PreparedCase
    from harness.bench.timing import TimingConfig

CHECKED_CALLS = 2
"""Timed calls (besides the last) held to the oracle in each timing."""
REPEAT_FACTOR = 10.0
"""A call on repeated inputs this many times faster than the fastest on fresh ones is a
cached output. A backend that computes takes as long on either: the inputs are copied
and the caches flushed the same way, only the bytes are the same. Ten, not less: on a
loaded 2-core machine the few samples of a small case spread 4x apart, and a cache
answers 20-400x faster."""


class CallTarget(Protocol):
    """What a timed callable reads and returns, as the checks see it."""

    def __call__(self) -> object:
        """One timed call."""

    def load(self, variant: Variant) -> None:
        """Write ``variant``'s contents where the timed call reads its inputs."""

    def output(self, result: object) -> torch.Tensor:
        """The call's ``[T, H, D]`` output."""

    def stored(self, pool: InputPool, index: int) -> list[SequenceKV | None] | None:
        """An FP8 case's K/V as the call just stored them (``None``: the variant's own)."""


@dataclass
class BackendTarget:
    """A backend's ``forward`` over buffers of its own, refilled before every call."""

    backend: Any
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    caches: list[LayerCache]  # the layer's cache, alone: what an FP8 check reads
    quantized: bool = False
    layer: int = 0

    @classmethod
    def over(
        cls,
        backend: Any,
        args: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        caches: list[LayerCache],
        quantized: bool,
        layer: int = 0,
    ) -> BackendTarget:
        query, key, value = args
        own_key = key.clone()
        # MLA: the value is a view of the key (its latent rows' prefix), and stays one
        own_value = (
            own_key[..., : value.shape[-1]] if value.data_ptr() == key.data_ptr() else value.clone()
        )
        return cls(backend, query.clone(), own_key, own_value, caches, quantized, layer)

    def __call__(self) -> object:
        return self.backend.forward(self.query, self.key, self.value, self.layer)

    def load(self, variant: Variant) -> None:
        self.query.copy_(variant.query)
        self.key.copy_(variant.key)
        if self.value.data_ptr() != self.key.data_ptr():
            self.value.copy_(variant.value)

    def output(self, result: object) -> torch.Tensor:
        if not isinstance(result, torch.Tensor):
            raise TypeError(f"forward returned {type(result).__name__}, not a tensor")
        return result

    def stored(self, pool: InputPool, index: int) -> list[SequenceKV | None] | None:
        return pool.stored(index, self.caches) if self.quantized else None


class PeerTarget:
    """The contiguous SDPA peer, its query and new tokens refilled before every call."""

    def __init__(self, peer: ContiguousPeer, quantized: bool) -> None:
        self.peer, self.quantized = peer, quantized

    def __call__(self) -> object:
        return self.peer()

    def load(self, variant: Variant) -> None:
        self.peer.load(variant.query, variant.key, variant.value)

    def output(self, result: object) -> torch.Tensor:
        return self.peer.assemble(result)  # type: ignore[arg-type]

    def stored(self, pool: InputPool, index: int) -> list[SequenceKV | None] | None:
        return ideal_store(pool, index) if self.quantized else None


@dataclass
class Problem:
    """Why a timing does not count: the status it gives the case and the cause."""

    status: str
    cause: str


@dataclass(frozen=True)
class CallPlan:
    """Which timed calls are held to the oracle, and which one reads an earlier call's
    inputs again: call numbers every timing of a case reaches, the same in each."""

    checked: frozenset[int]
    repeat: int  # this call reads the inputs of call ``repeat_of`` again
    repeat_of: int

    def variant(self, call: int) -> int:
        """The pool variant call ``call`` reads."""
        return self.repeat_of if call == self.repeat else call


def call_plan(seed: int, warmup: int, min_samples: int, checked: int = CHECKED_CALLS) -> CallPlan:
    """``checked`` calls drawn among the samples every timing takes before its final call
    (at least ``min_samples - 1``; seeded by the case), and the last of those reading the
    first checked call's inputs again (the first sample's, with none checked)."""
    first = list(range(warmup, warmup + max(2, min_samples - 1)))
    repeat, candidates = first[-1], first[:-1]
    gen = torch.Generator().manual_seed(zlib.crc32(f"checked/{seed}".encode()))
    order = torch.randperm(len(candidates), generator=gen).tolist()
    drawn = frozenset(candidates[i] for i in order[:checked])
    return CallPlan(drawn, repeat, min(drawn, default=candidates[0]))


@dataclass
class TimedCalls:
    """``measure``'s hooks (``harness.bench.timing.CallHooks``) for one timing of one case."""

    pool: InputPool
    target: CallTarget
    plan: CallPlan
    dtype: torch.dtype
    oracle: bool = True  # False: no call held to the oracle (stale outputs, repeats only)
    problem: Problem | None = None
    calls: int = 0
    oracle_checks: int = 0
    _previous: tuple[int, torch.Tensor] | None = field(default=None, repr=False)
    _pending: list[tuple[int, torch.Tensor, list[SequenceKV | None] | None]] = field(
        default_factory=list, repr=False
    )

    @property
    def final(self) -> int:
        return self.pool.size - 1

    def held(self, call: int) -> bool:
        """Whether call ``call`` is held to the oracle."""
        planned = call in self.plan.checked or call in (self.plan.repeat, self.final)
        return self.oracle and planned

    def load(self, index: int) -> None:
        self.target.load(self.pool[self.plan.variant(index)])

    def keep(self, index: int, output: object) -> None:
        self.calls += 1
        if self.problem is not None:
            return
        try:
            kept = self.target.output(output).detach().clone()
        except (TypeError, RuntimeError) as exc:
            self.problem = Problem("INCORRECT_SHAPE", f"timed call {index}: {exc}")
            return
        variant = self.plan.variant(index)
        stored = self.target.stored(self.pool, variant) if self.held(index) else None
        self._pending.append((index, kept, stored))

    def settle(self) -> None:
        pending, self._pending = self._pending, []
        for index, output, stored in pending:
            if self.problem is not None:
                return
            variant = self.plan.variant(index)
            previous, self._previous = self._previous, (variant, output)
            if previous is not None and previous[0] != variant and _same_bits(output, previous[1]):
                self.problem = Problem(
                    "INCORRECT_NUMERICAL",
                    f"output of timed call {index} is bit for bit the output of the call before "
                    "it, for other inputs: a stale output (cached by buffer, work done on some "
                    "calls only, or a call that returned before its work was done)",
                )
            elif self.held(index):
                self._hold(index, variant, output, stored)

    def _hold(
        self, index: int, variant: int, output: torch.Tensor, stored: list[SequenceKV | None] | None
    ) -> None:
        self.oracle_checks += 1
        comparison, worst = self.pool.reference(variant, stored).compare(output, self.dtype)
        if not comparison.passed:
            detail = comparison.describe()
            if comparison.worst_token >= 0:
                detail = detail.replace(f"token {comparison.worst_token},", f"token {worst},")
            self.problem = Problem(
                "INCORRECT_NUMERICAL",
                f"output of a timed call differs from the oracle: timed call {index}: {detail}",
            )

    def judge_repeat(self, samples_ns: Sequence[int], warmup: int) -> None:
        """A cached output: the call on repeated inputs ``REPEAT_FACTOR`` times faster than
        the fastest of the others (``samples_ns``: the samples, warm-up calls not among them)."""
        at = self.plan.repeat - warmup
        others = [t for i, t in enumerate(samples_ns) if i != at]
        if self.problem is not None or not 0 <= at < len(samples_ns) or not others:
            return
        repeated, fastest = samples_ns[at], min(others)
        if repeated * REPEAT_FACTOR < fastest:
            self.problem = Problem(
                "INCORRECT_TIMING",
                f"cached output: timed call {self.plan.repeat}, on the inputs of call "
                f"{self.plan.repeat_of} again, took {format_ns(repeated)} against "
                f"{format_ns(fastest)} for the fastest call on fresh inputs "
                f"({fastest / max(repeated, 1):.0f}x faster): the work is not done when the "
                "inputs repeat",
            )

    def record(self) -> dict[str, Any]:
        """What the results file keeps of these checks."""
        held = {*self.plan.checked, self.plan.repeat, self.final} if self.oracle else set()
        return {
            "calls": self.calls,
            "pool": self.pool.size,
            "oracle_checked_calls": sorted(held),
            "oracle_checks": self.oracle_checks,
            "repeat_call": self.plan.repeat,
            "repeat_of": self.plan.repeat_of,
        }


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(torch.equal(a.view(torch.uint8), b.view(torch.uint8)))


def ideal_store(pool: InputPool, index: int) -> list[SequenceKV | None]:
    """Variant ``index``'s K/V as a correct backend stores them in an FP8 cache: written
    into the case's own caches (the peer reads none of them) and read back."""
    step = pool.step(index)
    store_step_tokens(step)
    return pool.stored(index, step.caches)


def case_calls(case: PreparedCase, target: CallTarget, timing: TimingConfig) -> TimedCalls:
    """The watched calls of one timing of ``case``: its pool, its seeded plan."""
    plan = call_plan(case.spec.seed, timing.warmup, timing.min_samples)
    return TimedCalls(case_pool(case, timing), target, plan, case.inputs.queries[0].dtype)
