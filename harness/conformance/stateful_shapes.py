"""What one stateful run is made of: its geometry, DP group, longest context, prompts, chunks.

Two runs in three are small (``Budget``'s sizes), where shrinking lands. The
others take a production geometry
(``harness.conformance.strategies.production_geometries``) and prompts on
both sides of the kernels' thresholds (64 .. 4096 keys, page boundaries),
prefilled whole or in chunks past 64- and 128-row tiles, then decoded over
the cache the backend itself wrote in earlier steps. Its longest context is
what the profile's ``CostLimit`` affords for its heads: every prompt is
prefilled, so a run costs about a prefill of each of its sequences. Any run
may be in a real-model value regime, as the single-step properties are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hypothesis import strategies as st

from harness.conformance.production_shapes import LONG_CONTEXT, THRESHOLDS, CostLimit, both_sides
from harness.conformance.step_strategies import value_regime
from harness.conformance.strategies import Budget, balanced, geometries, production_geometries
from harness.core.contract import Capabilities
from harness.numerics.scenario import Scenario

MAX_LIVE = 4
"""Sequences one rank holds at once; pools hold this many of the longest."""
MAX_STATEFUL_DP = 8
"""Ranks in one small run: every step snapshots the whole pool, which grows with dp_size."""
PRODUCTION_DP = 4
"""Ranks in one production run, whose pools hold production-sized pages and contexts."""
STATEFUL_REGIMES = ("split-kv", "long-context", "page-sizes", "head-geometry", "spec-decode")
"""The production regimes whose thresholds a sequence crosses as it grows step by step."""
CHUNKS = (63, 64, 65, 127, 128, 129, 256, 257)
"""Chunked-prefill sizes of a production run: both sides of a kernel's query tiles."""
PRODUCTION_ONE_IN = 3
"""Runs of a production shape: one in this many (at most ``Budget.production_rate``). A run
is a few seconds at most, and a bug in what one step writes and a later one reads at
production sizes shows only here and in the partition property."""
DECODE_ROOM = 4
"""Tokens every prompt leaves free below the longest context, to decode."""


@dataclass(frozen=True)
class RunShape:
    """One stateful run's fixed sizes; ``regime`` names a production run (``None``: small)."""

    geometry: Scenario
    dp_size: int
    max_context: int
    regime: str | None = None

    def prompts(self) -> st.SearchStrategy[int]:
        """Prompt lengths: any up to the longest, or the thresholds' neighbours in production."""
        top = max(1, self.max_context - DECODE_ROOM)
        if self.regime is None:
            return st.integers(1, top)
        page = self.geometry.page_size
        edges = (*both_sides(THRESHOLDS), *(page * n + d for n in (1, 2, 3) for d in (-1, 0, 1)))
        return balanced(sorted({e for e in edges if 1 <= e <= top} | {top}))

    def chunks(self, most: int) -> st.SearchStrategy[int]:
        """A chunk of a prompt with ``most`` tokens left: past a query tile in production."""
        tiles = tuple(c for c in CHUNKS if c < most) if self.regime is not None else ()
        return balanced((*tiles, most)) if tiles else st.integers(1, most)


def production_context(g: Scenario, dp_size: int, limit: CostLimit, claimed: int) -> int:
    """The longest context a production run of ``g`` affords under ``limit``.

    A prefill of ``L`` keys costs about ``L^2 / 2`` multiply-adds per query
    head, dim and layer (the oracle's and the backend's), and the pool holds
    ``MAX_LIVE`` sequences of it on each of ``dp_size`` ranks.
    """
    per_key = g.num_heads * g.head_dim * g.num_layers
    by_work = math.isqrt(2 * limit.work // per_key)
    by_pool = limit.max_tokens(g.num_kv_heads, g.head_dim) // (MAX_LIVE * dp_size)
    return max(1, min(claimed, by_work, by_pool))


@st.composite
def run_shapes(
    draw: st.DrawFn, caps: Capabilities, budget: Budget, device: str, max_dp: int
) -> RunShape:
    """A small run, or one in ``PRODUCTION_ONE_IN`` a production one, inside ``caps``."""
    rate = min(budget.production_rate, PRODUCTION_ONE_IN) if budget.production_rate else 0
    claimed = caps.max_seq_len or LONG_CONTEXT
    if rate and draw(balanced(range(rate))) == rate - 1:
        regime = draw(balanced(STATEFUL_REGIMES))
        g = draw(production_geometries(caps, regime, device))
        g = replace(g, num_layers=draw(st.integers(1, 2)))
        dp_size = draw(st.integers(1, min(max_dp, PRODUCTION_DP)))
        longest = production_context(g, dp_size, budget.production, claimed)
    else:
        regime = None
        g = draw(geometries(caps, budget, device))
        dp_size = draw(st.integers(1, max_dp))
        longest = min(budget.max_context, claimed)
    g = replace(g, seed=draw(st.integers(0, 2**16)))
    return RunShape(value_regime(draw, caps, g), dp_size, longest, regime)
