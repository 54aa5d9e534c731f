"""Hypothesis strategies for whole conformance steps: one rank's, or every rank's of a group.

A step is a geometry and a batch (``harness.conformance.strategies``) with
everything else the contract varies: the DP group and rank, the pool and its
layout, graph-mode padding, a shared prefix, page order, views, planted keys
and logit offsets. ``scenarios`` makes one draw in ``Budget.production_rate``
a production shape of a drawn regime; ``production_scenarios(caps, regime)``
aims every draw at one family of kernel thresholds
(``harness.conformance.production_shapes``).

Public: ``scenarios``, ``production_scenarios``, ``multi_rank_scenarios``, ``value_regime``.
"""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import strategies as st

from harness.conformance.production_shapes import LARGE_DP_SIZES, REGIMES, SPEC_GROUPS, CostLimit
from harness.conformance.strategies import (
    CI_BUDGET,
    WINDOWS,
    Budget,
    balanced,
    batches,
    geometries,
    production_batches,
    production_geometries,
    soft_cap_room,
    with_variant,
)
from harness.core.contract import Capabilities
from harness.core.kv_pages import PoolLayout, dp_page_range, pages_needed
from harness.numerics.logit_shaping import PLANTED_LOGIT, logit_offset_limit, logit_reach
from harness.numerics.scenario import Scenario
from harness.numerics.value_regimes import VALUE_REGIMES, regime_magnitude, regime_scale

SINGLE_RANK_ONE_IN = 8  # multi-rank draws that are one rank
LOGIT_OFFSETS = (-1e5, -6e4, -3.5e4, -1.2e4, -1e3, 1e3, 3.5e4, 1e5)
"""Row offsets past the finite sentinels kernels start a running maximum or mask at (-1e4,
-3e4, -5e4), the side where those bugs live drawn more, and far above zero (an ``exp2``
domain, a max kept in a narrow type)."""
OFFSET_ONE_IN = 2  # steps whose rows get logit offsets
FAR_BELOW = tuple(o for o in LOGIT_OFFSETS if o < -1e4)
"""Offsets past every finite sentinel and finite mask value a kernel uses (-1e4 and lower)."""


REAL_VALUES_ONE_IN = 4  # steps drawn in a real-model value regime rather than plain noise


def value_regime(draw: st.DrawFn, caps: Capabilities, base: Scenario) -> Scenario:
    """``base`` in a real-model value regime one step in ``REAL_VALUES_ONE_IN`` (normal: shrinks).

    A regime sets its own values, so the step's logit offsets go; ``tiny-scale``
    sets the scale and magnitude too. Where the claim's soft-cap bound has no
    room for the regime's logits, the step stays normal.
    """
    menu = ("normal",) * (len(VALUE_REGIMES) - 1) * (REAL_VALUES_ONE_IN - 1) + VALUE_REGIMES[1:]
    regime = draw(balanced(menu))
    if regime == "normal":
        return base
    drawn = replace(
        base,
        values=regime,
        logit_offsets=(),
        magnitude=regime_magnitude(regime, base.magnitude),
        scale=regime_scale(regime, base.head_dim, base.softmax_scale),
    )
    return drawn if logit_reach(drawn) <= soft_cap_room(caps, drawn) else base


MIXED_REGIMES = tuple(r for r in REGIMES if r != "token-budget")
"""Regimes mixed into plain draws: a token-budget step (thousands of rows, seconds on a
CPU backend) is drawn by its own production test only."""


@st.composite
def _served_heads(draw: st.DrawFn, caps: Capabilities, base: Scenario, budget: Budget) -> Scenario:
    """``base`` with one or two KV heads at the GQA group of a served model (``SPEC_GROUPS``).

    Speculative decoding runs on served models, whose groups (5, 6, 7 among
    them) the plain 1..8 draw rarely gives; sinks and ALiBi slopes are per
    head, so the variant is drawn again for the new head count.
    """
    kv_heads = 1 if base.is_mla else draw(balanced((1, 2)))  # the regime has 4 and 8 too
    groups = [g for g in SPEC_GROUPS if kv_heads * g <= budget.max_heads] or [1]
    heads = kv_heads * draw(balanced(tuple(groups)))
    return with_variant(draw, caps, replace(base, num_heads=heads, num_kv_heads=kv_heads))


def _planted_keys(draw: st.DrawFn, caps: Capabilities, base: Scenario) -> int:
    """Keys given a large logit, where the claim's soft-cap bound leaves room for one."""
    planted = draw(st.sampled_from((0, 0, 1, 3)))
    lifted = replace(base, planted_keys=planted)
    return planted if logit_reach(lifted) <= soft_cap_room(caps, base) else 0


