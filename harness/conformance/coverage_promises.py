"""What a conformance run promises to reach inside a backend's claim.

A value of a coverage dimension (``harness.conformance.claim_coverage``) is
promised when every draw path can afford it for the claim: each claimed dtype,
page size and head dim (or latent geometry), pool layouts, batch kinds, DP
sizes and context buckets up to what the claim and the profile's cost limit
allow, and the cells of every pair (``harness.conformance.pair_coverage``). A
run fails when a promised value was never checked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from harness.conformance.buckets import (
    CONTEXT_BUCKETS,
    DP_BUCKETS,
    MLA_HEAD_LABELS,
    QUERY_BUCKETS,
    TOKEN_BUCKETS,
    bucket_name,
)
from harness.conformance.pair_coverage import claimed_cells
from harness.conformance.production_shapes import (
    LARGE_DP_SIZES,
    TOKEN_BUDGET_QUERY_HEADS,
    CostLimit,
)
from harness.conformance.strategies import (
    HEAD_DIMS,
    PAGE_SIZES,
    claimed_head_dims,
    claimed_page_sizes,
)
from harness.core.contract import Capabilities
from harness.core.dtypes import dtype_name
from harness.core.kv_pages import PoolLayout, pages_needed
from harness.numerics.latent import latent_pairs
from harness.numerics.value_regimes import VALUE_REGIMES

PROMISED_TOKEN_BUCKETS = 3  # up to 16385-65536: twelve examples of a regime reach them surely


VARIANT_NAMES = ("window", "soft-cap", "sinks", "alibi")


def _has_variant(name: str) -> Callable[[str], bool]:
    """Whether a ``variant`` label (``window+sinks``) includes ``name``."""
    return lambda label: name in label.split("+")


@dataclass(frozen=True)
class Requirement:
    """A value of one dimension that a run must reach: ``wanted`` names it for people."""

    dimension: str
    wanted: str
    matches: Callable[[str], bool]

    def met_by(self, counts: Counter[str]) -> bool:
        return any(n > 0 and self.matches(label) for label, n in counts.items())


def _exactly(dimension: str, value: str) -> Requirement:
    return Requirement(dimension, value, lambda label: label == value)


def _is_power_of_two(n: int) -> bool:
    return n & (n - 1) == 0


MAX_PROMISED_VALUES = 12
"""A claim listing more values than this is promised its smallest, largest and an odd one."""


def _representative(claim: tuple[int, ...]) -> list[int]:
    """Each claimed value, or for a long claim the ones kernels get wrong: the ends, an odd one."""
    if len(claim) <= MAX_PROMISED_VALUES:
        return sorted(set(claim))
    odd = [v for v in claim if not _is_power_of_two(v)]
    return sorted({min(claim), max(claim), *odd[:1]})


def _reachable_dp_sizes(caps: Capabilities, dp_aware: bool, max_dp_size: int) -> set[int]:
    if not dp_aware:
        return {1}
    claim = caps.max_dp_size or max(LARGE_DP_SIZES)
    plain = set(range(1, min(claim, max_dp_size) + 1))
    return plain | {d for d in LARGE_DP_SIZES if d <= claim}


def _longest_reachable_context(caps: Capabilities, limit: CostLimit) -> int:
    """The longest context the production draws can afford with the cheapest claimed shape."""
    head_dim = min(claimed_head_dims(caps, (8,)))
    page = min(claimed_page_sizes(caps, (1,)))
    longest = limit.cache_elements // head_dim  # one KV head
    longest -= longest % page  # whole pages
    if caps.max_seq_len is not None:
        longest = min(longest, caps.max_seq_len)
    return longest


def _reachable_tokens(caps: Capabilities, limit: CostLimit) -> int:
    """The most new tokens in one step every token-budget draw at the smallest page affords:
    64-token prefills, one KV head, its widest query heads (4) and head dim (the larger of
    the two smallest claimed; ``harness.conformance.strategies``). A promise only the
    cheapest geometry could keep would rest on a few derandomized draws picking it."""
    head_dim = max(sorted(claimed_head_dims(caps, HEAD_DIMS))[:2])
    page = min(claimed_page_sizes(caps, (1,)))
    if (caps.max_seq_len or 64) < 64:
        return 0
    slots = pages_needed(64, page) * page
    work_rows = limit.max_query_context(max(TOKEN_BUDGET_QUERY_HEADS), head_dim) // (64 * 64)
    rows = min(limit.max_tokens(1, head_dim) // slots, work_rows)
    return 64 * rows - 64  # the draws keep 64 tokens in hand


def _far_offsets_reachable(caps: Capabilities) -> bool:
    """Offsets past 3e4 fit bf16 and fp32; fp16's ``q.k`` range stops them at D > 1."""
    return any(d in (torch.float32, torch.bfloat16) for d in caps.dtypes)


