"""Real-model value regimes: each overflows the intermediate it names in float16 while the
answer fits, correct kernels pass it, and the planted bugs that keep that intermediate in
the storage dtype fail it (and only it)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from harness.conformance.properties import check_matches_oracle
from harness.conformance.step_strategies import scenarios
from harness.core.contract import Capabilities
from harness.core.errors import PropertyFailure
from harness.core.registry import BackendEntry, default_registry
from harness.numerics.scenario import Scenario, make_step_inputs
from harness.numerics.value_regimes import (
    QK_OUTLIER,
    V_OUTLIER,
    VALUE_REGIMES,
    regime_magnitude,
    regime_scale,
)
from suites.mutants.values import (
    AccumulatorInStorageDtype,
    DefaultScalePastOneSplit,
    RawScoresInStorageDtype,
    ScoresInStorageDtype,
)

FP16_MAX = torch.finfo(torch.float16).max


def step(regime: str, dtype: torch.dtype = torch.float16, **kwargs) -> Scenario:
    s = Scenario(
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        page_size=16,
        total_pages=48,
        num_layers=1,
        context_lens=(300, 40),
        query_lens=(1, 40),
        dtype=dtype,
        values=regime,
        seed=5,
        **kwargs,
    )
    return replace(
        s,
        magnitude=regime_magnitude(regime, s.magnitude),
        scale=regime_scale(regime, s.head_dim, s.softmax_scale),
    )


def raw_scores(s: Scenario) -> torch.Tensor:
    """Every raw ``q.k`` of the first sequence's query and keys, in float32."""
    inputs = make_step_inputs(s)
    key = inputs.sequences[0][0].key.float()  # [L, KV, D]
    query = inputs.queries[0][0].float()  # [H, D]
    group = s.num_heads // s.num_kv_heads
    return torch.einsum("hd,lhd->hl", query, key.repeat_interleave(group, dim=1))


def test_massive_qk_puts_every_raw_dot_product_past_float16():
    s = step("massive-qk")
    inputs = make_step_inputs(s)
    assert torch.isfinite(inputs.queries[0]).all()
    assert (raw_scores(s).abs() > FP16_MAX).all()
    assert QK_OUTLIER**2 < FP16_MAX  # each product fits; their sum does not


def test_massive_v_keeps_the_output_in_range_but_not_an_unnormalised_sum():
    s = step("massive-v")
    inputs = make_step_inputs(s)
    exact = inputs.reference(0)[0].output
    assert exact.abs().max() <= FP16_MAX
    assert exact.abs().max() > V_OUTLIER / 2  # the massive channel carries through
    assert 2 * V_OUTLIER > FP16_MAX  # two keys of similar weight overflow an unnormalised sum
    assert torch.tensor(V_OUTLIER, dtype=torch.float16).item() == V_OUTLIER


def test_tiny_scale_keeps_the_logits_small_and_the_raw_dots_large():
    s = step("tiny-scale")
    raw = raw_scores(s)
    assert raw.abs().max() > FP16_MAX
    assert (raw * s.softmax_scale).abs().max() < 20
    assert s.softmax_scale < 1e-3 / math.sqrt(s.head_dim)


@pytest.mark.parametrize("regime", VALUE_REGIMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["reference", "sdpa"])
def test_correct_backends_pass_every_regime(name, dtype, regime):
    entry = default_registry().entry(name)
    check_matches_oracle(entry, step(regime, dtype))


PLANTED = [
    (RawScoresInStorageDtype, "massive-qk"),
    (ScoresInStorageDtype, "massive-qk"),
    (AccumulatorInStorageDtype, "massive-v"),
    (DefaultScalePastOneSplit, "tiny-scale"),
]


@pytest.mark.parametrize(("cls", "regime"), PLANTED, ids=[c.__name__ for c, _ in PLANTED])
def test_each_planted_bug_fails_its_regime_and_passes_plain_values(cls, regime):
    entry = BackendEntry(cls.__name__, cls, "test")
    with pytest.raises(PropertyFailure):
        check_matches_oracle(entry, step(regime))
    check_matches_oracle(entry, step("normal", torch.float32))


def test_the_accumulator_bug_holds_in_bfloat16():
    """bfloat16's range holds the unnormalised sum: only float16 overflows."""
    entry = BackendEntry("acc", AccumulatorInStorageDtype, "test")
    check_matches_oracle(entry, step("massive-v", torch.bfloat16))


def test_the_strategies_draw_every_regime():
    drawn: list[str] = []

    @settings(
        max_examples=400,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(scenarios(Capabilities()))
    def collect(s: Scenario) -> None:
        drawn.append(s.values)

    collect()
    assert set(drawn) == set(VALUE_REGIMES)
    assert drawn.count("normal") > len(drawn) / 2  # plain noise stays the common draw
