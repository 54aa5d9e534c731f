"""What a conformance run exercised: examples counted along each dimension of the inputs.

A property holds only for the inputs it was given. A backend that refuses
whole regions of its claim, or a strategy that never reaches them, would
otherwise pass on a fraction of what it promises, and nothing would say so.
So every checked example is tallied by dimension (dtype, DP size, rank
position, layout, page size, ...); the run prints the tally, writes it as
JSON and JUnit properties, and fails when a value the backend claims and the
profile promises to reach was never checked.

Public: ``DIMENSIONS``, ``labels``, ``Requirement``, ``requirements``,
``StatefulRun``, ``CoverageLog``, ``claim_summary``.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.conformance.buckets import (
    CONTEXT_BUCKETS,
    DP_BUCKETS,
    QUERY_BUCKETS,
    TOKEN_BUCKETS,
    bucket,
    bucket_name,
    heads_label,
)
from harness.conformance.pair_coverage import PAIR_DIMENSIONS, claimed_cells, pair_cells
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
from harness.numerics.scenario import Scenario
from harness.numerics.value_regimes import VALUE_REGIMES

DIMENSIONS = (
    "dtype",
    "dp_size",
    "rank",
    "layout",
    "page_size",
    "head_dim",
    "heads",
    "batch",
    "context",
    "query",
    "mask",
    "padding",
    "shared_prefix",
    "views",
    "cache",
    "variant",
    "kv_cache",
    "cache_layout",
    "tokens",
    "logit_offset",
    "values",
    "pool",
)

PROMISED_TOKEN_BUCKETS = 3  # up to 16385-65536: twelve examples of a regime reach them surely
OFFSET_NEAR_ZERO = 1e3  # below it, a row's logits are what the magnitude draws give
OFFSET_FAR = 3e4  # past fp16-minded sentinels (-1e4, -3e4)


def _row_kind(context: int, query: int) -> str:
    if query == context:
        return "prefill"
    return "decode" if query == 1 else "extend"


def _rank_position(s: Scenario) -> str:
    if s.dp_size == 1:
        return "only"
    if s.dp_rank == 0:
        return "first"
    return "last" if s.dp_rank == s.dp_size - 1 else "middle"


def _is_spec_decode(contexts: tuple[int, ...], queries: tuple[int, ...]) -> bool:
    """Two or more requests, each verifying the same 2-8 new tokens over a history."""
    return (
        len(queries) >= 2
        and len(set(queries)) == 1
        and 2 <= queries[0] <= 8
        and all(q < c for c, q in zip(contexts, queries, strict=True))
    )


def _batch_kind(s: Scenario) -> str:
    if _is_spec_decode(s.context_lens, s.query_lens):
        return "spec-decode"
    kinds = {_row_kind(c, q) for c, q in zip(s.context_lens, s.query_lens, strict=True)}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def _logit_offset(s: Scenario) -> str:
    """The bucket of the row offset farthest from zero (``harness.numerics.scenario``'s offsets)."""
    offset = max(s.logit_offsets, key=abs, default=0.0)
    if abs(offset) < OFFSET_NEAR_ZERO:
        return "near 0"
    sign = "-" if offset < 0 else "+"
    return f"{sign}3e4 or past" if abs(offset) >= OFFSET_FAR else f"{sign}1e3 to {sign}3e4"


def pool_elements(s: Scenario) -> int:
    """Elements of one layer's K tensor of the whole pool (pages x page x KV heads x D)."""
    return s.total_pages * s.page_size * s.num_kv_heads * s.head_dim


def _pool(s: Scenario) -> str:
    elements = pool_elements(s)
    if elements < 2**24:
        return "< 2^24"
    return "2^24-2^31" if elements < 2**31 else "2^31+"


def labels(s: Scenario) -> dict[str, str]:
    """The value of each dimension for one rank's step."""
    return {
        "dtype": dtype_name(s.dtype),
        "dp_size": bucket(s.dp_size, DP_BUCKETS),
        "rank": _rank_position(s),
        "layout": s.layout.value,
        "page_size": str(s.page_size),
        "head_dim": str(s.head_dim),
        "heads": heads_label(s),
        "batch": _batch_kind(s),
        "context": bucket(max(s.context_lens), CONTEXT_BUCKETS),
        "query": bucket(max(s.query_lens), QUERY_BUCKETS),
        "mask": "causal" if s.causal else "non-causal",
        "padding": "graph-padded" if s.graph_mode else "none",
        "shared_prefix": "shared" if s.shared_prefix else "none",
        "views": "strided" if s.noncontiguous else "dense",
        "cache": "combined K/V" if s.combined_kv else "separate K/V",
        "variant": _variant_label(s),
        "kv_cache": s.variant.kv_cache_dtype,
        "cache_layout": s.cache_layout,
        "tokens": bucket(sum(s.query_lens), TOKEN_BUCKETS),
        "logit_offset": _logit_offset(s),
        "values": s.values,
        "pool": _pool(s),
    }


VARIANT_NAMES = ("window", "soft-cap", "sinks", "alibi")


def _has_variant(name: str) -> Callable[[str], bool]:
    """Whether a ``variant`` label (``window+sinks``) includes ``name``."""
    return lambda label: name in label.split("+")


def _variant_label(s: Scenario) -> str:
    """The variants on in a step, joined by ``+`` (``plain`` when none)."""
    v = s.variant
    on = [
        name
        for name, flag in zip(
            VARIANT_NAMES,
            (v.sliding_window, v.logits_soft_cap, v.sinks, v.alibi_slopes),
            strict=True,
        )
        if flag is not None
    ]
    return "+".join(on) or "plain"


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
    if caps.head_dims is not None or caps.head_dim_multiple > 1 or caps.min_head_dim > 1:
        drawn = claimed_head_dims(caps, HEAD_DIMS)
        wanted += [_exactly("head_dim", str(d)) for d in _representative(drawn)]
    else:
        wanted += [
            Requirement("head_dim", "not a multiple of 8", lambda d: int(d) % 8 != 0),
            Requirement("head_dim", ">= 128", lambda d: int(d) >= 128),
        ]
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
    own_format = caps.page_format is not None  # the engine's tensor: K/V combined or not is its
    wanted += [_exactly("cache", v) for v in ("separate K/V", "combined K/V")[: 2 - own_format]]
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


def _pairs_row(totals: dict[str, Counter[str]], wanted: list[Requirement]) -> str:
    """Each pair's cells checked, as ``checked/claimed`` where a claim is promised."""
    cells = []
    for pair in PAIR_DIMENSIONS:
        claimed = [r for r in wanted if r.dimension == pair]
        if claimed:
            met = sum(r.met_by(totals[pair]) for r in claimed)
            cells.append(f"{pair} {met}/{len(claimed)}")
        elif totals[pair]:
            cells.append(f"{pair} {len(totals[pair])}")
    return "  ".join(cells)


def _empty_tally() -> dict[str, Counter[str]]:
    """A test's tally: every dimension and every pair (``PAIR_DIMENSIONS``), none counted."""
    return {d: Counter() for d in (*DIMENSIONS, *PAIR_DIMENSIONS)}


@dataclass
class StatefulRun:
    """One run of the stateful machine: forward steps taken, rules reached, rules skipped."""

    steps: int = 0
    reached: set[str] = field(default_factory=set)
    skipped: Counter[str] = field(default_factory=Counter)


@dataclass
class BackendCoverage:
    """Everything one backend's run exercised, per test and in total."""

    examples: Counter[str] = field(default_factory=Counter)  # per test
    by_test: dict[str, dict[str, Counter[str]]] = field(default_factory=dict)
    stateful: list[StatefulRun] = field(default_factory=list)

    def totals(self) -> dict[str, Counter[str]]:
        total: dict[str, Counter[str]] = {d: Counter() for d in (*DIMENSIONS, *PAIR_DIMENSIONS)}
        for dims in self.by_test.values():
            for dimension, counts in dims.items():
                total[dimension].update(counts)
        return total

    def missing(self, wanted: Iterable[Requirement]) -> list[Requirement]:
        totals = self.totals()
        return [r for r in wanted if not r.met_by(totals[r.dimension])]


def _quantile(values: list[int], q: float) -> float:
    if len(values) == 1:
        return float(values[0])
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def stateful_summary(runs: list[StatefulRun]) -> dict[str, Any]:
    """Steps per run (median, 10th percentile), runs reaching each rule, skips by reason."""
    if not runs:
        return {"runs": 0}
    steps = [r.steps for r in runs]
    reached: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    for run in runs:
        reached.update(run.reached)
        skipped.update(run.skipped)
    return {
        "runs": len(runs),
        "steps_median": statistics.median(steps),
        "steps_p10": _quantile(steps, 0.10),
        "reached": dict(sorted(reached.items())),
        "skipped": dict(sorted(skipped.items())),
    }


@dataclass
class CoverageLog:
    """The tally of one conformance session, per backend."""

    backends: dict[str, BackendCoverage] = field(default_factory=dict)

    def _backend(self, backend: str) -> BackendCoverage:
        return self.backends.setdefault(backend, BackendCoverage())

    def record(
        self, backend: str, test: str, scenarios: Iterable[Scenario], *, example: bool = True
    ) -> None:
        """One example of ``test`` that held: every rank's step in it.

        ``example=False`` counts the steps' dimensions only (a stateful run's
        steps; the run itself is counted once, by ``record_stateful``).
        """
        cover = self._backend(backend)
        cover.examples[test] += example
        dims = cover.by_test.setdefault(test, _empty_tally())
        for scenario in scenarios:
            for dimension, label in labels(scenario).items():
                dims[dimension][label] += 1
            for pair, cells in pair_cells(scenario).items():
                dims[pair].update(cells)

    def record_stateful(self, backend: str, test: str, run: StatefulRun) -> None:
        """One finished stateful run: an example of ``test``."""
        cover = self._backend(backend)
        cover.examples[test] += 1
        cover.stateful.append(run)

    def merge(self, other: CoverageLog) -> None:
        """Add another process's tally (a conformance worker's) to this one."""
        for name, theirs in other.backends.items():
            mine = self._backend(name)
            mine.examples.update(theirs.examples)
            for test, dims in theirs.by_test.items():
                own = mine.by_test.setdefault(test, _empty_tally())
                for dimension, counts in dims.items():
                    own.setdefault(dimension, Counter()).update(counts)
            mine.stateful.extend(theirs.stateful)

    def table(self, backend: str, wanted: Iterable[Requirement] = ()) -> list[str]:
        """A compact per-dimension table for the terminal, gaps last."""
        cover = self.backends[backend]
        totals = cover.totals()
        width = max(len(d) for d in DIMENSIONS)
        steps = sum(totals["dtype"].values())  # one count per rank's step, in every dimension
        lines = [
            f"coverage of {backend!r}: {sum(cover.examples.values())} examples held in "
            f"{len(cover.examples)} test function{'s' if len(cover.examples) != 1 else ''}, "
            f"{steps} rank-steps (counted below)"
        ]
        for dimension in DIMENSIONS:
            counts = totals[dimension]
            if not counts:
                continue
            cells = "  ".join(f"{label} {n}" for label, n in _ordered(counts))
            lines.append(f"  {dimension:<{width}}  {cells}")
        wanted = list(wanted)
        pairs = _pairs_row(totals, wanted)
        if pairs:
            lines.append(f"  {'pairs':<{width}}  {pairs}")
        if cover.stateful:
            summary = _stateful_line(stateful_summary(cover.stateful))
            lines.append(f"  {'stateful':<{width}}  {summary}")
        gaps = cover.missing(wanted)
        if gaps:
            lines.append(
                "  never checked, though claimed: "
                + "; ".join(f"{r.dimension} {r.wanted}" for r in gaps)
            )
        return lines

    def as_json(self, wanted: dict[str, list[Requirement]] | None = None) -> dict[str, Any]:
        """Plain data for the results and report tools.

        ``coverage_required`` says whether the run held this backend to the
        profile's promise (``wanted`` has an entry for it); without it,
        ``never_checked`` is empty because nothing was required.
        """
        wanted = wanted or {}
        out: dict[str, Any] = {}
        for name, cover in self.backends.items():
            gaps = cover.missing(wanted.get(name, []))
            out[name] = {
                "coverage_required": name in wanted,
                "examples": sum(cover.examples.values()),
                "examples_by_test": dict(sorted(cover.examples.items())),
                "dimensions": {d: dict(_ordered(c)) for d, c in cover.totals().items() if c},
                "by_test": {
                    test: {d: dict(_ordered(c)) for d, c in dims.items() if c}
                    for test, dims in sorted(cover.by_test.items())
                },
                "stateful": stateful_summary(cover.stateful),
                "never_checked": [f"{r.dimension}: {r.wanted}" for r in gaps],
            }
        return out


LABEL_ORDER = (
    *("none", "float32", "float16", "bfloat16", "only", "first", "middle", "last"),
    *("shared", "per_rank"),
    *("MHA", "GQA 2-8", "GQA 9+", "MQA", "decode", "prefill", "extend", "mixed", "spec-decode"),
    *("near 0", "-1e3 to -3e4", "-3e4 or past", "+1e3 to +3e4", "+3e4 or past"),
    *VALUE_REGIMES,
    *("< 2^24", "2^24-2^31", "2^31+"),
    *("causal", "non-causal", "graph-padded", "dense", "strided", "separate K/V"),
    "combined K/V",
    *("plain", "auto", "NHD", "HND"),
)
"""The order categorical labels are printed in, so every run's table reads the same."""


def _ordered(counts: Counter[str]) -> list[tuple[str, int]]:
    """Numeric labels in numeric order, the others in ``LABEL_ORDER``, then by name.

    Never the order labels were first seen: under several workers that is
    whichever worker merged first, and the table must not depend on it.
    """

    def key(item: tuple[str, int]) -> tuple[int, float, str]:
        label = item[0]
        head = label.split("-")[0].rstrip("+")
        if head.isdigit():
            return (0, float(head), label)
        known = label in LABEL_ORDER
        return (1, float(LABEL_ORDER.index(label) if known else len(LABEL_ORDER)), label)

    return sorted(counts.items(), key=key)


def _stateful_line(summary: dict[str, Any]) -> str:
    runs = summary["runs"]
    reached = ", ".join(f"{rule} {n}/{runs}" for rule, n in summary["reached"].items())
    line = (
        f"{runs} runs, forward steps per run median {summary['steps_median']:g} "
        f"(p10 {summary['steps_p10']:g}); runs reaching: {reached}"
    )
    skipped = summary["skipped"]
    if skipped:
        line += "; skipped: " + ", ".join(f"{why} {n}" for why, n in skipped.items())
    return line


def claim_summary(caps: Capabilities, scenarios: Iterable[Scenario]) -> str:
    """Each claimed capability next to the value the refused draw used."""

    def claim(values: Any) -> str:
        if values is None:
            return "any"
        return ", ".join(dtype_name(v) for v in values)

    parts = []
    for s in scenarios:
        parts.append(
            f"dtype {dtype_name(s.dtype)} (claims {claim(caps.dtypes)}), "
            f"device {s.device} (claims {claim(caps.devices)}), "
            f"page_size {s.page_size} (claims {claim(caps.page_sizes)}), "
            f"head_dim {s.head_dim} (claims {claim(caps.head_dims)}), "
            f"longest context {max(s.context_lens)} (max_seq_len {caps.max_seq_len or 'any'}), "
            f"dp_size {s.dp_size} (max_dp_size {caps.max_dp_size or 'any'}), "
            f"{'graph-mode padding' if s.graph_mode else 'no padding'} "
            f"(graph_mode {caps.graph_mode}), "
            f"{'causal' if s.causal else 'non-causal'} (non_causal {caps.non_causal}), "
            f"variant {s.variant.describe() or 'plain'} (sliding_window {caps.sliding_window}, "
            f"soft_cap {caps.soft_cap}, sinks {caps.sinks}, alibi {caps.alibi}, "
            f"kv_cache_dtypes {claim(caps.kv_cache_dtypes)}), "
            f"cache layout {s.cache_layout} (claims {claim(caps.cache_layouts)})"
        )
    return "; ".join(dict.fromkeys(parts))
