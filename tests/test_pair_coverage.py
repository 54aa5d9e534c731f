"""Pairwise coverage: the covering steps hold every claimed cell of every pair, each within
the cost limit and inside the claim, and a step's cells are read as the pairs name them."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from harness.conformance.claim_coverage import CoverageLog
from harness.conformance.coverage_promises import requirements
from harness.conformance.pair_coverage import (
    PAIR_DIMENSIONS,
    claimed_cells,
    covering_steps,
    pair_cells,
)
from harness.conformance.production_shapes import CostLimit
from harness.core.contract import Capabilities
from harness.core.kv_pages import pages_needed
from harness.core.registry import default_registry
from harness.core.variants import AttentionVariant
from harness.numerics.scenario import Scenario

LIMIT = CostLimit()
CLAIMS = {
    "any": Capabilities(),
    "reference": default_registry().entry("reference").capabilities,
    "narrow": Capabilities(
        dtypes=(torch.float16,),
        page_sizes=(16, 64),
        head_dims=(128,),
        max_seq_len=3000,
        graph_mode=False,
    ),
    "fp8 only": Capabilities(kv_cache_dtypes=("fp8_e4m3",), sliding_window=True),
    "page multiple of 16": Capabilities(page_size_multiple=16, head_dim_multiple=8),
}


def held(steps: list[Scenario]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {name: set() for name in PAIR_DIMENSIONS}
    for s in steps:
        for name, cells in pair_cells(s).items():
            found[name] |= set(cells)
    return found


@pytest.mark.parametrize("claim", CLAIMS.values(), ids=CLAIMS.keys())
def test_the_covering_steps_hold_every_claimed_cell_within_the_limit(claim):
    steps = covering_steps(claim, LIMIT)
    found = held(steps)
    for name, cells in claimed_cells(claim, LIMIT).items():
        assert set(cells) <= found[name], f"{name}: {sorted(set(cells) - found[name])}"
    for s in steps:
        slots = sum(pages_needed(c, s.page_size) * s.page_size for c in s.context_lens)
        work = sum(q * c for q, c in zip(s.query_lens, s.context_lens, strict=True))
        assert slots * s.num_kv_heads * s.head_dim <= LIMIT.cache_elements, s.describe()
        assert work * s.num_heads * s.head_dim <= LIMIT.work, s.describe()
        reason = claim.unsupported_reason(
            dtype=s.dtype,
            page_size=s.page_size,
            head_dim=s.head_dim,
            seq_len=max(s.context_lens),
            graph_mode=s.graph_mode,
            sliding_window=s.variant.sliding_window is not None,
            kv_cache_dtype=s.variant.kv_cache_dtype,
            cache_layout=s.cache_layout,
        )
        assert reason is None, f"{reason}: {s.describe()}"


def test_the_pairs_reach_past_a_grid_dimension_and_long_equal_contexts():
    steps = covering_steps(Capabilities(), LIMIT)
    assert any(len(s.context_lens) > 65535 for s in steps)
    assert any(len(s.context_lens) > 1000 and min(s.context_lens) > 256 for s in steps)
    assert any(len(s.context_lens) >= 9 and min(s.context_lens) > 32768 for s in steps)
    assert len(steps) < 60  # a covering, not every cell on its own


def test_a_claim_narrows_the_cells():
    narrow = claimed_cells(CLAIMS["narrow"], LIMIT)
    assert not any(c.endswith("32769+") for c in narrow["page x context"])  # max_seq_len 3000
    assert not any("graph-padded" in c for c in narrow["query x feature"])
    assert {c.split(" & ")[1] for c in narrow["heads x head_dim"]} == {"128"}
    tight = claimed_cells(Capabilities(), CostLimit(cache_elements=2**18, work=2**22))
    full = claimed_cells(Capabilities(), LIMIT)
    assert set(tight["sequences x context"]) < set(full["sequences x context"])
    assert "65536+ & 1-64" not in tight["sequences x context"]  # 65536 slots x 13 > 2^18


def test_a_steps_cells_name_both_axes():
    s = Scenario(
        context_lens=(300, 40),
        query_lens=(1, 40),
        page_size=16,
        dtype=torch.float16,
        pad_to=3,
        variant=AttentionVariant(sliding_window=4),
        values="massive-v",
    )
    cells = pair_cells(s)
    assert cells["sequences x context"] == ["2-8 & 257-1024"]
    assert cells["page x context"] == ["16 & 257-1024"]
    assert cells["heads x head_dim"] == ["GQA 2-8 & 1-63"]
    assert cells["query x feature"] == ["2-64 & window", "2-64 & graph-padded"]
    assert cells["dtype x values"] == ["float16 & massive-v"]


def test_unchecked_claimed_cells_are_reported_as_never_checked():
    caps = default_registry().entry("reference").capabilities
    wanted = requirements(
        caps, dp_aware=True, max_dp_size=16, max_context=40, limit=LIMIT, large_pool=False
    )
    log = CoverageLog()
    steps = covering_steps(caps, LIMIT)
    log.record("reference", "test_pairwise", steps[1:])  # the 65536-sequence step left out
    gaps = {(r.dimension, r.wanted) for r in log.backends["reference"].missing(wanted)}
    assert ("sequences x context", "65536+ & 1-64") in gaps
    table = "\n".join(log.table("reference", wanted))
    assert "sequences x context 26/27" in table
    assert "sequences x context 65536+ & 1-64" in table  # named among the never checked
    log.record("reference", "test_pairwise", steps[:1])
    assert ("sequences x context", "65536+ & 1-64") not in {
        (r.dimension, r.wanted) for r in log.backends["reference"].missing(wanted)
    }


def test_a_step_without_its_first_cells_keeps_its_pairs():
    """Cells are per step: a step changed in one axis changes only the pairs of that axis."""
    s = Scenario(context_lens=(40,), query_lens=(1,))
    cells = pair_cells(s)
    other = pair_cells(replace(s, dtype=torch.bfloat16))
    assert cells["page x context"] == other["page x context"]
    assert cells["dtype x values"] != other["dtype x values"]
