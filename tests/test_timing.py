"""The timer: raw samples kept, stop rules driven by a fake clock, threads fixed, overhead."""

from __future__ import annotations

import itertools
import time

import pytest
import torch

from harness.bench.timing import (
    STOP_BUDGET,
    STOP_CONVERGED,
    STOP_MAX_SAMPLES,
    CacheFlusher,
    HostClock,
    TimingConfig,
    last_level_cache_bytes,
    measure,
    stamp_timer,
    timer_overhead,
)


class ScriptedClock:
    """A clock whose samples come from a script; it logs every mark it takes."""

    name = "scripted"

    def __init__(self, durations, log=None):
        self.durations = iter(durations)
        self.log = log if log is not None else []

    def mark(self):
        self.log.append("mark")
        return len(self.log)

    def elapsed_ns(self, pairs):
        return [next(self.durations) for _ in pairs]


class FakeWall:
    """A wall clock that advances ``step`` nanoseconds each time it is read."""

    def __init__(self, step: int):
        self.step = step
        self.now = 0

    def __call__(self) -> int:
        value = self.now
        self.now += self.step
        return value


def _config(**kw) -> TimingConfig:
    base = dict(warmup=2, min_samples=5, max_samples=40, budget_s=1e9, cold_cache=False)
    return TimingConfig(**{**base, **kw})


def test_keeps_every_raw_sample_and_the_warmup_apart():
    script = [900, 800, 101, 102, 103, 104, 105]
    m = measure(lambda: None, config=_config(max_samples=5), clock=ScriptedClock(script))
    assert m.warmup_ns == (900, 800)
    assert m.samples_ns == (101, 102, 103, 104, 105)
    assert m.clock == "scripted"
    assert m.summary.median == 103


def test_stops_when_the_interval_is_tight():
    m = measure(lambda: None, config=_config(), clock=ScriptedClock(itertools.repeat(1000)))
    assert m.stop_reason == STOP_CONVERGED
    assert len(m.samples_ns) == 5


def test_noisy_samples_run_to_max_samples_without_a_budget():
    noisy = itertools.cycle([100, 10_000, 3_000, 50, 7_000])
    m = measure(lambda: None, config=_config(target_rel_ci=0.001), clock=ScriptedClock(noisy))
    assert m.stop_reason == STOP_MAX_SAMPLES
    assert len(m.samples_ns) == 40


def test_budget_stops_after_whole_batches():
    noisy = itertools.cycle([100, 10_000, 3_000, 50, 7_000])
    m = measure(
        lambda: None,
        config=_config(target_rel_ci=0.001, budget_s=1.0, check_every=5),
        clock=ScriptedClock(noisy),
        wall_ns=FakeWall(400_000_000),  # read at start, then after each batch
    )
    assert m.stop_reason == STOP_BUDGET
    assert len(m.samples_ns) == 15


def test_min_samples_are_taken_even_with_no_budget_left():
    noisy = itertools.cycle([100, 10_000])
    m = measure(
        lambda: None,
        config=_config(target_rel_ci=0.001, budget_s=0.0),
        clock=ScriptedClock(noisy),
    )
    assert m.stop_reason == STOP_BUDGET
    assert len(m.samples_ns) == 5


def test_flush_runs_before_every_call_outside_the_timed_region():
    log: list[str] = []
    m = measure(
        lambda: log.append("call"),
        config=_config(warmup=1, max_samples=5),
        clock=ScriptedClock(itertools.repeat(10), log),
        flusher=lambda: log.append("flush"),
    )
    assert log == ["flush", "mark", "call", "mark"] * 6
    assert len(m.samples_ns) == 5


def test_thread_count_is_fixed_recorded_and_restored():
    before = torch.get_num_threads()
    seen = []
    m = measure(
        lambda: seen.append(torch.get_num_threads()),
        config=_config(max_samples=5),
        threads=1,
        clock=ScriptedClock(itertools.repeat(5)),
    )
    assert m.threads == 1
    assert set(seen) == {1}
    assert torch.get_num_threads() == before


