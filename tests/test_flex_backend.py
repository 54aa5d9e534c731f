"""The ``flex`` backend against the float64 oracle, on the cases upstream paged flex gets wrong.

Upstream lets NaN garbage in unused cache slots reach outputs (eager: any
slot of the pool; compiled: a last page's tail), so the cases here put NaN
where a careless backend would read it: page tails, strided halves, a
per-rank pool. The compiled layout (one batch entry per row, the whole
packed buffer, zero-padded head dims) is checked with the compiled function
swapped for eager ``flex_attention``, so it runs in seconds; real
compilation is checked on CUDA when there is one.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace
from typing import ClassVar

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

import reference_backends.flex as flex
from harness import PoolLayout
from harness.core.kv_pages import pages_needed
from harness.numerics.scenario import Scenario, check_outputs, make_step_inputs, run_scenario
from reference_backends.flex import FlexBackend


def run(scenario: Scenario, backend_cls: type[FlexBackend] = FlexBackend, **kwargs) -> None:
    """Every layer of ``scenario`` on a fresh backend matches the oracle."""

    def make(s: Scenario) -> FlexBackend:
        return backend_cls(
            num_heads=s.num_heads,
            num_kv_heads=s.num_kv_heads,
            head_dim=s.head_dim,
            scale=s.softmax_scale,
            dp_size=s.dp_size,
            dp_rank=s.dp_rank,
            **kwargs,
        )

    inputs, outputs = run_scenario(make, scenario)
    for layer, check in enumerate(check_outputs(inputs, outputs)):
        assert check.checked_tokens > 0
        assert check.passed, f"layer {layer}: {check.describe()}"


@pytest.fixture
def compiled_as_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled code path, with eager ``flex_attention`` standing in for the compiled one."""
    monkeypatch.setattr(flex, "_compiled_flex", flex_attention)


MID_PAGE = Scenario(page_size=5, context_lens=(7, 13, 3, 10), query_lens=(1, 4, 3, 1))


def test_nan_page_tail_never_reaches_the_output():
    inputs = make_step_inputs(MID_PAGE)
    cache = inputs.caches[0]
    for row in inputs.step.rows:  # the tails the sequences end in are NaN before the step
        tail = row.seq_len % MID_PAGE.page_size
        if tail:
            assert cache.key[row.pages[-1] - cache.page_offset, tail:].isnan().all()
            assert cache.value[row.pages[-1] - cache.page_offset, tail:].isnan().all()
    backend = FlexBackend(num_heads=4, num_kv_heads=2, head_dim=16, scale=0.25)
    backend.bind_kv_caches(inputs.caches)
    backend.prepare(inputs.step.metadata)
    outputs = [backend.forward(*inputs.forward_args(i), i) for i in range(MID_PAGE.num_layers)]
    assert all(torch.isfinite(out).all() for out in outputs)
    assert all(check.passed for check in check_outputs(inputs, outputs))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_sequences_ending_mid_page(causal, dtype):
    run(replace(MID_PAGE, causal=causal, dtype=dtype, shuffle_pages=True))


@pytest.mark.parametrize("page_size", [1, 3, 16, 130])
def test_any_page_size(page_size):
    run(Scenario(page_size=page_size, total_pages=160, context_lens=(9, 140), query_lens=(9, 2)))


def test_strided_caches_and_inputs():
    run(replace(MID_PAGE, combined_kv=True, noncontiguous=True, num_layers=3))


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(8, 2), (12, 4), (7, 1), (3, 3)])
def test_gqa_head_map(num_heads, num_kv_heads):
    run(replace(MID_PAGE, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=13))


@pytest.mark.parametrize(("dp_size", "dp_rank"), [(2, 1), (3, 2), (8, 5)])
def test_per_rank_pool_with_page_offset(dp_size, dp_rank):
    scenario = replace(
        MID_PAGE, layout=PoolLayout.PER_RANK, dp_size=dp_size, dp_rank=dp_rank, total_pages=96
    )
    assert make_step_inputs(scenario).caches[0].page_offset > 0
    run(scenario)


