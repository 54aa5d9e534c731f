"""Pairwise coverage: dimensions at their boundaries together, and steps built to reach them.

Each dimension reaching its edges somewhere does not make them meet: a page
size with contexts past a few thousand keys, thousands of sequences that are
all long, a long query under a sliding window, float16 with massive values.
Kernel bugs live in such pairs. ``PAIRS`` names the pairs counted; each
step's cells (``pair_cells``) are tallied beside the single dimensions, and
the cells a backend's claim allows within the profile's cost limit
(``claimed_cells``) are promised.

They are reached by construction, not by luck: ``covering_steps`` builds a
fixed set of steps that together hold every claimed cell (a greedy covering
of the pairs, each step as cheap as its cells allow: extreme counts come with
one KV head of the smallest claimed head dim), and
``suites/conformance/test_pairwise.py`` checks each against the oracle.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import zip_longest

import torch

from harness.conformance.buckets import (
    CONTEXT_BUCKETS,
    HEAD_DIM_BUCKETS,
    MLA_HEAD_LABELS,
    PAGE_BUCKETS,
    QUERY_BUCKETS,
    SEQUENCE_BUCKETS,
    Buckets,
    bucket,
    bucket_name,
    heads_label,
)
from harness.conformance.production_shapes import CostLimit
from harness.conformance.strategies import claimed_head_dims, claimed_page_sizes
from harness.core.contract import Capabilities
from harness.core.dtypes import dtype_name
from harness.core.kv_pages import pages_needed
from harness.core.variants import AttentionVariant, alibi_slopes_for
from harness.numerics.latent import as_latent, latent_pairs
from harness.numerics.scenario import Scenario, engine_conventions
from harness.numerics.value_regimes import VALUE_REGIMES, regime_magnitude, regime_scale

PAIRS = (
    ("sequences", "context"),
    ("page", "context"),
    ("heads", "head_dim"),
    ("query", "feature"),
    ("dtype", "values"),
)
PAIR_DIMENSIONS = tuple(f"{a} x {b}" for a, b in PAIRS)
FEATURES = ("plain", "window", "soft-cap", "sinks", "alibi", "fp8", "graph-padded")
"""What a step adds beside plain causal attention, as the ``feature`` axis names it."""
HEAD_LAYOUTS = {"MHA": (1, 1), "GQA 2-8": (2, 8), "GQA 9+": (2, 24), "MQA": (1, 32)}
"""KV heads and query heads a step takes for each head layout (``heads_label``)."""
MLA_HEAD_LAYOUTS = dict(zip(MLA_HEAD_LABELS, ((1, 16), (1, 128)), strict=True))
"""The same for an MLA backend: one latent head under 16 or 128 query heads."""
ALL_HEAD_LAYOUTS = HEAD_LAYOUTS | MLA_HEAD_LAYOUTS
WINDOW = 16
SOFT_CAP = 30.0
FP8_SCALE = 0.5


def _features(s: Scenario) -> list[str]:
    v = s.variant
    on = [
        name
        for name, flag in (
            ("window", v.sliding_window is not None),
            ("soft-cap", v.logits_soft_cap is not None),
            ("sinks", v.sinks is not None),
            ("alibi", v.alibi_slopes is not None),
            ("fp8", v.quantized),
            ("graph-padded", s.graph_mode),
        )
        if flag
    ]
    return on or ["plain"]


def axis_labels(s: Scenario) -> dict[str, list[str]]:
    """Each pair axis's labels for one step (``feature`` may hold several)."""
    return {
        "sequences": [bucket(len(s.context_lens), SEQUENCE_BUCKETS)],
        "context": [bucket(max(s.context_lens), CONTEXT_BUCKETS)],
        "page": [bucket(s.page_size, PAGE_BUCKETS)],
        "heads": [heads_label(s)],
        "head_dim": [bucket(s.head_dim, HEAD_DIM_BUCKETS)],
        "query": [bucket(max(s.query_lens), QUERY_BUCKETS)],
        "feature": _features(s),
        "dtype": [dtype_name(s.dtype)],
        "values": [s.values],
    }


def cell(first: str, second: str) -> str:
    return f"{first} & {second}"