def test_real_cpu_clock_and_overhead():
    m = measure(lambda: sum(range(100)), config=_config(max_samples=10))
    assert m.clock == "perf_counter_ns"
    assert len(m.samples_ns) >= 5
    assert all(s > 0 for s in m.samples_ns)
    overhead = timer_overhead("cpu", samples=20)
    assert len(overhead.samples_ns) == 20
    assert 0 <= overhead.median_ns < 1_000_000  # an empty call costs far less than a millisecond
    assert overhead.flush_bytes == 0


def test_host_clock_resolves_pairs():
    ticks = iter([10, 25, 30, 70])
    clock = HostClock(lambda: next(ticks))
    pairs = [(clock.mark(), clock.mark()), (clock.mark(), clock.mark())]
    assert clock.elapsed_ns(pairs) == [15, 40]
    assert clock.name == "custom"


def test_cpu_flusher_covers_twice_the_last_level_cache():
    flusher = CacheFlusher("cpu")
    assert flusher.nbytes >= 2 * last_level_cache_bytes("cpu")
    flusher()  # runs
    m = measure(lambda: None, config=_config(max_samples=5, cold_cache=True, warmup=0))
    assert m.flush_bytes == 2 * last_level_cache_bytes("cpu")


def test_pytest_benchmark_timer_on_cpu_is_the_host_clock():
    assert stamp_timer("cpu") is time.perf_counter


@pytest.mark.parametrize(
    "bad",
    [
        dict(min_samples=4),
        dict(min_samples=10, max_samples=9),
        dict(warmup=-1),
        dict(check_every=0),
    ],
)
def test_config_rejects_too_few_samples_and_nonsense(bad):
    with pytest.raises(ValueError, match="must be"):
        TimingConfig(**bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("graph", [False, True])
def test_cuda_events_and_graph_replay(graph):
    x = torch.randn(1 << 20, device="cuda")
    config = _config(cuda_graph=graph, cold_cache=True)
    m = measure(lambda: x.mul_(1.0), device="cuda", config=config)
    assert m.clock == ("cuda_event+cuda_graph" if graph else "cuda_event")
    assert len(m.samples_ns) >= 5
    assert all(s > 0 for s in m.samples_ns)
    assert m.flush_bytes >= 2 * last_level_cache_bytes("cuda")
    timer = stamp_timer("cuda")
    start = timer()
    x.mul_(1.0)
    assert (timer() - start) > 0


class _NumberingHooks:
    """Records what ``measure`` asks of its hooks; ``load`` takes ``pause_s`` of wall time."""

    final = 99

    def __init__(self, pause_s: float = 0.0) -> None:
        self.log: list[tuple[str, int]] = []
        self.pause_s = pause_s

    def load(self, index: int) -> None:
        time.sleep(self.pause_s)
        self.log.append(("load", index))

    def keep(self, index: int, output: object) -> None:
        assert output == "out"
        self.log.append(("keep", index))

    def settle(self) -> None:
        self.log.append(("settle", -1))


def test_hooks_number_every_call_and_the_last_sample_is_the_final_call():
    hooks = _NumberingHooks()
    config = TimingConfig(warmup=2, min_samples=5, max_samples=5, cold_cache=False)
    m = measure(lambda: "out", config=config, hooks=hooks)
    loads = [i for what, i in hooks.log if what == "load"]
    assert loads == [0, 1, 2, 3, 4, 5, 99]  # warm-up, four samples, the final call
    assert [i for what, i in hooks.log if what == "keep"] == loads
    assert len(m.samples_ns) == 5  # max_samples counts the final call
    assert len(m.warmup_ns) == 2


def test_time_spent_in_hooks_is_not_the_budgets():
    """Loading inputs and checking outputs lie outside the timed region and the budget."""
    hooks = _NumberingHooks(pause_s=0.03)
    config = TimingConfig(
        warmup=0, min_samples=5, max_samples=10, budget_s=0.05, target_rel_ci=0.0, cold_cache=False
    )
    m = measure(lambda: "out", config=config, hooks=hooks)
    assert len(m.samples_ns) == 10  # 0.3 s in hooks, a budget of 0.05 s never spent
    assert m.stop_reason == "max_samples"