def _logit_offsets(
    draw: st.DrawFn, base: Scenario, rows: int, caps: Capabilities | None = None
) -> tuple[float, ...]:
    """Per-sequence logit offsets one step in ``OFFSET_ONE_IN`` (none: shrinks there).

    Up to eight rows draw their own offset (zero among them, so a step mixes
    rows far from zero and near it); a larger batch shares one. Offsets stay
    inside the dtype's range and the claim's soft-cap bound.
    """
    if draw(st.integers(0, OFFSET_ONE_IN - 1)) != OFFSET_ONE_IN - 1:
        return ()
    room = math.inf if caps is None else soft_cap_room(caps, base) - logit_reach(base)
    limit = min(logit_offset_limit(base), room - PLANTED_LOGIT)
    menu = (0.0, *(o for o in LOGIT_OFFSETS if abs(o) <= limit))
    if rows > 8:
        return (draw(balanced(menu[1:] or menu)),) * rows
    return tuple(draw(balanced(menu)) for _ in range(rows))


def _pool_size(draw: st.DrawFn, base: Scenario, needed: int, dp_size: int) -> int:
    """A pool whose smallest rank range holds ``needed`` pages, and ``base``'s padding page
    where it reserves one; divisible by dp_size or not."""
    per_rank = needed + base.reserves_padding_page + draw(st.integers(0, 3))
    return per_rank * dp_size + draw(st.integers(0, dp_size - 1))


def _pages_for(contexts: tuple[int, ...], page_size: int, shared_pages: int = 0) -> int:
    total = sum(pages_needed(length, page_size) for length in contexts)
    return total - shared_pages * (len(contexts) - 1)


def _max_dp(caps: Capabilities, budget: Budget, dp_aware: bool, min_dp_size: int) -> int:
    max_dp = min(budget.max_dp_size, caps.max_dp_size or budget.max_dp_size) if dp_aware else 1
    if max_dp < min_dp_size:
        raise ValueError(f"cannot draw dp_size >= {min_dp_size}: the backend allows {max_dp}")
    return max_dp


def _step_options(
    draw: st.DrawFn,
    caps: Capabilities,
    base: Scenario,
    contexts: tuple[int, ...],
    queries: tuple[int, ...],
    dp_size: int,
    *,
    dp_rank: int | None = None,
    total_pages: int | None = None,
    layout: PoolLayout | None = None,
) -> Scenario:
    """Everything of a step beyond its geometry and lengths: rank, pool, padding, views."""
    shared_prefix = 0
    cached = [c - q for c, q in zip(contexts, queries, strict=True)]
    if len(contexts) > 1 and min(cached) >= base.page_size and draw(st.booleans()):
        shared_prefix = draw(st.integers(base.page_size, min(cached)))
    shared_pages = shared_prefix // base.page_size
    pad_to = None
    if caps.graph_mode and draw(st.booleans()):
        pad_to = len(contexts) + draw(st.integers(0, 2))
    if total_pages is None:
        needed = _pages_for(contexts, base.page_size, shared_pages)
        total_pages = _pool_size(draw, base, needed, dp_size)
    drawn = replace(
        base,
        context_lens=contexts,
        query_lens=queries,
        dp_size=dp_size,
        dp_rank=draw(st.integers(0, dp_size - 1)) if dp_rank is None else dp_rank,
        total_pages=total_pages,
        layout=draw(st.sampled_from(list(PoolLayout))) if layout is None else layout,
        pad_to=pad_to,
        pad_query_len=draw(st.integers(1, 2)),
        shuffle_pages=draw(st.booleans()),
        shared_prefix=shared_prefix,
        noncontiguous=draw(st.booleans()),
        combined_kv=draw(st.booleans()) and base.owned_format is None and not base.is_mla,
        planted_keys=_planted_keys(draw, caps, base),
        logit_offsets=_logit_offsets(draw, base, len(contexts), caps),
        seed=draw(st.integers(0, 2**16)),
    )
    return value_regime(draw, caps, drawn)


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
    """One rank's step with everything the contract varies, inside ``caps``, on ``device``.

    One draw in ``budget.production_rate`` is a production shape of a drawn
    regime (``MIXED_REGIMES``); the rest are small, and shrinking lands there.
    """
    max_dp = _max_dp(caps, budget, dp_aware, min_dp_size)
    rate = budget.production_rate
    if rate and draw(st.integers(0, rate - 1)) == rate - 1:
        regime = draw(st.sampled_from(MIXED_REGIMES))
        return draw(
            production_scenarios(
                caps,
                regime,
                dp_aware=dp_aware,
                budget=budget,
                min_dp_size=min_dp_size,
                device=device,
            )
        )
    base = draw(geometries(caps, budget, device))
    contexts, queries = draw(batches(base.page_size, budget, caps.max_seq_len))
    if (
        len(queries) >= 2
        and len(set(queries)) == 1
        and queries[0] >= 2
        and queries[0] < min(contexts)
    ):
        base = draw(_served_heads(caps, base, budget))  # a spec-decode step
    dp_size = draw(st.integers(min_dp_size, max_dp))
    return _step_options(draw, caps, base, contexts, queries, dp_size)


