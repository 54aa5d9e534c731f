"""One timer over devices: warm-up, cold caches, every raw sample kept, adaptive stopping.

``measure(fn, device=...)`` returns a ``Measurement`` (raw samples plus how
they were taken); statistics come from ``harness.results.statistics``, outside the
timing loop. The clock is a parameter, so tests drive adaptive stopping with
a fake clock, and the pytest-benchmark suites reuse the device clock.

* CPU: ``time.perf_counter_ns`` around each call, at a fixed thread count
  that is set for the measurement and recorded with it.
* CUDA: a pair of device events around each call, resolved once per batch,
  so no host synchronisation sits between a call's start and end; with
  ``cuda_graph=True`` the call is captured once and timed as graph replays
  (launch overhead out of the way for small kernels).
* Cold caches: before each call (outside the timed region) a buffer of at
  least twice the last-level cache is touched, so every call reads its
  K/V from memory as it would inside a model whose other layers evicted
  it, and the memory-bandwidth ceiling is the right one to compare with.
  The GPU buffer is zeroed (as triton's ``do_bench`` does); the CPU buffer is
  read, because a large CPU memset uses non-temporal stores that bypass
  the cache.
* Adaptive stopping: after ``min_samples``, stop once the bootstrap interval
  of the median is within ``target_rel_ci`` of it, or the wall-clock budget
  is spent, or ``max_samples`` is reached; the reason is recorded.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import torch

from harness.core.deadlines import shielded
from harness.core.threads import fixed_threads
from harness.results.statistics import DEFAULT_CONFIDENCE, Summary

MIN_SAMPLES = 5  # the results schema keeps at least five raw samples per case
DEFAULT_LLC_BYTES = 32 * 2**20  # when the cache size cannot be read
STOP_CONVERGED, STOP_BUDGET, STOP_MAX_SAMPLES = "converged", "budget", "max_samples"


@dataclass(frozen=True)
class TimingConfig:
    """How long and how carefully to time one callable."""

    warmup: int = 2
    min_samples: int = MIN_SAMPLES
    max_samples: int = 100
    budget_s: float = 1.0
    target_rel_ci: float = 0.05  # stop when (ci_high - ci_low) / median is at most this
    check_every: int = 5
    confidence: float = DEFAULT_CONFIDENCE
    cold_cache: bool = True
    cuda_graph: bool = False

    def __post_init__(self) -> None:
        if self.min_samples < MIN_SAMPLES:
            raise ValueError(f"min_samples must be >= {MIN_SAMPLES}, got {self.min_samples}")
        if self.max_samples < self.min_samples:
            raise ValueError(
                f"max_samples ({self.max_samples}) must be >= min_samples ({self.min_samples})"
            )
        if self.warmup < 0 or self.check_every < 1:
            raise ValueError("warmup must be >= 0 and check_every >= 1")
        if self.budget_s < 0 or self.target_rel_ci < 0:
            raise ValueError("budget_s and target_rel_ci must be >= 0")


@dataclass(frozen=True)
class Measurement:
    """Raw samples of one callable and how they were taken; statistics on demand."""

    samples_ns: tuple[int, ...]
    warmup_ns: tuple[int, ...]
    clock: str
    device: str
    threads: int
    stop_reason: str
    flush_bytes: int
    confidence: float = DEFAULT_CONFIDENCE

    @cached_property
    def summary(self) -> Summary:
        return Summary.of(self.samples_ns, confidence=self.confidence)

    @property
    def median_ns(self) -> float:
        return self.summary.median


# -- clocks ------------------------------------------------------------------------


class Clock(Protocol):
    """Takes stamps around calls; resolves pairs of stamps into nanoseconds."""

    name: str

    def mark(self) -> Any: ...

    def elapsed_ns(self, pairs: Sequence[tuple[Any, Any]]) -> list[int]: ...


class HostClock:
    """``perf_counter_ns`` (or any integer-nanosecond function, e.g. a fake in tests)."""

    def __init__(self, now: Callable[[], int] = time.perf_counter_ns, name: str | None = None):
        self._now = now
        self.name = name or ("perf_counter_ns" if now is time.perf_counter_ns else "custom")

    def mark(self) -> int:
        return self._now()

    def elapsed_ns(self, pairs: Sequence[tuple[Any, Any]]) -> list[int]:
        return [int(end) - int(start) for start, end in pairs]


class CudaEventClock:
    """Device events on the current stream; one synchronisation per batch of samples."""

    name = "cuda_event"

    def __init__(self, device: str | torch.device = "cuda") -> None:
        self.device = torch.device(device)

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def elapsed_ns(self, pairs: Sequence[tuple[Any, Any]]) -> list[int]:
        torch.cuda.synchronize(self.device)
        return [round(start.elapsed_time(end) * 1e6) for start, end in pairs]


def default_clock(device: str) -> Clock:
    return CudaEventClock(device) if device_type(device) == "cuda" else HostClock()


def device_type(device: str | torch.device) -> str:
    return torch.device(device).type


class _EventStamp:
    """A recorded CUDA event whose difference with another stamp is seconds of device time."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = torch.cuda.Event(enable_timing=True)
        self.event.record()

    def __sub__(self, earlier: _EventStamp) -> float:
        self.event.synchronize()
        return float(earlier.event.elapsed_time(self.event)) / 1e3