def test_graph_mode_padding_rows():
    run(replace(MID_PAGE, pad_to=7, pad_query_len=2))


def test_row_without_queries_changes_nothing():
    """A row with cached tokens and no query this step: the others' outputs are as before."""
    scenario = Scenario(context_lens=(6, 9, 4), query_lens=(1, 2, 4))
    inputs = make_step_inputs(scenario)
    backend = FlexBackend(num_heads=4, num_kv_heads=2, head_dim=16, scale=0.25)
    backend.bind_kv_caches(inputs.caches)
    metadata = inputs.step.metadata
    backend.prepare(metadata)
    before = backend.forward(*inputs.forward_args(0), 0)
    keep = torch.tensor([0, 3, 4, 5, 6])  # row 1's two tokens dropped, its keys now cached
    backend.prepare(
        replace(
            metadata,
            query_start_loc=torch.tensor([0, 1, 1, 5], dtype=torch.int32),
            slot_mapping=metadata.slot_mapping[keep],
        )
    )
    query, key, value = (t[keep] for t in inputs.forward_args(0))
    torch.testing.assert_close(backend.forward(query, key, value, 0), before[keep])


def test_long_prefill_crosses_query_and_key_blocks():
    run(Scenario(page_size=7, total_pages=80, context_lens=(300, 20), query_lens=(260, 20)))


def test_eager_calls_are_cut_small(monkeypatch):
    monkeypatch.setattr(flex, "EAGER_SCORES", 200)  # a few tokens x keys per call
    scenario = Scenario(context_lens=(30, 9, 17, 5), query_lens=(12, 1, 17, 1), page_size=3)
    calls = flex._eager_calls(
        [flex._Row(0, 12, 30, 0), flex._Row(12, 1, 9, 30)], num_heads=scenario.num_heads
    )
    assert len(calls) > 2
    run(scenario)
    run(replace(scenario, causal=False))


def _dense_scores(call: list[flex._Entry], num_heads: int) -> int:
    """Scores the eager path computes for a call: every token against the entry's key span."""
    (entry,) = call
    tokens = sum(count for _, _, count in entry)
    span = entry[-1][0].lo + entry[-1][0].length - entry[0][0].lo
    return tokens * span * num_heads


def _rows(shapes: list[tuple[int, int]]) -> list[flex._Row]:
    """Consecutive rows of ``(query tokens, keys)``, keys packed back to back."""
    rows, start, lo = [], 0, 0
    for q_len, length in shapes:
        rows.append(flex._Row(start, q_len, length, lo))
        start, lo = start + q_len, lo + length
    return rows


def test_eager_calls_pack_decodes_but_not_many_prefills_into_one_square():
    heads = 8
    prefills = _rows([(64, 64)] * 128)  # one step's worth of short prompts
    calls = flex._eager_calls(prefills, heads)
    needed = sum(r.q_len * r.length * heads for r in prefills)
    computed = sum(_dense_scores(c, heads) for c in calls)
    # The n-th row joining adds about 2n x its own scores, so about 16 rows share an
    # entry (16x what they need, against 21x when only EAGER_SCORES capped an entry,
    # and 128x in a single entry): the cost of the scores balances the calls'.
    assert computed <= 17 * needed
    assert len(calls) < len(prefills) / 4  # still far fewer calls than rows
    decodes = _rows([(1, 4096)] * 64)
    assert len(flex._eager_calls(decodes, heads)) <= 8  # decodes share calls
    assert all(_dense_scores(c, heads) <= flex.EAGER_SCORES for c in calls)


@pytest.mark.usefixtures("compiled_as_eager")
@pytest.mark.parametrize("causal", [True, False])
def test_compiled_layout(causal):
    """Per-row batch entries over the whole buffer, as the compiled kernels get them."""
    run(
        Scenario(context_lens=(7, 13, 150, 2), query_lens=(1, 1, 140, 1), causal=causal),
        compiled=True,
    )
    run(Scenario(context_lens=(7, 13, 10), query_lens=(3, 3, 3), causal=causal), compiled=True)


