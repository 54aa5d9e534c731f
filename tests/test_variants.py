"""Attention variants: keyword validation, claims, the oracle's definitions, FP8 and HND storage."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.conformance.strategies import attention_variants
from harness.core.contract import Capabilities, LayerCache
from harness.core.errors import CacheBindingError, Unsupported
from harness.core.kv_pages import make_layer_caches, read_tokens, write_tokens
from harness.core.registry import default_registry
from harness.core.variants import AttentionVariant, alibi_slopes_for, quantize
from harness.numerics.cache_readback import write_problem
from harness.numerics.canary import changed_slots, snapshot
from harness.numerics.oracle import SequenceKV, oracle_attention
from harness.numerics.scenario import Scenario, backend_for, make_step_inputs
from reference_backends.reference import ReferenceBackend
from reference_backends.sdpa import SdpaBackend

ARGS = {"num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "scale": 0.5}


@pytest.mark.parametrize(
    ("keyword", "value"),
    [
        ("sliding_window", 0),
        ("sliding_window", -1),
        ("sliding_window", True),
        ("sliding_window", 2.5),
        ("logits_soft_cap", float("nan")),
        ("logits_soft_cap", float("inf")),
        ("logits_soft_cap", 0.0),
        ("logits_soft_cap", -5.0),
        ("logits_soft_cap", "30"),
        ("sinks", torch.zeros(3)),
        ("sinks", torch.zeros(4, 1)),
        ("sinks", torch.tensor([0.0, float("nan"), 0.0, 0.0])),
        ("alibi_slopes", [0.5, 0.25]),
        ("alibi_slopes", 0.5),
        ("kv_cache_dtype", "fp8"),
        ("kv_cache_dtype", "int8"),
        ("k_scale", 0.0),
        ("k_scale", -1.0),
        ("v_scale", float("nan")),
        ("v_scale", float("inf")),
    ],
)
def test_bad_variant_keyword_is_a_value_error_naming_it(keyword, value):
    with pytest.raises(ValueError, match=keyword):
        ReferenceBackend(**ARGS, **{keyword: value})


def test_variant_keywords_are_normalised():
    backend = ReferenceBackend(
        **ARGS, sinks=torch.tensor([1.0, 2.0, 3.0, 4.0]), alibi_slopes=[0.5, 0.25, 0.125, 0.0625]
    )
    assert backend.variant.sinks == (1.0, 2.0, 3.0, 4.0)
    assert backend.variant.alibi_slopes == (0.5, 0.25, 0.125, 0.0625)
    assert hash(backend.variant)


class PlainBackend(ReferenceBackend):
    """A backend that claims no variant."""

    @classmethod
    def capabilities(cls) -> Capabilities:
        return Capabilities()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"sliding_window": 4},
        {"logits_soft_cap": 30.0},
        {"sinks": torch.zeros(4)},
        {"alibi_slopes": torch.ones(4)},
        {"kv_cache_dtype": "fp8_e4m3", "k_scale": 0.5},
    ],
)
def test_an_unclaimed_variant_is_unsupported(kwargs):
    with pytest.raises(Unsupported, match="unsupported"):
        PlainBackend(**ARGS, **kwargs)


def test_sdpa_refuses_soft_cap_it_cannot_express():
    with pytest.raises(Unsupported, match="logits_soft_cap"):
        SdpaBackend(**ARGS, logits_soft_cap=30.0)


def _caches(**kwargs) -> list[LayerCache]:
    args = dict(num_layers=1, total_pages=4, page_size=2, num_kv_heads=2, head_dim=8)
    return make_layer_caches(**(args | kwargs))


def test_an_hnd_cache_for_a_backend_that_did_not_claim_it_is_unsupported():
    with pytest.raises(Unsupported, match="HND"):
        PlainBackend(**ARGS).bind_kv_caches(_caches(cache_layout="HND"))


def test_fp8_cache_and_kv_cache_dtype_must_agree():
    with pytest.raises(CacheBindingError, match="kv_cache_dtype"):
        ReferenceBackend(**ARGS).bind_kv_caches(_caches(dtype=torch.float8_e4m3fn))
    fp8 = ReferenceBackend(**ARGS, kv_cache_dtype="fp8_e5m2")
    with pytest.raises(CacheBindingError, match="float8_e5m2"):
        fp8.bind_kv_caches(_caches(dtype=torch.float8_e4m3fn))
    fp8.bind_kv_caches(_caches(dtype=torch.float8_e5m2))


def test_unsupported_reason_names_each_variant():
    caps = Capabilities()
    assert caps.unsupported_reason() is None
    assert "sliding_window" in caps.unsupported_reason(sliding_window=True)
    assert "logits_soft_cap" in caps.unsupported_reason(soft_cap=True)
    assert "sinks" in caps.unsupported_reason(sinks=True)
    assert "alibi" in caps.unsupported_reason(alibi=True)
    assert "fp8_e4m3" in caps.unsupported_reason(kv_cache_dtype="fp8_e4m3")
    assert "HND" in caps.unsupported_reason(cache_layout="HND")
    assert "out=" in caps.unsupported_reason(out_buffer=True)
    assert "forward_with_lse" in caps.unsupported_reason(lse=True)


# -- storage ---------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float8_e4m3fn, torch.float8_e5m2])
def test_write_then_read_round_trips_in_every_layout_and_dtype(layout, dtype):
    (cache,) = _caches(cache_layout=layout, dtype=dtype, combined_kv=True)
    key, value = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    slots = torch.tensor([5, 0, 2])  # pages 2, 0, 1
    write_tokens(cache, slots, key, value, k_scale=0.5, v_scale=2.0)
    got_k, _ = read_tokens(cache, [2, 0, 1], 6)
    expect = key if dtype == torch.float32 else quantize(key, 0.5, dtype)
    assert torch.equal(got_k[[1, 2, 4]].float(), expect.float())  # slots 5, 0, 2 on pages 2, 0, 1
    if layout == "HND":
        assert cache.key.shape == (4, 2, 2, 8)
        assert cache.page_size == 2
        assert cache.num_kv_heads == 2


def test_fp8_write_check_catches_an_inverted_scale_and_passes_a_correct_one():
    variant = AttentionVariant(kv_cache_dtype="fp8_e4m3", k_scale=0.25, v_scale=4.0)
    (cache,) = _caches(dtype=torch.float8_e4m3fn)
    key, value = torch.randn(2, 2, 8), torch.randn(2, 2, 8)
    slots = torch.tensor([1, -1])
    write_tokens(cache, slots[:1], key[:1], value[:1], k_scale=0.25, v_scale=4.0)
    assert write_problem(cache, slots, key, value, variant) is None
    write_tokens(cache, slots[:1], key[:1], value[:1], k_scale=4.0, v_scale=4.0)
    problem = write_problem(cache, slots, key, value, variant)
    assert problem is not None
    assert "key" in problem
    assert "k_scale" in problem


def test_out_buffer_of_the_wrong_shape_is_refused_before_anything_is_written():
    scenario = Scenario(context_lens=(5,), query_lens=(2,))
    inputs = make_step_inputs(scenario)
    backend = backend_for(default_registry().entry("reference"), scenario)
    backend.bind_kv_caches(inputs.caches)
    backend.prepare(inputs.step.metadata)
    before = snapshot(inputs.caches)
    with pytest.raises(ValueError, match="out is"):
        backend.forward(*inputs.forward_args(0), 0, out=torch.empty(1, 4, 16))
    assert not any(changed_slots(inputs.caches, before))


# -- the oracle's definitions -----------------------------------------------------------


def _one_sequence(q_len=3, length=9, heads=2, kv_heads=1, dim=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(q_len, heads, dim, generator=gen, dtype=torch.float64)
    k = torch.randn(length, kv_heads, dim, generator=gen, dtype=torch.float64)
    v = torch.randn(length, kv_heads, dim, generator=gen, dtype=torch.float64)
    return q, SequenceKV(k, v)


def _by_hand(q, seq, scale, variant, causal=True):
    """The contract's formulas, one (query, head) at a time in plain Python floats."""
    q_len, heads, _ = q.shape
    length = seq.length
    out = torch.zeros_like(q)
    lse = torch.zeros(q_len, heads, dtype=torch.float64)
    for j in range(q_len):
        pos = length - q_len + j
        for h in range(heads):
            logits, values = [], []
            for key in range(length):
                if causal and key > pos:
                    continue
                window = variant.sliding_window
                if window is not None and not pos - window < key:
                    continue  # before the window
                if window is not None and not causal and key >= pos + window:
                    continue  # past a non-causal (two-sided) window
                x = scale * float(q[j, h] @ seq.key[key, 0])
                if variant.logits_soft_cap is not None:
                    x = variant.logits_soft_cap * math.tanh(x / variant.logits_soft_cap)
                if variant.alibi_slopes is not None:
                    x += variant.alibi_slopes[h] * (key - pos)
                logits.append(x)
                values.append(seq.value[key, 0])
            sink = [variant.sinks[h]] if variant.sinks is not None else []
            top = max(logits + sink)
            weights = [math.exp(x - top) for x in logits]
            total = sum(weights) + sum(math.exp(s - top) for s in sink)
            out[j, h] = sum(w * v for w, v in zip(weights, values, strict=True)) / total
            lse[j, h] = top + math.log(total)
    return out, lse