def stamp_timer(device: str) -> Callable[[], Any]:
    """A zero-argument timer for tools that compute ``end - start`` (pytest-benchmark).

    On the CPU it is ``time.perf_counter``. On CUDA each call records an
    event without waiting, and ``end - start`` waits for the end event and
    returns the device time between them in seconds: host-clock timing of
    asynchronous GPU work would measure launch time, not the kernel.
    """
    if device_type(device) == "cuda":
        return _EventStamp
    return time.perf_counter


# -- garbage collection, cache flushing and threads ---------------------------------


@contextlib.contextmanager
def long_lived_objects_frozen() -> Iterator[None]:
    """Keep what exists now (modules, classes, compiled graphs) out of later collections.

    ``measure`` collects garbage before it times, so that a collection never lands
    inside the timed calls. With torch and the harness loaded a full collection
    walks some 300,000 objects, about 0.15 s here, hundreds of times a run: a fifth of
    a CPU benchmark run. Frozen objects are skipped, not lost: they rejoin the
    collector on exit.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def last_level_cache_bytes(device: str) -> int:
    """L2 size of a GPU, or the largest CPU cache Linux reports."""
    if device_type(device) == "cuda":
        props = torch.cuda.get_device_properties(torch.device(device))
        return int(getattr(props, "L2_cache_size", 0)) or 64 * 2**20
    sizes = []
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = entry.read_text().strip().upper()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        if text and text[-1] in units and text[:-1].isdigit():
            sizes.append(int(text[:-1]) * units[text[-1]])
        elif text.isdigit():
            sizes.append(int(text))
    return max(sizes, default=DEFAULT_LLC_BYTES)


class CacheFlusher:
    """Evicts the last-level cache by touching a buffer of at least twice its size."""

    def __init__(self, device: str, nbytes: int | None = None) -> None:
        self.device = device
        self.nbytes = nbytes if nbytes is not None else 2 * last_level_cache_bytes(device)
        elements = max(1, self.nbytes // 4)
        self._buffer = torch.ones(elements, dtype=torch.float32, device=torch.device(device))
        self._is_cuda = device_type(device) == "cuda"

    def __call__(self) -> None:
        if self._is_cuda:
            self._buffer.zero_()
        else:
            self._buffer.sum()


# -- measuring ---------------------------------------------------------------------


def capture_cuda_graph(fn: Callable[[], object], device: str) -> Callable[[], object]:
    """Capture ``fn`` (warmed up on a side stream, as CUDA graphs require) for replay.

    The replay returns what ``fn`` returned while captured: the graph's output tensors,
    which each replay overwrites, so a timed replay's output can be checked like a call's.
    """
    dev = torch.device(device)
    stream = torch.cuda.Stream(dev)
    stream.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(dev).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with shielded():  # a case deadline firing mid-capture would leave the stream capturing
        with torch.cuda.graph(graph):
            captured = fn()
        torch.cuda.synchronize(dev)

    def replay() -> object:
        graph.replay()
        return captured

    return replay


class CallHooks(Protocol):
    """What ``measure`` does around each timed call besides timing it, outside the timed
    region: give call ``index`` its inputs (before the cache flush), keep its output,
    and look at the kept outputs once a batch's times are resolved."""

    @property
    def final(self) -> int:
        """The number of the last timed call, whatever the count before it."""

    def load(self, index: int) -> None: ...

    def keep(self, index: int, output: object) -> None: ...

    def settle(self) -> None: ...


def _timed_batch(
    call: Callable[[], object],
    clock: Clock,
    flush: Callable[[], None] | None,
    indices: Sequence[int],
    hooks: CallHooks | None = None,
) -> list[int]:
    pairs = []
    for index in indices:
        if hooks is not None:
            hooks.load(index)
        if flush is not None:
            flush()
        start = clock.mark()
        output = call()
        pairs.append((start, clock.mark()))
        if hooks is not None:
            hooks.keep(index, output)
    elapsed = clock.elapsed_ns(pairs)
    if hooks is not None:
        hooks.settle()
    return elapsed