def requirements(
    caps: Capabilities,
    *,
    dp_aware: bool,
    max_dp_size: int,
    max_context: int,
    limit: CostLimit,
    large_pool: bool = False,
    device: str = "cpu",
) -> list[Requirement]:
    """Values of each dimension the ``ci`` and ``thorough`` profiles reach inside ``caps``.

    Only what every draw path can afford is promised: a claimed dtype, page
    size or head dim, each pool layout, each batch kind, DP sizes and
    context buckets up to what the claim and the cost limit allow; steps
    past engines' token budgets as far as the cost limit reaches; logit
    offsets as far as the dtypes hold; every real-model value regime; a pool
    past 2^31 elements where ``large_pool`` says this machine can hold one;
    and every cell of every pair (``pair_coverage``) the claim and the cost
    limit allow, which the pairwise test's fixed steps hold by construction.
    """
    wanted = [_exactly("dtype", dtype_name(d)) for d in caps.dtypes_on(device)]
    dp_sizes = _reachable_dp_sizes(caps, dp_aware, max_dp_size)
    for low, high in DP_BUCKETS:
        if any(low <= d <= (high or d) for d in dp_sizes):
            wanted.append(_exactly("dp_size", bucket_name(low, high)))
    positions = ["only"] + (["first", "last"] if max(dp_sizes) >= 2 else [])
    positions += ["middle"] if max(dp_sizes) >= 3 else []
    wanted += [_exactly("rank", p) for p in positions]
    wanted += [_exactly("layout", layout.value) for layout in PoolLayout]
    if caps.page_sizes is not None or caps.page_size_multiple > 1:  # the values drawn
        drawn = claimed_page_sizes(caps, PAGE_SIZES)
        wanted += [_exactly("page_size", str(p)) for p in _representative(drawn)]
    else:
        wanted += [
            _exactly("page_size", "1"),
            Requirement("page_size", "not a power of two", lambda p: not _is_power_of_two(int(p))),
            Requirement("page_size", ">= 32", lambda p: int(p) >= 32),
        ]
    if caps.kind == "mla":  # latent rows of each small width drawn, and a served model's
        pairs = dict.fromkeys((*latent_pairs(caps), *latent_pairs(caps, production=True)[:1]))
        wanted += [_exactly("latent", f"{rank}+{rope}") for rank, rope in pairs]
        wanted += [_exactly("heads", v) for v in MLA_HEAD_LABELS]
    elif caps.head_dims is not None or caps.head_dim_multiple > 1 or caps.min_head_dim > 1:
        drawn = claimed_head_dims(caps, HEAD_DIMS)
        wanted += [_exactly("head_dim", str(d)) for d in _representative(drawn)]
    else:
        wanted += [
            Requirement("head_dim", "not a multiple of 8", lambda d: int(d) % 8 != 0),
            Requirement("head_dim", ">= 128", lambda d: int(d) >= 128),
        ]
    if caps.kind == "mha":
        wanted += [_exactly("heads", v) for v in ("MHA", "GQA 2-8", "GQA 9+", "MQA")]
    wanted += [_exactly("batch", v) for v in ("decode", "prefill", "extend", "mixed")]
    if (caps.max_seq_len or 3) >= 3:
        wanted.append(_exactly("batch", "spec-decode"))
    most = _reachable_tokens(caps, limit)
    wanted += [  # 65537+ is drawn (about one token-budget step in five) but not promised
        _exactly("tokens", bucket_name(low, high))
        for low, high in TOKEN_BUCKETS[:PROMISED_TOKEN_BUCKETS]
        if low <= most
    ]
    far = _far_offsets_reachable(caps)
    for sign in "-+":
        wanted.append(
            _exactly("logit_offset", f"{sign}3e4 or past" if far else f"{sign}1e3 to {sign}3e4")
        )
    wanted += [_exactly("values", regime) for regime in VALUE_REGIMES]
    if large_pool:
        wanted.append(_exactly("pool", "2^31+"))
    longest = _longest_reachable_context(caps, limit)
    wanted += [
        _exactly("context", bucket_name(low, high))
        for low, high in CONTEXT_BUCKETS
        if low <= longest
    ]
    wanted += [
        _exactly("query", bucket_name(low, high))
        for low, high in QUERY_BUCKETS
        if low <= min(longest, caps.max_seq_len or longest)
    ]
    wanted.append(_exactly("mask", "causal"))
    if caps.non_causal:
        wanted.append(_exactly("mask", "non-causal"))
    wanted.append(_exactly("padding", "none"))
    if caps.graph_mode:
        wanted.append(_exactly("padding", "graph-padded"))
    smallest_page = min(claimed_page_sizes(caps, (1,)))
    if pages_needed(max_context, smallest_page) >= 3:  # two sequences can share a whole page
        wanted.append(_exactly("shared_prefix", "shared"))
    wanted += [_exactly("views", v) for v in ("dense", "strided")]
    # an engine's own tensor holds K/V combined or not as it likes; a latent cache is one
    one_tensor = caps.page_format is not None or caps.kind == "mla"
    wanted += [_exactly("cache", v) for v in ("separate K/V", "combined K/V")[: 2 - one_tensor]]
    claimed = (caps.sliding_window, caps.soft_cap, caps.sinks, caps.alibi)
    for name, on in zip(VARIANT_NAMES, claimed, strict=True):
        if on:
            wanted.append(Requirement("variant", name, _has_variant(name)))
    if sum(claimed) >= 2:
        wanted.append(Requirement("variant", "two or more at once", lambda label: "+" in label))
    wanted += [_exactly("kv_cache", d) for d in caps.kv_cache_dtypes]
    wanted += [_exactly("cache_layout", d) for d in caps.cache_layouts]
    for pair, cells in claimed_cells(caps, limit, device).items():
        wanted += [_exactly(pair, cell) for cell in cells]
    return wanted
