"""A NaN's hint says what the step allowed, not a fixed guess."""

from __future__ import annotations

from harness.core.variants import AttentionVariant
from harness.numerics.nan_evidence import nonfinite_evidence
from harness.numerics.scenario import Scenario, make_step_inputs


def _poisoned(s: Scenario, row_token: int = 0) -> str:
    inputs = make_step_inputs(s)
    oracle, _ = inputs.reference(0)
    output = oracle.output.clone()
    output[row_token] = float("nan")
    return nonfinite_evidence(inputs, 0, output)


def test_a_ragged_last_page_is_named_as_reachable_nan():
    s = Scenario(page_size=4, context_lens=(5, 8), query_lens=(1, 1), num_layers=1)
    words = _poisoned(s)
    assert "in 1 of 2 sequences (rows 0)" in words
    assert "the last page of 1 of them holds NaN past the sequence's end" in words
    assert "no overflow explains it" in words


def test_strided_inputs_are_named_as_reachable_nan():
    s = Scenario(page_size=4, context_lens=(8,), query_lens=(1,), noncontiguous=True)
    assert "strided views whose gaps hold NaN" in _poisoned(s)


def test_with_nothing_reachable_the_kernels_arithmetic_is_named():
    capped = AttentionVariant(logits_soft_cap=1.0)
    s = Scenario(
        page_size=4,
        context_lens=(8,),
        query_lens=(1,),
        num_layers=1,
        magnitude=30.0,
        variant=capped,
    )
    words = _poisoned(s)
    assert "no NaN lay within reach of an in-bounds read" in words
    assert "|logit / soft_cap| reaches" in words
    assert "inf / inf = NaN with no bad read" in words


def test_massive_float16_values_name_an_unnormalised_sum():
    import torch

    s = Scenario(
        page_size=4,
        context_lens=(8,),
        query_lens=(1,),
        num_layers=1,
        dtype=torch.float16,
        values="massive-v",
    )
    assert "an unnormalised weighted sum" in _poisoned(s)