def measure(
    fn: Callable[[], object],
    *,
    device: str = "cpu",
    config: TimingConfig | None = None,
    threads: int | None = None,
    clock: Clock | None = None,
    flusher: Callable[[], None] | None = None,
    wall_ns: Callable[[], int] = time.perf_counter_ns,
    hooks: CallHooks | None = None,
) -> Measurement:
    """Time ``fn`` on ``device``: warm-up, then batches of samples until a stop rule fires.

    ``flusher`` runs before every call, outside the timed region (default:
    a new ``CacheFlusher`` when ``config.cold_cache``; any other setup, such
    as a device synchronisation, can be passed instead). ``wall_ns`` measures
    the budget; tests pass a fake one together with a fake ``clock``.

    With ``hooks`` (``harness.bench.timed_checks``) every call, warm-up included, is
    numbered: call ``i`` gets its inputs from ``hooks.load(i)`` and its output goes to
    ``hooks.keep``, and the last sample is one more call numbered ``hooks.final`` (so
    ``max_samples`` counts it). The time the hooks take is not the budget's.
    """
    config = config or TimingConfig()
    clock = clock or default_clock(device)
    if flusher is None and config.cold_cache:
        flusher = CacheFlusher(device)
    flush_bytes = int(getattr(flusher, "nbytes", 0))
    with fixed_threads(threads) as used_threads:
        call: Callable[[], object] = fn
        clock_name = clock.name
        if config.cuda_graph and device_type(device) == "cuda":
            call = capture_cuda_graph(fn, device)
            clock_name += "+cuda_graph"
        timed = _HookedBatches(call, clock, flusher, hooks, wall_ns)
        gc.collect()
        started = wall_ns()
        warmup = timed.batch(config.warmup)
        samples: list[int] = []
        reason = STOP_MAX_SAMPLES
        last = 1 if hooks is not None else 0  # the final call, taken after the loop
        while len(samples) < config.max_samples - last:
            missing = config.min_samples - last - len(samples)
            count = missing if missing > 0 else config.check_every
            count = min(count, config.max_samples - last - len(samples))
            samples.extend(timed.batch(count))
            if len(samples) >= config.max_samples - last:
                break
            summary = Summary.of(samples, confidence=config.confidence)
            if summary.relative_ci_width <= config.target_rel_ci:
                reason = STOP_CONVERGED
                break
            if wall_ns() - started - timed.hooks_ns >= config.budget_s * 1e9:
                reason = STOP_BUDGET
                break
        if hooks is not None:
            samples.extend(timed.batch(1, final=True))
    return Measurement(
        samples_ns=tuple(samples),
        warmup_ns=tuple(warmup),
        clock=clock_name,
        device=device,
        threads=used_threads,
        stop_reason=reason,
        flush_bytes=flush_bytes,
        confidence=config.confidence,
    )


class _HookedBatches:
    """Batches of timed calls numbered from 0, and the wall time their hooks took."""

    def __init__(
        self,
        call: Callable[[], object],
        clock: Clock,
        flush: Callable[[], None] | None,
        hooks: CallHooks | None,
        wall_ns: Callable[[], int],
    ) -> None:
        self.call, self.clock, self.flush = call, clock, flush
        self.hooks = None if hooks is None else _StopwatchHooks(hooks, wall_ns)
        self.next = 0

    @property
    def hooks_ns(self) -> int:
        return 0 if self.hooks is None else self.hooks.spent_ns

    def batch(self, count: int, final: bool = False) -> list[int]:
        if self.hooks is None:
            return _timed_batch(self.call, self.clock, self.flush, range(count))
        indices = [self.hooks.final] if final else range(self.next, self.next + count)
        if not final:
            self.next += count
        return _timed_batch(self.call, self.clock, self.flush, indices, self.hooks)


class _StopwatchHooks:
    """``hooks``, with the wall time spent in them added up."""

    def __init__(self, hooks: CallHooks, wall_ns: Callable[[], int]) -> None:
        self.inner, self.wall_ns, self.spent_ns = hooks, wall_ns, 0

    @property
    def final(self) -> int:
        return self.inner.final

    def _timed(self, step: Callable[[], None]) -> None:
        before = self.wall_ns()
        step()
        self.spent_ns += max(0, self.wall_ns() - before)

    def load(self, index: int) -> None:
        self._timed(lambda: self.inner.load(index))

    def keep(self, index: int, output: object) -> None:
        self._timed(lambda: self.inner.keep(index, output))

    def settle(self) -> None:
        self._timed(self.inner.settle)


def timer_overhead(
    device: str = "cpu",
    *,
    samples: int = 50,
    threads: int | None = None,
    clock: Clock | None = None,
) -> Measurement:
    """Time an empty call through the same path: the floor under every sample."""
    config = TimingConfig(
        warmup=2,
        min_samples=samples,
        max_samples=samples,
        target_rel_ci=0.0,
        budget_s=float("inf"),
        cold_cache=False,
    )
    return measure(lambda: None, device=device, config=config, threads=threads, clock=clock)