def pair_cells(s: Scenario) -> dict[str, list[str]]:
    """The cells of every pair (``PAIR_DIMENSIONS``) one step holds."""
    axes = axis_labels(s)
    return {
        name: [cell(x, y) for x in axes[a] for y in axes[b]]
        for name, (a, b) in zip(PAIR_DIMENSIONS, PAIRS, strict=True)
    }


# -- what a claim allows ---------------------------------------------------------------


def _low(buckets: Buckets) -> dict[str, int]:
    return {bucket_name(low, high): low for low, high in buckets}


SEQUENCES = _low(SEQUENCE_BUCKETS)
CONTEXTS = _low(CONTEXT_BUCKETS)
QUERIES = {"1": 1, "2-64": 8, "65-128": 65, "129+": 129}
SHORT_CONTEXT = 40  # the 1-64 bucket's length, unless 65536+ sequences need 1


def _context_length(context: str, sequences: str) -> int:
    if context != "1-64":
        return CONTEXTS[context]
    return 1 if SEQUENCES[sequences] >= 65536 else SHORT_CONTEXT


@dataclass(frozen=True)
class _Axes:
    """What one axis may take inside a claim: label -> the value a step uses for it."""

    pages: dict[str, int]
    head_dims: dict[str, int]
    contexts: dict[str, int]
    features: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    heads: tuple[str, ...] = tuple(HEAD_LAYOUTS)
    latent: dict[int, int] = field(default_factory=dict)  # MLA: latent width -> kv_lora_rank


def _first_in_each(values: Iterable[int], buckets: Buckets) -> dict[str, int]:
    found: dict[str, int] = {}
    for value in sorted(values):
        found.setdefault(bucket(value, buckets), value)
    return found


def _axes(caps: Capabilities, device: str) -> _Axes:
    pages = _first_in_each(claimed_page_sizes(caps, (1, 3, 16, 32, 64, 128, 256)), PAGE_BUCKETS)
    dims = _first_in_each(
        claimed_head_dims(caps, (16, 13, 64, 80, 128, 192, 256)), HEAD_DIM_BUCKETS
    )
    latent: dict[int, int] = {}
    if caps.kind == "mla":  # latent widths, small and served models'
        pairs = (*latent_pairs(caps), *latent_pairs(caps, production=True))
        latent = {rank + rope: rank for rank, rope in pairs}
        dims = _first_in_each(latent, HEAD_DIM_BUCKETS)
    longest = caps.max_seq_len or math.inf
    contexts = {name: low for name, low in CONTEXTS.items() if low <= longest}
    fp8 = [d for d in caps.kv_cache_dtypes if d != "auto"]
    features = [
        name
        for name, on in (
            ("plain", "auto" in caps.kv_cache_dtypes),
            ("window", caps.sliding_window),
            ("soft-cap", caps.soft_cap),
            ("sinks", caps.sinks),
            ("alibi", caps.alibi),
            ("fp8", bool(fp8)),
            ("graph-padded", caps.graph_mode),
        )
        if on
    ]
    heads = tuple(MLA_HEAD_LAYOUTS if caps.kind == "mla" else HEAD_LAYOUTS)
    dtypes = caps.dtypes_on(device)
    return _Axes(pages, dims, contexts, tuple(features), dtypes, heads, latent)