def _features_on(scenario: Scenario) -> list[str]:
    """The ``VARIANT_FEATURES`` names of ``scenario``'s variant that are on."""
    claim = scenario.variant.claim()
    on = [name for name in ("sliding_window", "soft_cap", "sinks", "alibi") if claim[name]]
    return [*on, "fp8"] if scenario.variant.quantized else on


@st.composite
def far_below_scenarios(
    draw: st.DrawFn,
    caps: Capabilities,
    *,
    dp_aware: bool = True,
    budget: Budget = CI_BUDGET,
    min_dp_size: int = 1,
    device: str = "cpu",
) -> Scenario:
    """A step whose every row's logits lie below -1e4, under a sliding window when claimed.

    A finite mask value or running-max sentinel (``-1e4``, ``-3e4``) then
    outweighs every key a row may see, so the masked keys win: an error only
    such rows show, and one plain draws reach only when a window and a far
    offset happen to meet. Where the dtype or a soft-cap bound leaves no room
    for such an offset, the step is drawn as it is.
    """
    scenario = draw(
        scenarios(caps, dp_aware=dp_aware, budget=budget, min_dp_size=min_dp_size, device=device)
    )
    allowed = [w for w in WINDOWS if w >= caps.min_sliding_window]
    if caps.sliding_window and scenario.variant.sliding_window is None and allowed:
        windowed = replace(
            scenario,
            variant=replace(scenario.variant, sliding_window=draw(st.sampled_from(allowed))),
        )
        if caps.allows_variants(_features_on(windowed)):
            scenario = windowed
    plain = replace(scenario, logit_offsets=(), values="normal")
    room = soft_cap_room(caps, plain) - logit_reach(plain)
    limit = min(logit_offset_limit(plain), room - PLANTED_LOGIT)
    menu = [o for o in FAR_BELOW if -o <= limit]
    if not menu:
        return scenario
    rows = len(plain.context_lens)
    return replace(plain, logit_offsets=tuple(draw(st.sampled_from(menu)) for _ in range(rows)))


