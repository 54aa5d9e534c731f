"""What a conformance run exercised: examples counted along each dimension of the inputs.

A property holds only for the inputs it was given. A backend that refuses
whole regions of its claim, or a strategy that never reaches them, would
otherwise pass on a fraction of what it promises, and nothing would say so.
So every checked example is tallied by dimension (dtype, DP size, rank
position, layout, page size, ...); the run prints the tally, writes it as
JSON and JUnit properties, and fails when a value the backend claims and the
profile promises to reach was never checked.

Public: ``DIMENSIONS``, ``labels``, ``StatefulRun``, ``CoverageLog``, ``claim_summary``
(what a run promises: ``harness.conformance.coverage_promises``).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from harness.conformance.buckets import (
    CONTEXT_BUCKETS,
    DP_BUCKETS,
    MLA_HEAD_LABELS,
    QUERY_BUCKETS,
    TOKEN_BUCKETS,
    bucket,
    heads_label,
)
from harness.conformance.coverage_promises import VARIANT_NAMES, Requirement
from harness.conformance.pair_coverage import PAIR_DIMENSIONS, pair_cells
from harness.core.contract import Capabilities
from harness.core.dtypes import dtype_name
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
    "latent",
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


def _latent(s: Scenario) -> str:
    """An MLA step's ``kv_lora_rank+rope_dim``; ``none`` for MHA."""
    if s.kv_lora_rank is None:
        return "none"
    return f"{s.kv_lora_rank}+{s.head_dim - s.kv_lora_rank}"


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
        "latent": _latent(s),
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
    *(
        "MHA",
        "GQA 2-8",
        "GQA 9+",
        "MQA",
        *MLA_HEAD_LABELS,
        "decode",
        "prefill",
        "extend",
        "mixed",
        "spec-decode",
    ),
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