@pytest.mark.parametrize(
    "variant",
    [
        AttentionVariant(),
        AttentionVariant(sliding_window=1),
        AttentionVariant(sliding_window=3),
        AttentionVariant(logits_soft_cap=0.7),
        AttentionVariant(sinks=(2.0, -1.0)),
        AttentionVariant(alibi_slopes=(0.5, -0.25)),
        AttentionVariant(
            sliding_window=4, logits_soft_cap=2.0, sinks=(0.5, 3.0), alibi_slopes=(1.0, 0.1)
        ),
    ],
    ids=lambda v: v.describe() or "plain",
)
@pytest.mark.parametrize("causal", [True, False])
def test_oracle_follows_the_contracts_formulas(variant, causal):
    q, seq = _one_sequence()
    exact = oracle_attention(q, [seq], [3], scale=0.6, causal=causal, variant=variant)
    out, lse = _by_hand(q, seq, 0.6, variant, causal)
    assert torch.allclose(exact.output, out, atol=1e-12)
    assert torch.allclose(exact.lse, lse, atol=1e-12)


def test_a_dominant_sink_takes_the_weight_and_adds_no_value():
    q, seq = _one_sequence()
    exact = oracle_attention(q, [seq], [3], scale=0.6, variant=AttentionVariant(sinks=(60.0, 60.0)))
    assert exact.output.abs().max() < 1e-15


def test_standard_alibi_slopes():
    assert alibi_slopes_for(8) == tuple(2.0 ** (-(h + 1)) for h in range(8))
    assert len(alibi_slopes_for(12)) == 12


# -- strategies draw only inside the claim ---------------------------------------------


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_variants_are_drawn_only_inside_the_claim(data):
    caps = Capabilities(sliding_window=True, kv_cache_dtypes=("auto", "fp8_e5m2"))
    variant = data.draw(attention_variants(caps, 4))
    assert variant.logits_soft_cap is None
    assert variant.sinks is None
    assert variant.alibi_slopes is None
    assert variant.kv_cache_dtype in ("auto", "fp8_e5m2")


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_a_backend_claiming_no_variant_always_gets_plain_attention(data):
    assert data.draw(attention_variants(Capabilities(), 4)).is_plain


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_an_fp8_only_claim_always_gets_an_fp8_cache(data):
    variant = data.draw(attention_variants(Capabilities(kv_cache_dtypes=("fp8_e4m3",)), 4))
    assert variant.kv_cache_dtype == "fp8_e4m3"