def _large_pool(
    draw: st.DrawFn, base: Scenario, needed: int, dp_size: int, dp_rank: int, limit: CostLimit
) -> tuple[int, PoolLayout] | None:
    """A pool whose ``dp_rank`` range starts past page 32767 (int16 page ids), if it fits."""
    if dp_rank == 0:
        return None
    per_rank = max(needed + 1, -(-(2**15 + 1) // dp_rank))
    total = per_rank * dp_size + draw(st.integers(0, dp_size - 1))
    slots = base.num_kv_heads * base.head_dim * base.page_size
    if total * slots <= limit.cache_elements:
        return total, draw(st.sampled_from(list(PoolLayout)))
    if (per_rank + 1) * slots <= limit.cache_elements:
        return total, PoolLayout.PER_RANK
    return None


@st.composite
def production_scenarios(
    draw: st.DrawFn,
    caps: Capabilities,
    regime: str,
    *,
    dp_aware: bool = True,
    budget: Budget = CI_BUDGET,
    min_dp_size: int = 1,
    device: str = "cpu",
) -> Scenario:
    """One rank's step of production size aimed at ``regime`` (see ``REGIMES``)."""
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; choose from {', '.join(REGIMES)}")
    limit = budget.production
    max_dp = _max_dp(caps, replace(budget, max_dp_size=max(LARGE_DP_SIZES)), dp_aware, min_dp_size)
    base = draw(production_geometries(caps, regime, device))
    contexts, queries = draw(production_batches(regime, base, limit, caps.max_seq_len))
    large = [d for d in LARGE_DP_SIZES if min_dp_size <= d <= max_dp]
    if regime == "dp-groups" and large:
        dp_size = draw(st.sampled_from(large))
        dp_rank = dp_size - 1 - draw(st.integers(0, dp_size - 1))  # shrinks to the last rank
    else:
        dp_size = draw(st.integers(min_dp_size, min(max_dp, max(min_dp_size, 4))))
        dp_rank = draw(st.integers(0, dp_size - 1))
    needed = _pages_for(contexts, base.page_size)
    total, layout = _pool_size(draw, base, needed, dp_size), None
    if regime == "dp-groups" and draw(balanced((True, True, False))):  # mostly ids past int16
        found = _large_pool(draw, base, needed, dp_size, dp_rank, limit)
        if found is not None:
            total, layout = found
    if total * base.page_size * base.num_kv_heads * base.head_dim > limit.cache_elements:
        layout = PoolLayout.PER_RANK  # the whole pool would not fit: hold this rank's pages only
    return _step_options(
        draw,
        caps,
        base,
        contexts,
        queries,
        dp_size,
        dp_rank=dp_rank,
        total_pages=total,
        layout=layout,
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
    """One step for every rank of one DP group, sharing geometry and pool size.

    About one draw in eight is a single rank (where shrinking lands); the
    rest are real groups of two or more. As for one rank's steps, one group in
    ``budget.production_rate`` is of production size: every rank's batch is
    drawn for one regime (``MIXED_REGIMES``) within its share of the cost
    limit. A graph-mode group pads every rank to one batch size, as DP
    attention pads each rank to the group's largest batch.
    """
    groups = dp_aware and _max_dp(caps, budget, dp_aware, 1) >= 2
    single = draw(balanced((True, *[False] * (SINGLE_RANK_ONE_IN - 1))))
    min_dp_size = 1 if single or not groups else 2
    rate = budget.production_rate
    if rate and draw(st.integers(0, rate - 1)) == rate - 1:
        regime = draw(st.sampled_from(MIXED_REGIMES))
        return draw(_production_group(caps, regime, dp_aware, budget, min_dp_size, device))
    first = draw(
        scenarios(caps, dp_aware=dp_aware, budget=budget, min_dp_size=min_dp_size, device=device)
    )
    rows = [
        draw(batches(first.page_size, replace(budget, max_seqs=3), caps.max_seq_len))
        for _ in range(first.dp_size)
    ]
    needed = max(_pages_for(contexts, first.page_size) for contexts, _ in rows)
    total = _pool_size(draw, first, needed, first.dp_size)
    return _group(first, rows, total)


def _group(
    first: Scenario, rows: list[tuple[tuple[int, ...], tuple[int, ...]]], total: int
) -> list[Scenario]:
    """Every rank of ``first``'s group with its own ``rows``, on a pool of ``total`` pages."""
    widest = max(len(contexts) for contexts, _ in rows)
    pad_to = None if first.pad_to is None else widest + first.pad_to - len(first.context_lens)
    ranks = [
        replace(
            first,
            dp_rank=rank,
            context_lens=contexts,
            query_lens=queries,
            shared_prefix=0,
            pad_to=pad_to,
            total_pages=total,
            seed=first.seed + rank,
        )
        for rank, (contexts, queries) in enumerate(rows)
    ]
    needed = max(_pages_for(s.context_lens, s.page_size) for s in ranks)
    assert all(len(dp_page_range(total, s.dp_size, s.dp_rank)) >= needed for s in ranks)
    return ranks


@st.composite
def _production_group(
    draw: st.DrawFn,
    caps: Capabilities,
    regime: str,
    dp_aware: bool,
    budget: Budget,
    min_dp_size: int,
    device: str,
) -> list[Scenario]:
    """A DP group whose every rank's batch is of production size for ``regime``."""
    first = draw(
        production_scenarios(
            caps, regime, dp_aware=dp_aware, budget=budget, min_dp_size=min_dp_size, device=device
        )
    )
    limit = budget.production
    share = CostLimit(limit.cache_elements // first.dp_size, limit.work // first.dp_size)
    rows = [(first.context_lens, first.query_lens)] if first.dp_size == 1 else []
    while len(rows) < first.dp_size:
        rows.append(draw(production_batches(regime, first, share, caps.max_seq_len)))
    needed = max(_pages_for(contexts, first.page_size) for contexts, _ in rows)
    total = _pool_size(draw, first, needed, first.dp_size)
    slots = first.page_size * first.num_kv_heads * first.head_dim
    layout = PoolLayout.PER_RANK if total * slots > limit.cache_elements else first.layout
    return [replace(s, layout=layout) for s in _group(first, rows, total)]
