"""The no-paging peer computes the contract's attention, on SDPA's fast path.

The peer is the denominator of every benchmark ratio, so it must be right
(checked here against the float64 oracle, in float64 so that any masking or
GQA mistake is far above rounding) and it must not fall off SDPA's fused
kernels on a GPU: a bottom-right causal block where the query is shorter
than the context is handed to SDPA as torch's ``causal_lower_right`` bias,
which runs the flash kernel, instead of a boolean mask, which rules it out.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import CausalBias, CausalVariant

from harness.bench.peer import ContiguousPeer
from harness.numerics.scenario import Scenario, StepInputs, check_outputs, make_step_inputs

GEOMETRY = dict(head_dim=16, page_size=4, total_pages=64, num_layers=1)
# (name, context_lens, query_lens, causal)
BATCHES = [
    ("decode", (9, 5, 13, 4), (1, 1, 1, 1), True),
    ("prefill", (6, 6, 11), (6, 6, 11), True),
    ("extend", (11, 11, 19), (4, 4, 7), True),
    ("mixed", (1, 13, 8, 21, 6, 8), (1, 13, 3, 1, 6, 3), True),
    ("non-causal extend", (11, 7, 9), (4, 7, 1), False),
]
HEADS = [(8, 2), (6, 1), (4, 4)]  # GQA, MQA, one KV head per query head


def _inputs(contexts, queries, causal, heads, dtype=torch.float64, seed=0) -> StepInputs:
    num_heads, num_kv_heads = heads
    return make_step_inputs(
        Scenario(
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            context_lens=contexts,
            query_lens=queries,
            causal=causal,
            dtype=dtype,
            seed=seed,
            **GEOMETRY,
        )
    )


def _peer_output(inputs: StepInputs) -> torch.Tensor:
    peer = ContiguousPeer(inputs)
    return peer.assemble(peer())


@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"H{h[0]}-KV{h[1]}")
@pytest.mark.parametrize(
    ("contexts", "queries", "causal"),
    [b[1:] for b in BATCHES],
    ids=[b[0] for b in BATCHES],
)
def test_peer_equals_the_float64_oracle(contexts, queries, causal, heads):
    inputs = _inputs(contexts, queries, causal, heads)
    exact, _ = inputs.reference(0)
    out = _peer_output(inputs)
    assert out.dtype == torch.float64
    assert exact.checked.all()
    torch.testing.assert_close(out, exact.output, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_peer_passes_the_suites_bound_in_every_dtype(dtype):
    inputs = _inputs((1, 13, 8, 21, 6, 8), (1, 13, 3, 1, 6, 3), True, (8, 2), dtype=dtype)
    (comparison,) = check_outputs(inputs, [_peer_output(inputs)])
    assert comparison.passed, comparison.describe()


def test_extend_rows_get_a_lower_right_bias_prompts_is_causal_decode_no_mask():
    inputs = _inputs((1, 13, 8, 21, 6, 8), (1, 13, 3, 1, 6, 3), True, (8, 2))
    groups = {(g.query.shape[2], g.key.shape[2]): g for g in ContiguousPeer(inputs).groups}
    assert set(groups) == {(1, 1), (13, 13), (3, 8), (1, 21), (6, 6)}
    extend = groups[(3, 8)]
    assert extend.query.shape[0] == 2  # both q=3 / L=8 rows share one call
    assert isinstance(extend.mask, CausalBias)
    assert extend.mask.variant == CausalVariant.LOWER_RIGHT
    assert (extend.mask.seq_len_q, extend.mask.seq_len_kv) == (3, 8)
    visible = extend.mask._materialize()
    assert visible[0].tolist() == [True] * 6 + [False] * 2  # position 5 sees keys 0..5
    assert visible[-1].all()
    assert not extend.is_causal
    for shape in ((13, 13), (6, 6)):
        assert groups[shape].is_causal
        assert groups[shape].mask is None
    for shape in ((1, 1), (1, 21)):
        assert not groups[shape].is_causal
        assert groups[shape].mask is None


def test_non_causal_rows_get_no_mask():
    inputs = _inputs((11, 7), (4, 7), False, (8, 2))
    for group in ContiguousPeer(inputs).groups:
        assert group.mask is None
        assert not group.is_causal


@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"H{h[0]}-KV{h[1]}")
def test_bias_means_what_the_boolean_mask_meant(heads):
    """Same output as the explicit ``tril(L - q)`` boolean mask the peer used before."""
    inputs = _inputs((11, 11, 19), (4, 4, 7), True, heads)
    peer = ContiguousPeer(inputs)
    for group, result in zip(peer.groups, peer(), strict=True):
        q, length = group.query.shape[2], group.key.shape[2]
        boolean = torch.ones(q, length, dtype=torch.bool).tril(length - q)
        expected = F.scaled_dot_product_attention(
            group.query,
            group.key,
            group.value,
            attn_mask=boolean,
            scale=peer.scale,
            enable_gqa=peer.gqa,
        )
        torch.testing.assert_close(result, expected, rtol=0, atol=1e-12)
