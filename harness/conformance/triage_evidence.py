"""What the failure triage records of each example: its labels, held or failed, per test.

Every checked example is labelled along the coverage dimensions
(``claim_coverage.labels``) and a few of the triage's own
(``TRIAGE_DIMENSIONS``); the ``TriageLog`` counts, per backend and test, the
labelled examples that held and those that failed.

``harness.conformance.triage`` reads this evidence and names causes.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from harness.conformance.claim_coverage import DIMENSIONS, labels
from harness.core.kv_pages import pages_needed

DIMENSION_WORDS = {
    "dtype": "dtype",
    "dp_size": "dp_size",
    "rank": "rank position",
    "layout": "pool layout",
    "page_size": "page size",
    "head_dim": "head dim",
    "heads": "head grouping",
    "batch": "batch kind",
    "context": "context length",
    "query": "query length",
    "mask": "mask",
    "padding": "graph padding",
    "shared_prefix": "shared prefix pages",
    "views": "query/key/value views",
    "cache": "cache tensors",
    "variant": "variant",
    "kv_cache": "KV cache dtype",
    "cache_layout": "cache layout",
    "tokens": "new tokens per step",
    "logit_offset": "logit offset",
    "values": "value regime",
    "pool": "pool elements",
    "sequences": "sequences per step",
    "layers": "layers",
    "scale": "scale",
    "pool_pages": "pool pages",
    "sequence_pages": "pages per sequence",
    "page_order": "page order",
    "last_page": "last page",
    "case": "test case",
    "magnitude": "q/k magnitude",
    "planted": "planted large logits",
    "window": "sliding window",
    "soft_cap": "soft-cap",
    "sinks": "sinks",
    "alibi": "ALiBi",
    "group": "query heads per KV head",
    "rank_index": "rank index",
}
"""How each dimension reads in a sentence."""

TRIAGE_DIMENSIONS = (
    *DIMENSIONS,
    "sequences",
    "layers",
    "scale",
    "window",
    "soft_cap",
    "sinks",
    "alibi",
    "last_page",
    "sequence_pages",
    "page_order",
    "magnitude",
    "planted",
    "case",
    "pool_pages",
    "group",
    "rank_index",
)
"""The coverage dimensions, and a few more that only the triage needs: bugs that live in
the batch size, the layer index, the scale, one attention variant whatever it is combined
with (``variant`` names the combination), page ids past int16, where pages lie, the
logits' size, in one parametrization of a test (a production regime: ``case``), or past
a power of two of the GQA group or of the rank index (a kernel that packs 8 query heads,
a rank kept in 3 bits: ``group``, ``rank_index``)."""


def count_bucket(n: int) -> str:
    """``n >= 1`` by powers of two, each bucket ending on one: 1, 2, 3-4, 5-8, 9-16, ..."""
    if n <= 2:
        return str(n)
    k = (n - 1).bit_length()
    return f"{2 ** (k - 1) + 1}-{2**k}"


def index_bucket(i: int) -> str:
    """``i >= 0`` by powers of two, each bucket starting on one: 0, 1, 2-3, 4-7, 8-15, ..."""
    if i <= 1:
        return str(i)
    k = i.bit_length()
    return f"{2 ** (k - 1)}-{2**k - 1}"


def _sequences(rows: int) -> str:
    if rows <= 1:
        return "1"
    return "2-8" if rows <= 8 else ("9-64" if rows <= 64 else "65+")


def _default_scale(s: Any) -> bool:
    return math.isclose(s.softmax_scale, 1.0 / math.sqrt(s.head_dim), rel_tol=1e-9)


def triage_labels(s: Any) -> dict[str, str]:
    """One rank's step along every triage dimension (``labels`` and the triage's own)."""
    pages = [pages_needed(length, s.page_size) for length in s.context_lens]
    v = s.variant
    return {
        **labels(s),
        "sequences": _sequences(len(s.context_lens)),
        "layers": "1" if s.num_layers == 1 else "2+",
        "scale": "1/sqrt(head dim)" if _default_scale(s) else "other",
        "pool_pages": "2^15+" if s.total_pages >= 2**15 else "< 2^15",
        "sequence_pages": "2+" if max(pages, default=0) >= 2 else "1",
        "page_order": "shuffled" if s.shuffle_pages else "in order",
        "magnitude": f"{s.magnitude:g}",
        "planted": "planted" if s.planted_keys else "none",
        "group": count_bucket(s.num_heads // s.num_kv_heads),
        "rank_index": index_bucket(s.dp_rank),
        **{
            name: "on" if flag is not None else "off"
            for name, flag in zip(
                ("window", "soft_cap", "sinks", "alibi"),
                (v.sliding_window, v.logits_soft_cap, v.sinks, v.alibi_slopes),
                strict=True,
            )
        },
        "last_page": (
            "ends mid-page" if any(length % s.page_size for length in s.context_lens) else "full"
        ),
    }


ExampleKey = tuple[tuple[str, frozenset[str]], ...]
"""One example's labels: ``(dimension, labels of its rank steps)`` for every dimension."""


def example_key(scenarios: Iterable[Any], named: dict[str, str] | None = None) -> ExampleKey:
    """The labels of one example (every rank's step of it), hashable; ``named`` replaces
    labels by the caller's own (the quick check's batch names)."""
    found: dict[str, set[str]] = {d: set() for d in TRIAGE_DIMENSIONS}
    for scenario in scenarios:
        for dimension, label in triage_labels(scenario).items():
            found[dimension].add(label)
    for dimension, label in (named or {}).items():
        found[dimension] = {label}
    return tuple((d, frozenset(found[d])) for d in TRIAGE_DIMENSIONS if found[d])


@dataclass
class TestEvidence:
    """The labelled examples of one backend's test: how many held, how many failed."""

    held: Counter[ExampleKey] = field(default_factory=Counter)
    failed: Counter[ExampleKey] = field(default_factory=Counter)


@dataclass
class TriageLog:
    """Every labelled example of a run, per backend and test (held and failed)."""

    backends: dict[str, dict[str, TestEvidence]] = field(default_factory=dict)

    def _evidence(self, backend: str, test: str) -> TestEvidence:
        return self.backends.setdefault(backend, {}).setdefault(test, TestEvidence())

    def held(
        self, backend: str, test: str, scenarios: Iterable[Any], named: dict[str, str] | None = None
    ) -> None:
        key = example_key(scenarios, named)
        if key:
            self._evidence(backend, test).held[key] += 1

    def failed(
        self, backend: str, test: str, scenarios: Iterable[Any], named: dict[str, str] | None = None
    ) -> None:
        key = example_key(scenarios, named)
        if key:
            self._evidence(backend, test).failed[key] += 1

    def merge(self, other: TriageLog) -> None:
        """Add another process's evidence (a conformance worker's) to this one."""
        for backend, tests in other.backends.items():
            for test, theirs in tests.items():
                mine = self._evidence(backend, test)
                mine.held.update(theirs.held)
                mine.failed.update(theirs.failed)

    def tests(self, backend: str) -> dict[str, TestEvidence]:
        return self.backends.get(backend, {})
