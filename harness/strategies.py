"""Hypothesis strategies for conformance: backend geometries and whole steps.

Everything is drawn inside a backend's ``Capabilities`` and shrinks toward
the simplest case (fp32, dp_size 1, one short sequence, small pages), so a
failure reduces to a small reproducer. Sizes are bounded by a ``Budget``;
the profiles in ``harness.profiles`` pick one.

Public: ``Budget``, ``geometries``, ``batches``, ``scenarios``,
``multi_rank_scenarios``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from hypothesis import strategies as st

from harness.contract import Capabilities
from harness.kv_pages import PoolLayout, dp_page_range, pages_needed
from harness.scenario import Scenario

PAGE_SIZES = (2, 1, 3, 4, 5, 7, 8, 16)  # first is where shrinking lands
HEAD_DIMS = (8, 16, 5, 13, 32, 64)
BATCH_KINDS = ("decode", "prefill", "extend", "mixed")


@dataclass(frozen=True)
class Budget:
    """Upper bounds on drawn sizes, so a profile can keep examples cheap."""

    max_seqs: int = 4
    max_context: int = 40
    max_layers: int = 3
    max_dp_size: int = 8
    max_heads: int = 16


CI_BUDGET = Budget()
THOROUGH_BUDGET = Budget(max_seqs=8, max_context=160, max_layers=4, max_heads=32)


@st.composite
def geometries(
    draw: st.DrawFn, caps: Capabilities, budget: Budget = CI_BUDGET, device: str = "cpu"
) -> Scenario:
    """Heads (GQA groups 1..8, MQA included), head dim, page size, dtype, scale, layers."""
    dtype = draw(st.sampled_from(caps.dtypes))
    kv_heads = draw(st.integers(1, 4))
    group = draw(st.integers(1, max(1, min(8, budget.max_heads // kv_heads))))
    head_dims = caps.head_dims or HEAD_DIMS
    page_sizes = caps.page_sizes or PAGE_SIZES
    scale = draw(st.one_of(st.none(), st.floats(0.03, 2.0, allow_nan=False)))
    # Large logits need a stable softmax; they are drawn rarely and shrink away.
    magnitude = draw(st.sampled_from((1.0, 1.0, 1.0, 8.0, 30.0)))
    if dtype != torch.float32 and magnitude > 8.0:
        magnitude = 8.0  # keeps q.k inside fp16's range; the logits are still in the hundreds
    return Scenario(
        num_heads=kv_heads * group,
        num_kv_heads=kv_heads,
        head_dim=draw(st.sampled_from(head_dims)),
        page_size=draw(st.sampled_from(page_sizes)),
        num_layers=draw(st.integers(1, budget.max_layers)),
        dtype=dtype,
        scale=scale,
        magnitude=magnitude,
        causal=not draw(st.booleans()) if caps.non_causal else True,  # shrinks to causal
        device=device,
    )


def _context(draw: st.DrawFn, low: int, high: int, page_size: int) -> int:
    """A length, sometimes exactly on a page boundary."""
    if draw(st.booleans()) and high >= page_size:
        pages = draw(st.integers(max(1, pages_needed(low, page_size)), high // page_size))
        return pages * page_size
    return draw(st.integers(low, high))


@st.composite
def batches(
    draw: st.DrawFn, page_size: int, budget: Budget = CI_BUDGET, max_seq_len: int | None = None
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(context_lens, query_lens)`` of a decode, prefill, extend or mixed batch."""
    kind = draw(st.sampled_from(BATCH_KINDS))
    high = min(budget.max_context, max_seq_len or budget.max_context)
    contexts, queries = [], []
    for _ in range(draw(st.integers(1, budget.max_seqs))):
        row = kind if kind != "mixed" else draw(st.sampled_from(BATCH_KINDS[:3]))
        if row == "extend" and high < 3:
            row = "prefill"
        if row == "decode":
            length = _context(draw, 1, high, page_size)
            query = 1
        elif row == "prefill":
            length = _context(draw, 1, high, page_size)
            query = length
        else:  # extend: 1 < q < L, the chunked-prefill case
            length = _context(draw, 3, high, page_size)
            query = draw(st.integers(2, length - 1))
        contexts.append(length)
        queries.append(query)
    return tuple(contexts), tuple(queries)


