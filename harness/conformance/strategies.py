"""Hypothesis strategies for conformance: backend geometries and batches.

Everything is drawn inside a backend's ``Capabilities`` and shrinks toward
the simplest case (fp32, dp_size 1, one short sequence, small pages), so a
failure reduces to a small reproducer. Sizes are bounded by a ``Budget``;
the profiles in ``harness.conformance.profiles`` pick one.

Production shapes (``harness.conformance.production_shapes``) have their own
geometries and batches here, each aimed at one family of kernel thresholds;
a ``CostLimit`` keeps each such example's memory and arithmetic bounded.
Whole steps, small and of production size, are drawn from these pieces by
``harness.conformance.step_strategies``.

Public: ``Budget``, ``geometries``, ``batches``, ``attention_variants``,
``production_geometries``, ``production_batches``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import torch
from hypothesis import strategies as st

from harness.conformance.production_shapes import (
    BUDGET_LONG_CHUNKS,
    BUDGET_QUERY_LENS,
    LONG_CONTEXT,
    LONG_CONTEXTS,
    MANY_SEQUENCES,
    MODEL_GEOMETRIES,
    MODEL_SCALES,
    MQA_HEADS,
    PRODUCTION_GROUPS,
    PRODUCTION_HEAD_DIMS,
    PRODUCTION_PAGE_SIZES,
    QUERY_TILES,
    SPEC_COMMON_QUERY_LENS,
    SPEC_GROUPS,
    SPEC_QUERY_LENS,
    SPLIT_CONTEXTS,
    TOKEN_BUDGET_QUERY_HEADS,
    TOKEN_BUDGETS,
    WIDE_GROUPS,
    CostLimit,
)
from harness.core.contract import VARIANT_FEATURES, Capabilities
from harness.core.kv_pages import pages_needed
from harness.core.variants import AttentionVariant, alibi_slopes_for
from harness.numerics.latent import MLA_MODEL_GEOMETRIES, as_latent, latent_pairs
from harness.numerics.logit_shaping import logit_reach
from harness.numerics.scenario import Scenario, engine_conventions

T = TypeVar("T")
PAGE_SIZES = (2, 1, 3, 4, 5, 7, 8, 16)  # first is where shrinking lands
HEAD_DIMS = (8, 16, 5, 13, 32, 64)
BATCH_KINDS = ("decode", "prefill", "extend", "mixed", "spec-decode")
WINDOWS = (1, 2, 3, 4, 7, 16, 64)  # small windows: small contexts cross them
PRODUCTION_WINDOWS = (64, 128, 256, 1024, 4096)  # peer grids' and Mistral's windows
SOFT_CAPS = (10.0, 30.0, 50.0, 1.0, 5.0)  # the peer grids' caps, then ones small logits reach
FP8_SCALES = (1.0, 0.5, 0.0625, 0.037, 2.0, 0.3)  # powers of two and not


@dataclass(frozen=True)
class Budget:
    """Upper bounds on drawn sizes, so a profile can keep examples cheap."""

    max_seqs: int = 4
    max_context: int = 40
    max_layers: int = 3
    max_dp_size: int = 16
    max_heads: int = 16
    production: CostLimit = field(default_factory=CostLimit)
    production_rate: int = 4  # one plain draw in this many is a production shape


CI_BUDGET = Budget()
THOROUGH_BUDGET = Budget(
    max_seqs=8,
    max_context=160,
    max_layers=4,
    max_heads=32,
    max_dp_size=64,
    production=CostLimit(cache_elements=2**24, work=2**29),
)


def balanced(values: Sequence[T]) -> st.SearchStrategy[T]:
    """One of ``values``, each about equally often; shrinks to the first.

    ``sampled_from`` picks an index from a tiny range, where hypothesis's
    generation (which repeats and mutates earlier choices) leaves one value
    in a few percent of a derandomized run's examples; the low digits of a
    wide integer are close to uniform.
    """
    return st.integers(0, 2**16 - 1).map(lambda i: values[i % len(values)])


@st.composite
def attention_variants(
    draw: st.DrawFn,
    caps: Capabilities,
    num_heads: int,
    windows: tuple[int, ...] = WINDOWS,
) -> AttentionVariant:
    """Variants inside the claim, drawn together; plain attention half the time (shrinks there)."""
    claimed = (
        caps.sliding_window,
        caps.soft_cap,
        caps.sinks,
        caps.alibi,
        len(caps.kv_cache_dtypes) > 1 or caps.kv_cache_dtypes != ("auto",),
    )
    if not any(claimed) or not draw(balanced((False, True))):
        return AttentionVariant() if "auto" in caps.kv_cache_dtypes else _fp8_only(draw, caps)

    def on(claim: bool) -> bool:
        return claim and draw(st.booleans())

    allowed = tuple(w for w in windows if w >= caps.min_sliding_window) or (
        caps.min_sliding_window,
    )
    window = draw(st.sampled_from(allowed)) if on(caps.sliding_window) else None
    cap = draw(st.sampled_from(SOFT_CAPS)) if on(caps.soft_cap) else None
    sinks = None
    if on(caps.sinks):
        per_head = st.floats(-4.0, 4.0, allow_nan=False, width=32)
        sinks = tuple(draw(st.lists(per_head, min_size=num_heads, max_size=num_heads)))
    slopes = None
    if on(caps.alibi):
        factor = draw(st.sampled_from((1.0, 0.25, 4.0, -1.0)))  # vLLM's tests draw randn slopes
        slopes = tuple(factor * s for s in alibi_slopes_for(num_heads))
    cache_dtype = draw(st.sampled_from(caps.kv_cache_dtypes))
    window, cap, sinks, slopes, cache_dtype = _compatible(
        caps, window, cap, sinks, slopes, cache_dtype
    )
    if cache_dtype == "auto":
        return AttentionVariant(
            sliding_window=window, logits_soft_cap=cap, sinks=sinks, alibi_slopes=slopes
        )
    return AttentionVariant(
        sliding_window=window,
        logits_soft_cap=cap,
        sinks=sinks,
        alibi_slopes=slopes,
        kv_cache_dtype=cache_dtype,
        k_scale=draw(st.sampled_from(FP8_SCALES)),
        v_scale=draw(st.sampled_from(FP8_SCALES)),
    )


def _compatible(caps: Capabilities, *drawn: Any) -> tuple[Any, ...]:
    """The drawn features (window, cap, sinks, slopes, cache dtype) with each one that
    ``caps.incompatible`` forbids beside an earlier one turned off."""
    kept = list(drawn)
    off = (None, None, None, None, "auto")
    for i in range(len(kept)):
        earlier = zip(VARIANT_FEATURES[: i + 1], kept[: i + 1], off[: i + 1], strict=True)
        on = [name for name, value, none in earlier if value != none]
        if kept[i] != off[i] and not caps.allows_variants(on):
            kept[i] = off[i]
    return tuple(kept)


def _fp8_only(draw: st.DrawFn, caps: Capabilities) -> AttentionVariant:
    """A backend whose claim has no ``"auto"`` cache: an FP8 cache every time."""
    return AttentionVariant(
        kv_cache_dtype=draw(st.sampled_from(caps.kv_cache_dtypes)),
        k_scale=draw(st.sampled_from(FP8_SCALES)),
        v_scale=draw(st.sampled_from(FP8_SCALES)),
    )


def fp8_served(caps: Capabilities, scenario: Scenario) -> Scenario:
    """``scenario``, whose FP8 cache its page size does not serve, inside the claim: a plain
    cache where one is claimed (the page size, and so the draw's cost, stays), else the
    smallest page size that serves FP8."""
    if "auto" in caps.kv_cache_dtypes:
        plain = replace(scenario.variant, kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0)
        return replace(scenario, variant=plain)
    return replace(scenario, page_size=caps.fp8_page_size(scenario.page_size))


def with_variant(
    draw: st.DrawFn, caps: Capabilities, scenario: Scenario, windows: tuple[int, ...] = WINDOWS
) -> Scenario:
    """``scenario`` with a variant and a cache layout drawn inside ``caps``.

    Where ``caps`` bounds the logits its soft-cap serves, a capped draw whose
    logits could pass the bound is brought inside it (magnitude 1, the default
    scale) or, failing that, loses the cap.
    """
    variant = draw(attention_variants(caps, scenario.num_heads, windows))
    if scenario.is_mla and variant.quantized:  # one latent row, one scale
        variant = replace(variant, v_scale=variant.k_scale)
    drawn = replace(
        scenario,
        variant=variant,
        cache_layout=(
            draw(st.sampled_from(caps.cache_layouts))
            if len(caps.cache_layouts) > 1
            else caps.cache_layouts[0]
        ),
    )
    if drawn.variant.quantized and not caps.allows_fp8_at(drawn.page_size):
        drawn = fp8_served(caps, drawn)
    if soft_cap_room(caps, drawn) < logit_reach(drawn):
        drawn = replace(drawn, magnitude=1.0, scale=None)
    if soft_cap_room(caps, drawn) < logit_reach(drawn):
        drawn = replace(drawn, variant=replace(drawn.variant, logits_soft_cap=None))
    return drawn


def soft_cap_room(caps: Capabilities, scenario: Scenario) -> float:
    """The largest ``|logit|`` ``caps`` serves ``scenario``'s soft-cap for (inf: no bound)."""
    cap = scenario.variant.logits_soft_cap
    if cap is None or caps.soft_cap_logit_bound is None:
        return math.inf
    return caps.soft_cap_logit_bound * cap


def claimed_page_sizes(
    caps: Capabilities, wanted: tuple[int, ...], narrow: bool = False
) -> tuple[int, ...]:
    """Page sizes to draw: the claim's list (``narrow``: its part in ``wanted``), or
    ``wanted``, kept to ``caps``' rules."""
    return _inside(
        caps.page_sizes, wanted, caps.allows_page_size, caps.page_size_multiple, 1, narrow
    )


def claimed_head_dims(
    caps: Capabilities, wanted: tuple[int, ...], narrow: bool = False
) -> tuple[int, ...]:
    """Head dims to draw, as ``claimed_page_sizes`` chooses page sizes."""
    return _inside(
        caps.head_dims,
        wanted,
        caps.allows_head_dim,
        caps.head_dim_multiple,
        caps.min_head_dim,
        narrow,
    )


def _inside(
    claim: tuple[int, ...] | None,
    wanted: tuple[int, ...],
    allows: Callable[[int], bool],
    multiple: int,
    minimum: int,
    narrow: bool,
) -> tuple[int, ...]:
    """The values of ``claim`` (or of ``wanted`` when it lists none) that ``allows`` keeps.

    An empty claim claims nothing. Where the rules keep none of ``wanted``,
    the two smallest values they allow stand in.
    """
    if claim is not None:
        listed = tuple(v for v in claim if allows(v))
        return (tuple(v for v in wanted if v in listed) or listed) if narrow else listed
    kept = tuple(v for v in wanted if allows(v))
    first = -(-minimum // multiple) * multiple
    return kept or (first, first + multiple)


@st.composite
def latent_geometry(
    draw: st.DrawFn, caps: Capabilities, scenario: Scenario, production: bool = False
) -> Scenario:
    """``scenario`` made MLA for a backend of kind ``mla`` (unchanged for another): one
    latent head of a claimed ``(kv_lora_rank, rope_dim)``, served models' geometries in
    production, one tensor per layer (no combined K/V); heads kept unless a model's drawn."""
    if caps.kind != "mla":
        return scenario
    models = [m for m in MLA_MODEL_GEOMETRIES if caps.allows_latent(m.head_dim, m.kv_lora_rank)]
    if production and models:
        model = draw(st.sampled_from(models))
        scenario = replace(scenario, num_heads=model.num_heads)
        return as_latent(scenario, model.kv_lora_rank, model.rope_dim)
    return as_latent(scenario, *draw(st.sampled_from(latent_pairs(caps))))


@st.composite
def geometries(
    draw: st.DrawFn, caps: Capabilities, budget: Budget = CI_BUDGET, device: str = "cpu"
) -> Scenario:
    """Heads (GQA groups 1..8, MQA included), head dim, page size, dtype, scale, layers."""
    dtype = draw(balanced(caps.dtypes_on(device)))
    kv_heads = draw(st.integers(1, 4))
    group = draw(st.integers(1, max(1, min(8, budget.max_heads // kv_heads))))
    head_dims = claimed_head_dims(caps, HEAD_DIMS)  # () claims none
    page_sizes = claimed_page_sizes(caps, PAGE_SIZES)
    scale = draw(st.one_of(st.none(), st.floats(0.03, 2.0, allow_nan=False)))
    # Large logits need a stable softmax; they are drawn rarely and shrink away.
    magnitude = draw(st.sampled_from((1.0, 1.0, 1.0, 8.0, 30.0)))
    if dtype != torch.float32 and magnitude > 8.0:
        magnitude = 8.0  # keeps q.k inside fp16's range; the logits are still in the hundreds
    geometry = Scenario(
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
        **engine_conventions(caps),
    )
    return with_variant(draw, caps, draw(latent_geometry(caps, geometry)))


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
    if kind == "spec-decode" and high >= 3:
        return _spec_decode_batch(draw, page_size, high, max(2, budget.max_seqs))
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


def spec_query_lens() -> st.SearchStrategy[int]:
    """A speculative-decoding step's query length per request: 2-8, 3-7 twice as often."""
    return balanced((*SPEC_QUERY_LENS, *SPEC_COMMON_QUERY_LENS))


def _spec_decode_batch(
    draw: st.DrawFn, page_size: int, high: int, max_rows: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two or more requests verifying the same number of draft tokens, each with a history."""
    query = min(draw(spec_query_lens()), high - 1)
    rows = draw(st.integers(2, max_rows))
    contexts = tuple(_context(draw, query + 1, high, page_size) for _ in range(rows))
    return contexts, (query,) * rows


# -- production shapes ---------------------------------------------------------------


@st.composite
def production_geometries(
    draw: st.DrawFn, caps: Capabilities, regime: str, device: str = "cpu"
) -> Scenario:
    """Heads, head dim, page size and dtype of production size, aimed at ``regime``."""
    head_dims = claimed_head_dims(caps, PRODUCTION_HEAD_DIMS, narrow=True)
    models = [m for m in MODEL_GEOMETRIES if m.head_dim in head_dims]
    kind = draw(balanced(("model", "wide-group", "mqa", "wide-head")))
    if regime == "head-geometry" and kind == "model" and models:
        model = draw(st.sampled_from(models))
        heads, kv_heads, head_dim = model.num_heads, model.num_kv_heads, model.head_dim
    elif regime == "head-geometry":
        kv_heads = 1 if kind == "mqa" else draw(st.sampled_from((1, 2, 4, 8)))
        groups = {"mqa": MQA_HEADS, "wide-group": WIDE_GROUPS}.get(kind, PRODUCTION_GROUPS)
        heads = kv_heads * draw(st.sampled_from(groups))
        wide = tuple(d for d in head_dims if d > 128) if kind == "wide-head" else ()
        head_dim = draw(st.sampled_from(wide or head_dims))
    elif regime == "spec-decode":  # the GQA groups of served models, MQA included
        if kind == "mqa":
            kv_heads, heads = 1, draw(st.sampled_from(MQA_HEADS))
        else:
            kv_heads = draw(st.sampled_from((1, 2, 4, 8)))
            heads = kv_heads * draw(balanced(SPEC_GROUPS))
        fitting = tuple(d for d in head_dims if d <= 128) or head_dims
        head_dim = draw(st.sampled_from(fitting))
    elif regime == "token-budget":  # tens of thousands of tokens fit only with tiny heads
        kv_heads, heads = 1, draw(st.sampled_from(TOKEN_BUDGET_QUERY_HEADS))
        head_dim = draw(st.sampled_from(sorted(claimed_head_dims(caps, HEAD_DIMS))[:2]))
    else:  # long contexts and big pools fit only with few KV heads
        small = regime in ("long-context", "dp-groups")
        kv_heads = draw(st.sampled_from((1, 2) if small else (1, 2, 4, 8)))
        heads = kv_heads * draw(st.sampled_from((1, 4, 8) if small else (1, 2, 4, 8)))
        fitting = tuple(d for d in head_dims if d <= 128) or head_dims
        head_dim = draw(st.sampled_from(fitting if small else head_dims))
    small_pages = (1, 2, 3, 16)
    wanted = (
        PRODUCTION_PAGE_SIZES if regime == "page-sizes" else small_pages + PRODUCTION_PAGE_SIZES
    )
    geometry = Scenario(
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        page_size=draw(st.sampled_from(claimed_page_sizes(caps, wanted, narrow=True))),
        num_layers=1,
        dtype=draw(balanced(caps.dtypes_on(device))),
        scale=None,
        causal=not draw(st.booleans()) if caps.non_causal else True,
        device=device,
        **engine_conventions(caps),
    )
    model_heads = regime in ("head-geometry", "spec-decode", "split-kv", "query-tiles")
    geometry = draw(latent_geometry(caps, geometry, production=model_heads))
    geometry = with_variant(draw, caps, geometry, PRODUCTION_WINDOWS)
    scaled = replace(geometry, scale=draw(balanced(MODEL_SCALES)))  # a served model's scale
    return scaled if logit_reach(scaled) <= soft_cap_room(caps, scaled) else geometry


def _query_kinds(length: int) -> tuple[tuple[str, int], ...]:
    """Decode, extend past a 64- and a 128-row tile, and prefill, for a ``length``-key row."""
    return (("decode", 1), *(("extend", q) for q in (65, 129) if q < length), ("prefill", length))


@st.composite
def production_batches(
    draw: st.DrawFn, regime: str, geometry: Scenario, limit: CostLimit, max_seq_len: int | None
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(context_lens, query_lens)`` aimed at ``regime``, inside the cost limit."""
    g = geometry
    tokens_left = limit.max_tokens(g.num_kv_heads, g.head_dim)
    query_context_left = limit.max_query_context(g.num_heads, g.head_dim)
    cap = max_seq_len or LONG_CONTEXT * 2

    def fits(length: int, query: int) -> bool:
        return _fits(g, length, query, tokens_left, query_context_left, cap)

    if regime == "token-budget":
        return draw(_token_budget_batch(g, tokens_left, query_context_left, cap))
    if regime == "spec-decode":
        return draw(_spec_decode_production(g, tokens_left, query_context_left, cap))
    if regime == "many-sequences":
        count = draw(st.sampled_from(MANY_SEQUENCES))
        menu = tuple(range(1, 49))
    elif regime == "long-context":
        count, menu = draw(st.integers(1, 2)), LONG_CONTEXTS
    elif regime == "page-sizes":
        count = draw(st.integers(1, 4))
        menu = tuple(g.page_size * n + d for n in (1, 2, 3, 8) for d in (-1, 0, 1))
    elif regime in ("head-geometry", "dp-groups"):
        count = draw(st.integers(1, 3))
        menu = SPLIT_CONTEXTS[:12] if regime == "head-geometry" else tuple(range(1, 300, 7))
    else:
        count, menu = draw(st.integers(1, 4)), SPLIT_CONTEXTS
    contexts, queries = [], []
    for _ in range(count):
        if regime == "query-tiles":
            query = draw(st.sampled_from(QUERY_TILES))
            options = [(query, query), (query + draw(st.integers(1, 300)), query)]
            options = [(length, q) for length, q in options if fits(length, q)]
        else:
            options = [(length, 1) for length in menu if length >= 1 and fits(length, 1)]
        if not options:
            break
        length, query = draw(st.sampled_from(options))
        if regime not in ("query-tiles", "long-context"):
            kinds = [kind for kind in _query_kinds(length) if fits(length, kind[1])]
            query = draw(st.sampled_from(kinds))[1]
        contexts.append(length)
        queries.append(query)
        tokens_left -= pages_needed(length, g.page_size) * g.page_size
        query_context_left -= query * length
    if not contexts:  # the claim or the limit leaves nothing past a threshold: stay small
        return (min(g.page_size + 1, cap),), (1,)
    return tuple(contexts), tuple(queries)


def _fits(g: Scenario, length: int, query: int, slots_left: int, work_left: int, cap: int) -> bool:
    slots = pages_needed(length, g.page_size) * g.page_size
    return length <= cap and slots <= slots_left and query * length <= work_left


@st.composite
def _spec_decode_production(
    draw: st.DrawFn, g: Scenario, slots_left: int, work_left: int, cap: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """2-16 requests with one drafted query length, over contexts past split and tile sizes."""
    query = draw(spec_query_lens())
    rows = draw(st.sampled_from((2, 3, 4, 8, 16)))
    menu = (*SPLIT_CONTEXTS, *LONG_CONTEXTS)
    share = (slots_left // rows, work_left // rows)  # every row must fit, so each gets a share
    options = [n for n in menu if n > query and _fits(g, n, query, *share, cap)]
    if not options:  # the claim or the limit leaves no long context: short ones still verify
        options = [n for n in range(query + 1, query + 9) if _fits(g, n, query, *share, cap)]
    if not options:
        return (min(g.page_size + 1, cap),), (1,)
    contexts = tuple(draw(st.sampled_from(options)) for _ in range(rows))
    return contexts, (query,) * rows


@st.composite
def _token_budget_batch(
    draw: st.DrawFn, g: Scenario, slots_left: int, work_left: int, cap: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A step just past an engine's token budget: many short prefills, chunks and decodes.

    Rows come from a seeded ``random.Random`` (hundreds of rows would be
    hundreds of draws): half decodes over up to 300 keys, the rest 64-129
    new tokens (one in eight 200-600) over 0-63 cached ones. When the cost limit runs short,
    the remaining tokens come as 64-token prefills, the cheapest rows.
    """
    cheapest = 64
    cheap_slots = pages_needed(cheapest, g.page_size) * g.page_size
    budget = (slots_left, work_left)

    def affordable(tokens: int, slots: int, work: int) -> bool:
        rows = -(-tokens // cheapest)
        return rows * cheap_slots <= slots and rows * cheapest * cheapest <= work

    targets = [t for t in TOKEN_BUDGETS if cap >= cheapest and affordable(t + 64, *budget)]
    if not targets:
        return (min(g.page_size + 1, cap),), (1,)
    target = draw(st.sampled_from(targets)) + draw(st.integers(0, 64))
    rng = random.Random(draw(st.integers(0, 2**16)))
    contexts: list[int] = []
    queries: list[int] = []
    tokens = 0
    while tokens < target:
        left = target - tokens
        if rng.random() < 0.5:
            query, length = 1, rng.randint(2, min(300, cap))
        else:
            chunks = BUDGET_LONG_CHUNKS if rng.random() < 0.125 else BUDGET_QUERY_LENS
            query = min(rng.choice(chunks), left)
            length = min(query + rng.choice((0, 0, 0, 1, 17, 63)), cap)
        slots = pages_needed(length, g.page_size) * g.page_size
        after = (slots_left - slots, work_left - query * length)
        if min(after) < 0 or not affordable(max(0, left - query), *after):
            query, length, slots = min(cheapest, left), cheapest, cheap_slots
        contexts.append(length)
        queries.append(query)
        tokens += query
        slots_left -= slots
        work_left -= query * length
    return tuple(contexts), tuple(queries)
