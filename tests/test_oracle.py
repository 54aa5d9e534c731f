"""The float64 oracle and the dtype tolerance: checked against independent computations."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from harness.numerics.oracle import SequenceKV, naive_attention, oracle_attention
from harness.numerics.tolerance import compare, error_bound, unit_roundoff

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _seq(length: int, kv_heads: int, dim: int, seed: int, dtype=torch.float64) -> SequenceKV:
    gen = torch.Generator().manual_seed(seed)
    shape = (length, kv_heads, dim)
    return SequenceKV(
        torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype)
    )


def test_hand_computed_single_query():
    seq = SequenceKV(torch.tensor([[[0.0]], [[1.0]]]), torch.tensor([[[1.0]], [[3.0]]]))
    out = oracle_attention(torch.tensor([[[1.0]]]), [seq], [1], scale=1.0).output
    expected = (1.0 + math.e * 3.0) / (1.0 + math.e)
    assert out.item() == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (8, 2), (6, 1)])
def test_prefill_matches_sdpa_in_float64(heads, kv_heads):
    seq = _seq(11, kv_heads, 8, seed=1)
    query = torch.randn(11, heads, 8, dtype=torch.float64)
    out = oracle_attention(query, [seq], [11], scale=0.3, causal=True).output
    expected = F.scaled_dot_product_attention(
        query.transpose(0, 1),
        seq.key.transpose(0, 1),
        seq.value.transpose(0, 1),
        is_causal=True,
        scale=0.3,
        enable_gqa=True,
    ).transpose(0, 1)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_extend_is_bottom_right_causal():
    """Query j of an extend step sits at position L - q + j and sees keys 0..L-q+j."""
    seq = _seq(10, 1, 4, seed=2)
    query = torch.randn(3, 1, 4, dtype=torch.float64)
    out = oracle_attention(query, [seq], [3], scale=0.5, causal=True).output
    for j in range(3):
        visible = 10 - 3 + j + 1
        alone = oracle_attention(
            query[j : j + 1], [SequenceKV(seq.key[:visible], seq.value[:visible])], [1], scale=0.5
        ).output
        torch.testing.assert_close(out[j], alone[0], rtol=0, atol=1e-14)


def test_non_causal_sees_every_key():
    seq = _seq(6, 2, 4, seed=3)
    query = torch.randn(2, 2, 4, dtype=torch.float64)
    out = oracle_attention(query, [seq], [2], scale=0.5, causal=False).output
    for j in range(2):
        alone = oracle_attention(query[j : j + 1], [seq], [1], scale=0.5).output
        torch.testing.assert_close(out[j], alone[0], rtol=0, atol=1e-14)


def test_padding_rows_are_not_checked_and_ragged_rows_are_independent():
    a, b = _seq(5, 1, 4, seed=4), _seq(3, 1, 4, seed=5)
    query = torch.randn(4, 1, 4, dtype=torch.float64)
    result = oracle_attention(query, [a, None, b], [2, 1, 1], scale=1.0)
    assert result.checked.tolist() == [True, True, False, True]
    alone = oracle_attention(query[3:], [b], [1], scale=1.0).output
    torch.testing.assert_close(result.output[3], alone[0], rtol=0, atol=0)


def test_large_logits_stay_finite():
    seq = _seq(8, 1, 4, seed=6)
    query = torch.full((1, 1, 4), 1e4, dtype=torch.float64)
    result = oracle_attention(query, [seq], [1], scale=10.0)
    assert torch.isfinite(result.output).all()
    assert result.logit_scale.item() > 1e4


def test_error_scales():
    key = torch.tensor([[[1.0, -2.0]], [[3.0, 0.5]]])
    value = torch.tensor([[[3.0, 4.0]], [[0.0, 1.0]]])
    query = torch.tensor([[[1.0, 1.0]], [[2.0, -1.0]]])
    result = oracle_attention(query, [SequenceKV(key, value)], [2], scale=0.5)
    # token 0 (position 0) sees key 0 only; token 1 sees both.
    assert result.value_scale[:, 0].tolist() == [5.0, 5.0]
    assert result.logit_scale[:, 0].tolist() == [0.5 * 3.0, 0.5 * max(4.0, 6.5)]


def test_query_lens_must_cover_query():
    with pytest.raises(ValueError, match="query_lens sum"):
        oracle_attention(torch.ones(3, 1, 2), [_seq(3, 1, 2, 0)], [2], scale=1.0)


def _case(dtype: torch.dtype, seed: int = 0):
    seqs = [_seq(9, 2, 16, seed, dtype), _seq(4, 2, 16, seed + 1, dtype)]
    query = torch.randn(5, 4, 16, generator=torch.Generator().manual_seed(seed)).to(dtype)
    args = (query, seqs, [3, 2])
    return oracle_attention(*args, scale=0.25), naive_attention(*args, scale=0.25)


NAIVE_ROUNDINGS = 4.0  # a handful of roundings of size u, each of at most max ||v_j||


def _norm_error(output: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    return (output.double() - exact).norm(dim=-1)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_naive_is_within_a_few_unit_roundoffs_of_the_oracle(dtype: torch.dtype, seed: int):
    """The yardstick is itself accurate: ``||naive - exact|| <= 4 u max_j ||v_j||``.

    The output is a convex combination of the ``v_j``; rounding the probabilities and the
    output to the dtype, and fp32 logits, move it by a few ``u max ||v_j||`` (measured: at
    most 0.9u in fp16/bf16, 2.7u in fp32 over 30 seeds). A 10% scale error, or an fp32
    path that rounds the probabilities to bf16, lands far outside.
    """
    exact, naive = _case(dtype, seed)
    error = _norm_error(naive, exact.output)
    allowed = NAIVE_ROUNDINGS * unit_roundoff(dtype) * exact.value_scale
    assert (error <= allowed).all(), float((error / allowed).max())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_naive_rounds_the_probabilities_to_the_dtype(dtype: torch.dtype):
    """Naive is worse than the oracle rounded once: it computes P.V from 16-bit probabilities.

    Were it to keep them in fp32 it would equal the rounded oracle output (it then does,
    element for element) and stop measuring what a same-dtype kernel loses; rounding the
    probabilities adds 20-45% to the total error in this case.
    """
    exact, naive = _case(dtype, seed=5)
    rounded = exact.output.to(dtype)
    assert not torch.equal(naive, rounded)
    naive_error = _norm_error(naive, exact.output).sum()
    rounded_error = _norm_error(rounded, exact.output).sum()
    assert rounded_error > 0
    assert naive_error > 1.1 * rounded_error


@pytest.mark.parametrize("dtype", DTYPES)
def test_rounded_exact_output_passes(dtype):
    exact, naive = _case(dtype, seed=3)
    result = compare(exact.output.to(dtype), exact, naive, dtype)
    assert result.passed
    assert result.worst_ratio < 1.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_perturbation_beyond_bound_fails_and_is_located(dtype):
    exact, naive = _case(dtype, seed=4)
    bad = exact.output.clone()
    bound = error_bound(exact, (naive.double() - exact.output).norm(dim=-1), dtype)
    bad[2, 1, 0] += 3 * float(bound[2, 1])
    result = compare(bad, exact, naive, dtype)
    assert not result.passed
    assert (result.worst_token, result.worst_head) == (2, 1)
    assert "EXCEEDS" in result.describe()


def test_nan_output_fails():
    exact, naive = _case(torch.float32)
    bad = exact.output.float().clone()
    bad[4, 3, 7] = float("nan")
    result = compare(bad, exact, naive, torch.float32)
    assert not result.passed
    assert result.nonfinite == 1
    assert (result.worst_token, result.worst_head) == (4, 3)


def test_wrong_shape_is_an_error():
    exact, naive = _case(torch.float32)
    with pytest.raises(ValueError, match="shape"):
        compare(exact.output[:, :2], exact, naive, torch.float32)


def test_nothing_checked_is_not_a_pass():
    query = torch.randn(2, 1, 4)
    exact = oracle_attention(query, [None], [2], scale=1.0)
    naive = naive_attention(query, [None], [2], scale=1.0)
    result = compare(query, exact, naive, torch.float32)
    assert not result.passed
    assert result.checked_tokens == 0


def test_bound_widens_with_lower_precision():
    assert (
        unit_roundoff(torch.float32) < unit_roundoff(torch.float16) < unit_roundoff(torch.bfloat16)
    )
    bounds = []
    for dtype in DTYPES:
        exact, _ = _case(torch.float32, seed=7)
        bounds.append(error_bound(exact, torch.zeros(5, 4, dtype=torch.float64), dtype))
    assert (bounds[0] < bounds[1]).all()
    assert (bounds[1] < bounds[2]).all()


def test_float32_bound_is_tight_enough_to_see_one_wrong_key():
    """Dropping one key of 64 moves the output far beyond the fp32 bound."""
    seq = _seq(64, 1, 16, seed=8, dtype=torch.float32)
    query = torch.randn(1, 1, 16)
    exact = oracle_attention(query, [seq], [1], scale=0.25)
    naive = naive_attention(query, [seq], [1], scale=0.25)
    dropped = naive_attention(query, [SequenceKV(seq.key[:-1], seq.value[:-1])], [1], scale=0.25)
    assert not compare(dropped, exact, naive, torch.float32).passed


def test_rounding_scale_is_the_probability_weighted_value_norm():
    """``sqrt(sum_j p_j^2 ||v_j||^2)``: one key gives ``||v||``, L even keys ``||v|| / sqrt(L)``."""
    value = torch.tensor([[[3.0, 4.0]], [[0.0, 5.0]], [[5.0, 0.0]], [[4.0, 3.0]]])
    key = torch.zeros(4, 1, 2)  # equal logits: uniform attention
    result = oracle_attention(torch.ones(1, 1, 2), [SequenceKV(key, value)], [1], scale=1.0)
    assert result.rounding_scale.item() == pytest.approx(5.0 / 2.0, rel=1e-12)
    single = oracle_attention(torch.ones(1, 1, 2), [SequenceKV(key[:1], value[:1])], [1], scale=1.0)
    assert single.rounding_scale.item() == pytest.approx(5.0, rel=1e-12)


def test_grouped_heads_match_a_per_head_computation():
    """GQA folded into ``[KV, group*q, D]`` equals expanding K/V to every query head."""
    seq = _seq(13, 2, 8, seed=11)
    query = torch.randn(5, 6, 8, dtype=torch.float64)
    result = oracle_attention(query, [seq], [5], scale=0.7)
    for head in range(6):
        kv = head // 3
        alone = oracle_attention(
            query[:, head : head + 1],
            [SequenceKV(seq.key[:, kv : kv + 1], seq.value[:, kv : kv + 1])],
            [5],
            scale=0.7,
        )
        torch.testing.assert_close(result.output[:, head], alone.output[:, 0], rtol=0, atol=1e-14)
        torch.testing.assert_close(result.rounding_scale[:, head], alone.rounding_scale[:, 0])


def test_the_logit_term_grows_with_the_root_of_the_head_dim():
    """A logit is an fp32 sum over D products: its term is 2 sqrt(D) u32 v_max s_max, as a
    kernel summing each logit in head-dim order rounds (vLLM's CPU kernel in fp32 reached
    1.10x at D=256 with massive-qk values when charged sqrt(D / 16))."""
    from harness.numerics.oracle import OracleOutput

    u32 = 2.0**-24

    def bound(head_dim: int) -> float:
        exact = OracleOutput(
            output=torch.zeros(1, 1, head_dim, dtype=torch.float64),  # no rounding term
            value_scale=torch.full((1, 1), 3.0, dtype=torch.float64),
            logit_scale=torch.full((1, 1), 50.0, dtype=torch.float64),
            rounding_scale=torch.zeros(1, 1, dtype=torch.float64),
            checked=torch.ones(1, dtype=torch.bool),
        )
        return float(error_bound(exact, torch.zeros(1, 1, dtype=torch.float64), torch.float32))

    sums = 3 * 4 * u32 * 3.0  # 3 sqrt(16) u32 v_max: one key counted as 16
    for head_dim, root in ((4, 2.0), (16, 4.0), (64, 8.0), (256, 16.0)):
        assert bound(head_dim) == pytest.approx(sums + 2 * root * u32 * 3.0 * 50.0, rel=1e-12)


@pytest.mark.parametrize("variant", ["plain", "sinks+alibi+window"])
def test_rows_of_one_shape_are_stacked_as_if_each_ran_alone(variant):
    """Equal-shape rows share one computation; every field equals the row computed alone."""
    from harness.core.variants import AttentionVariant, alibi_slopes_for

    gen = torch.Generator().manual_seed(7)
    heads, kv_heads, dim = 4, 2, 8
    chosen = AttentionVariant()
    if variant != "plain":
        chosen = AttentionVariant(
            sliding_window=3, sinks=(0.5, -1.0, 2.0, 0.0), alibi_slopes=alibi_slopes_for(heads)
        )
    lengths, query_lens = [6, 6, 9, 6, 9], [2, 2, 1, 2, 1]
    sequences = [
        SequenceKV(
            torch.randn(n, kv_heads, dim, generator=gen, dtype=torch.float64),
            torch.randn(n, kv_heads, dim, generator=gen, dtype=torch.float64),
        )
        for n in lengths
    ]
    query = torch.randn(sum(query_lens), heads, dim, generator=gen, dtype=torch.float64)
    together = oracle_attention(query, sequences, query_lens, scale=0.3, variant=chosen)
    start = 0
    for seq, q_len in zip(sequences, query_lens, strict=True):
        alone = oracle_attention(
            query[start : start + q_len], [seq], [q_len], scale=0.3, variant=chosen
        )
        for name in ("output", "value_scale", "logit_scale", "rounding_scale", "lse"):
            mine = getattr(together, name)[start : start + q_len]
            torch.testing.assert_close(mine, getattr(alone, name), rtol=1e-12, atol=1e-12)
        start += q_len