def test_compiler_failure_warns_and_runs_eagerly(monkeypatch):
    def fails(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("no kernel for this")

    monkeypatch.setattr(flex, "_compiled_flex", fails)
    monkeypatch.setattr(flex, "_EAGER_FALLBACK", set())
    with pytest.warns(RuntimeWarning, match="running it eagerly"):
        run(MID_PAGE, compiled=True)
    assert flex._EAGER_FALLBACK  # remembered: the next call does not try again
    run(MID_PAGE, compiled=True)


class PadsSmallHeads(FlexBackend):
    """Pads head dims below 16 on the CPU too, as ``flex`` does for Triton on CUDA."""

    compiled_min_head_dim: ClassVar[dict[str, int]] = {"cpu": 16}


@pytest.mark.usefixtures("compiled_as_eager")
@pytest.mark.parametrize("head_dim", [5, 8, 13])
def test_small_head_dims_are_zero_padded(head_dim):
    run(replace(MID_PAGE, head_dim=head_dim, combined_kv=True), PadsSmallHeads, compiled=True)


def allowed(lo: list[int], hi: list[int], num_keys: int) -> torch.Tensor:
    keys = torch.arange(num_keys)
    return (keys >= torch.tensor(lo)[:, None]) & (keys < torch.tensor(hi)[:, None])


def block_sets(counts: torch.Tensor, indices: torch.Tensor) -> list[list[set[int]]]:
    return [
        [set(indices[b, 0, i, : counts[b, 0, i]].tolist()) for i in range(counts.shape[-1])]
        for b in range(counts.shape[0])
    ]


@pytest.mark.parametrize("seed", range(6))
def test_block_mask_covers_exactly_the_allowed_keys(seed):
    """Full blocks are wholly allowed, partial ones partly, and no allowed key is left out."""
    rng = random.Random(seed)
    causal = seed % 2 == 0
    bounds = []
    q_len = rng.choice([1, 5, 130, 300])
    num_keys = 0
    for _ in range(rng.randint(1, 3)):
        lo: list[int] = []
        hi: list[int] = []
        while len(lo) < q_len:  # rows of this entry, packed one after another
            count = min(q_len - len(lo), rng.randint(1, 200))
            length = count + rng.randint(0, 200)
            start = num_keys + rng.randint(0, 4)
            lo += [start] * count
            hi += [
                start + length - count + j + 1 if causal else start + length for j in range(count)
            ]
            num_keys = start + pages_needed(length, 7) * 7
        bounds.append((lo, hi))
    mask = flex._block_mask(bounds, num_keys, torch.device("cpu"))
    partial = block_sets(mask.kv_num_blocks, mask.kv_indices)
    assert mask.full_kv_num_blocks is not None
    assert mask.full_kv_indices is not None
    full = block_sets(mask.full_kv_num_blocks, mask.full_kv_indices)
    for b, (lo, hi) in enumerate(bounds):
        dense = allowed(lo, hi, num_keys)
        for i, j in itertools.product(range(math.ceil(q_len / 128)), range(-(-num_keys // 128))):
            block = dense[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128]
            assert not (j in full[b][i] and j in partial[b][i])
            if j in full[b][i]:
                assert block.all()
                assert block.shape == (min(128, q_len - i * 128), 128)
            elif j in partial[b][i]:
                assert block.any()
            else:
                assert not block.any()
        keys = torch.arange(num_keys)
        assert torch.equal(
            mask.mask_mod(torch.tensor(b), torch.tensor(0), torch.arange(q_len)[:, None], keys),
            dense,
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled flex on CUDA needs a GPU")
@pytest.mark.parametrize("head_dim", [8, 64])
def test_compiled_on_cuda(head_dim):
    scenario = replace(MID_PAGE, device="cuda", head_dim=head_dim, dtype=torch.bfloat16)
    run(scenario)  # compiled by default on CUDA, head dim 8 zero-padded to 16
    run(replace(scenario, context_lens=(300, 20), query_lens=(260, 20), page_size=16))
