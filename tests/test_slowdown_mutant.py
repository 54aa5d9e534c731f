"""The planted slowdown the gate is checked with: same outputs as ``sdpa``, only slower."""

from __future__ import annotations

import time

import pytest
import torch

from harness.numerics.scenario import Scenario, run_scenario
from reference_backends.sdpa import SdpaBackend
from suites.mutants.slowdown import ENV, SlowedSdpa, slowdown_fraction


def _outputs(backend_cls: type[SdpaBackend]) -> list[torch.Tensor]:
    scenario = Scenario(context_lens=(40, 70), query_lens=(1, 30))

    def make(s: Scenario) -> SdpaBackend:
        return backend_cls(
            num_heads=s.num_heads,
            num_kv_heads=s.num_kv_heads,
            head_dim=s.head_dim,
            scale=s.softmax_scale,
        )

    _, outputs = run_scenario(make, scenario)
    return list(outputs)


def test_the_slowed_copy_returns_exactly_what_sdpa_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "0.5")
    for slowed, plain in zip(_outputs(SlowedSdpa), _outputs(SdpaBackend), strict=True):
        assert torch.equal(slowed, plain)


def _clock_readings(monkeypatch: pytest.MonkeyPatch, fraction: str) -> int:
    """Readings of a fake clock that advances 1000 ns per reading, over one scenario."""
    clock = iter(range(0, 10**12, 1000))
    count = 0

    def fake_ns() -> int:
        nonlocal count
        count += 1
        return next(clock)

    monkeypatch.setenv(ENV, fraction)
    monkeypatch.setattr(time, "perf_counter_ns", fake_ns)
    _outputs(SlowedSdpa)
    monkeypatch.undo()
    return count


def test_the_wait_is_the_set_fraction_of_the_forward_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the fake clock a forward "takes" 1000 ns; fraction 4 waits 4000 ns more.

    Per forward: start, end, then spin readings up to the deadline: one with
    fraction 0 (already past it), four with fraction 4 (1000 ns apiece).
    """
    none = _clock_readings(monkeypatch, "0")
    quadruple = _clock_readings(monkeypatch, "4.0")
    forwards = none // 3
    assert forwards > 0
    assert none == 3 * forwards
    assert quadruple == 6 * forwards


@pytest.mark.parametrize("value", ["abc", "-0.1", "11"])
def test_a_bad_fraction_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(ENV, value)
    with pytest.raises(ValueError, match=ENV):
        slowdown_fraction()