def _pool_size(draw: st.DrawFn, needed: int, dp_size: int) -> int:
    """A pool whose smallest rank range holds ``needed`` pages; divisible by dp_size or not."""
    per_rank = needed + draw(st.integers(0, 3))
    return per_rank * dp_size + draw(st.integers(0, dp_size - 1))


def _pages_for(contexts: tuple[int, ...], page_size: int, shared_pages: int = 0) -> int:
    total = sum(pages_needed(length, page_size) for length in contexts)
    return total - shared_pages * (len(contexts) - 1)


@st.composite
def scenarios(
    draw: st.DrawFn,
    caps: Capabilities,
    *,
    dp_aware: bool = True,
    budget: Budget = CI_BUDGET,
    min_dp_size: int = 1,
    device: str = "cpu",
) -> Scenario:
    """One rank's step with everything the contract varies, inside ``caps``, on ``device``."""
    base = draw(geometries(caps, budget, device))
    contexts, queries = draw(batches(base.page_size, budget, caps.max_seq_len))
    max_dp = min(budget.max_dp_size, caps.max_dp_size or budget.max_dp_size) if dp_aware else 1
    if max_dp < min_dp_size:
        raise ValueError(f"cannot draw dp_size >= {min_dp_size}: the backend allows {max_dp}")
    dp_size = draw(st.integers(min_dp_size, max_dp))
    shared_prefix = 0
    cached = [c - q for c, q in zip(contexts, queries, strict=True)]
    if len(contexts) > 1 and min(cached) >= base.page_size and draw(st.booleans()):
        shared_prefix = draw(st.integers(base.page_size, min(cached)))
    shared_pages = shared_prefix // base.page_size
    pad_to = None
    if caps.graph_mode and draw(st.booleans()):
        pad_to = len(contexts) + draw(st.integers(0, 2))
    return replace(
        base,
        context_lens=contexts,
        query_lens=queries,
        dp_size=dp_size,
        dp_rank=draw(st.integers(0, dp_size - 1)),
        total_pages=_pool_size(draw, _pages_for(contexts, base.page_size, shared_pages), dp_size),
        layout=draw(st.sampled_from(list(PoolLayout))),
        pad_to=pad_to,
        pad_query_len=draw(st.integers(1, 2)),
        shuffle_pages=draw(st.booleans()),
        shared_prefix=shared_prefix,
        noncontiguous=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


@st.composite
def multi_rank_scenarios(
    draw: st.DrawFn,
    caps: Capabilities,
    *,
    dp_aware: bool = True,
    budget: Budget = CI_BUDGET,
    device: str = "cpu",
) -> list[Scenario]:
    """One step for every rank of one DP group, sharing geometry and pool size."""
    first = draw(scenarios(caps, dp_aware=dp_aware, budget=budget, device=device))
    dp_size = first.dp_size
    ranks = []
    needed = 0
    for rank in range(dp_size):
        contexts, queries = draw(
            batches(first.page_size, replace(budget, max_seqs=3), caps.max_seq_len)
        )
        needed = max(needed, _pages_for(contexts, first.page_size))
        ranks.append(
            replace(
                first,
                dp_rank=rank,
                context_lens=contexts,
                query_lens=queries,
                shared_prefix=0,
                pad_to=None,
                seed=first.seed + rank,
            )
        )
    total = _pool_size(draw, needed, dp_size)
    ranks = [replace(s, total_pages=total) for s in ranks]
    assert all(len(dp_page_range(total, dp_size, s.dp_rank)) >= needed for s in ranks)
    return ranks