@dataclass
class _Step:
    """One covering step's axis values, before it becomes a ``Scenario``."""

    sequences: str = "1"
    context: str = "1-64"
    page: str = ""
    heads: str = "MHA"
    head_dim: str = ""
    query: str = "1"
    feature: str = "plain"
    dtype: str = ""
    values: str = "normal"

    def scenario(self, axes: _Axes, caps: Capabilities, seed: int, device: str) -> Scenario:
        kv_heads, heads = ALL_HEAD_LAYOUTS[self.heads]
        length = _context_length(self.context, self.sequences)
        rows = SEQUENCES[self.sequences]
        query = min(QUERIES[self.query], length)
        page = axes.pages[self.page]
        head_dim = axes.head_dims[self.head_dim]
        dtype = next(d for d in axes.dtypes if dtype_name(d) == self.dtype)
        needed = pages_needed(length, page) * rows
        s = Scenario(
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            page_size=page,
            total_pages=needed + 1 + (caps.padding_convention == "one-token"),
            num_layers=1,
            context_lens=(length,) * rows,
            query_lens=(query, *(1,) * (rows - 1)),
            dtype=dtype,
            pad_to=rows + 1 if self.feature == "graph-padded" else None,
            cache_layout=caps.cache_layouts[0],
            **engine_conventions(caps),
            seed=seed,
            device=device,
        )
        if head_dim in axes.latent:
            s = as_latent(s, axes.latent[head_dim], head_dim - axes.latent[head_dim])
        s = replace(s, variant=_variant(self.feature, caps, heads))
        if s.variant.quantized and not caps.allows_fp8_at(page):
            s = replace(s, page_size=caps.fp8_page_size(page))  # FP8 served from there up
        return replace(
            s,
            values=self.values,
            magnitude=regime_magnitude(self.values, s.magnitude),
            scale=regime_scale(self.values, head_dim, s.softmax_scale),
        )

    def cost(self, axes: _Axes) -> tuple[int, int]:
        """Cache elements of one K tensor and multiply-adds: the ``CostLimit`` measures."""
        kv_heads, heads = ALL_HEAD_LAYOUTS[self.heads]
        length = _context_length(self.context, self.sequences)
        rows = SEQUENCES[self.sequences]
        page = axes.pages[self.page]
        head_dim = axes.head_dims[self.head_dim]
        slots = pages_needed(length, page) * page * rows
        query = min(QUERIES[self.query], length)
        work = (query + rows - 1) * length * heads * head_dim
        return slots * kv_heads * head_dim, work


def _variant(feature: str, caps: Capabilities, heads: int) -> AttentionVariant:
    """The feature's variant; an FP8 cache as well where the claim has no plain cache."""
    variant = _feature_variant(feature, caps, heads)
    if "auto" in caps.kv_cache_dtypes or variant.quantized:
        return variant
    fp8 = _feature_variant("fp8", caps, heads)
    return replace(
        fp8,
        **{
            k: getattr(variant, k)
            for k in ("sliding_window", "logits_soft_cap", "sinks", "alibi_slopes")
        },
    )


def _feature_variant(feature: str, caps: Capabilities, heads: int) -> AttentionVariant:
    if feature == "window":
        return AttentionVariant(sliding_window=max(WINDOW, caps.min_sliding_window))
    if feature == "soft-cap":
        return AttentionVariant(logits_soft_cap=SOFT_CAP)
    if feature == "sinks":
        return AttentionVariant(sinks=tuple(float(h % 3) for h in range(heads)))
    if feature == "alibi":
        return AttentionVariant(alibi_slopes=tuple(alibi_slopes_for(heads)))
    if feature == "fp8":
        dtype = next(d for d in caps.kv_cache_dtypes if d != "auto")
        return AttentionVariant(kv_cache_dtype=dtype, k_scale=FP8_SCALE, v_scale=FP8_SCALE)
    return AttentionVariant()  # plain, or graph padding (which the step itself carries)


def _fits(step: _Step, axes: _Axes, limit: CostLimit) -> bool:
    elements, work = step.cost(axes)
    return elements <= limit.cache_elements and work <= limit.work


def _cheapest(axes: _Axes) -> _Step:
    page, dim = next(iter(axes.pages)), next(iter(axes.head_dims))
    return _Step(page=page, head_dim=dim, heads=axes.heads[0])


def claimed_cells(
    caps: Capabilities, limit: CostLimit, device: str = "cpu"
) -> dict[str, list[str]]:
    """Per pair, the cells inside the claim that a step within ``limit`` can hold.

    A shape cell counts when the cheapest step holding it fits (one KV head of
    the smallest claimed head dim, the smallest page for a count, one
    sequence for a page); empty when the claim leaves an axis nothing.
    """
    axes = _axes(caps, device)
    if not (axes.pages and axes.head_dims and axes.dtypes and axes.features):
        return {name: [] for name in PAIR_DIMENSIONS}
    base = _cheapest(axes)

    def shapes(field: str, values: Iterable[str]) -> list[str]:
        return [
            cell(value, context)
            for value in values
            for context in axes.contexts
            if _fits(replace(base, **{field: value, "context": context}), axes, limit)
        ]

    queries = [
        cell(q, f)
        for q in QUERIES
        for f in axes.features
        if QUERIES[q] <= max(axes.contexts.values())
    ]
    return {
        "sequences x context": shapes("sequences", SEQUENCES),
        "page x context": shapes("page", axes.pages),
        "heads x head_dim": [
            cell(h, d)
            for h in axes.heads
            for d in axes.head_dims
            if _fits(replace(base, heads=h, head_dim=d), axes, limit)
        ],
        "query x feature": queries,
        "dtype x values": [cell(dtype_name(d), v) for d in axes.dtypes for v in VALUE_REGIMES],
    }


# -- steps that hold every claimed cell --------------------------------------------------


def _split(name: str) -> tuple[str, str]:
    first, second = name.split(" & ")
    return first, second


def _shape_steps(cells: dict[str, list[str]], axes: _Axes, limit: CostLimit) -> list[_Step]:
    """One step per context bucket and rank: the most sequences with the smallest page, and up."""
    steps = []
    base = _cheapest(axes)
    for context in axes.contexts:
        counts = sorted(
            (s for s, c in map(_split, cells["sequences x context"]) if c == context),
            key=lambda s: -SEQUENCES[s],
        )
        pages = sorted(
            (p for p, c in map(_split, cells["page x context"]) if c == context),
            key=lambda p: axes.pages[p],
        )
        for count, page in zip_longest(counts, pages):
            step = replace(base, context=context, sequences=count or "1", page=page or base.page)
            if not _fits(step, axes, limit):  # a large page with many sequences: apart
                steps.append(replace(step, page=base.page))
                step = replace(step, sequences="1")
            steps.append(step)
    return steps


def _attach(
    steps: list[_Step],
    wanted: list[str],
    axes: _Axes,
    limit: CostLimit,
    apply: Callable[[_Step, str, str], _Step | None],
    alone: Callable[[str, str], _Step],
) -> None:
    """Give each cell of one pair to the first step it fits (one cell a step), else a step of
    its own (``alone``)."""
    left = list(wanted)
    for index, step in enumerate(steps):
        for name in left:
            changed = apply(step, *_split(name))
            if changed is not None and _fits(changed, axes, limit):
                steps[index] = changed
                left.remove(name)
                break
    steps.extend(alone(*_split(name)) for name in left)


def covering_steps(caps: Capabilities, limit: CostLimit, device: str = "cpu") -> list[Scenario]:
    """A fixed list of steps that together hold every cell of ``claimed_cells``."""
    cells = claimed_cells(caps, limit, device)
    if not any(cells.values()):
        return []
    axes = _axes(caps, device)
    steps = _shape_steps(cells, axes, limit)
    first_dtype = dtype_name(axes.dtypes[0])
    steps = [replace(s, dtype=first_dtype) for s in steps]

    cheapest = _cheapest(axes)
    capped = caps.soft_cap_logit_bound is not None

    def heads(step: _Step, layout: str, dim: str) -> _Step:
        return replace(step, heads=layout, head_dim=dim)

    def query(step: _Step, q: str, feature: str) -> _Step | None:
        if QUERIES[q] > _context_length(step.context, step.sequences):
            return None
        if capped and feature == "soft-cap" and step.values == "massive-qk":
            return None
        return replace(step, query=q, feature=feature)

    def query_alone(q: str, feature: str) -> _Step:
        context = next(c for c, n in axes.contexts.items() if n >= QUERIES[q] or c == "1-64")
        if QUERIES[q] > _context_length(context, "1"):
            context = next(c for c, n in axes.contexts.items() if n >= QUERIES[q])
        return replace(cheapest, context=context, query=q, feature=feature)

    def values(step: _Step, dtype: str, regime: str) -> _Step | None:
        if capped and step.feature == "soft-cap" and regime == "massive-qk":
            return None
        return replace(step, dtype=dtype, values=regime)

    _attach(steps, cells["heads x head_dim"], axes, limit, heads, partial(heads, cheapest))
    _attach(steps, cells["query x feature"], axes, limit, query, query_alone)

    def values_alone(dtype: str, regime: str) -> _Step:
        return replace(cheapest, dtype=dtype, values=regime)

    _attach(steps, cells["dtype x values"], axes, limit, values, values_alone)
    steps = [s if s.dtype else replace(s, dtype=first_dtype) for s in steps]
    return [s.scenario(axes, caps, seed, device) for seed, s in enumerate(steps)]
