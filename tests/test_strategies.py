"""Strategies draw only inside a backend's claim and reach every dimension the suite promises."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.conformance.step_strategies import multi_rank_scenarios, scenarios
from harness.conformance.strategies import Budget
from harness.core.contract import Capabilities
from harness.core.kv_pages import PoolLayout, dp_page_range
from harness.core.validate import check_rank_ownership, validate_metadata
from harness.numerics.scenario import make_step_inputs

NARROW = Capabilities(
    dtypes=(torch.float16,),
    page_sizes=(16,),
    head_dims=(64,),
    max_seq_len=20,
    graph_mode=False,
    non_causal=False,
    max_dp_size=2,
)
FAST = settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


@FAST
@given(scenarios(NARROW))
def test_draws_stay_inside_a_narrow_claim(s):
    assert s.dtype == torch.float16
    assert s.page_size == 16
    assert s.head_dim == 64
    assert max(s.context_lens) <= 20
    assert not s.graph_mode
    assert s.causal
    assert s.dp_size <= 2
    # fp16 keeps the scaled logits in range; only the tiny-scale regime's raw q.k leaves it
    assert s.magnitude <= 8.0 or s.values == "tiny-scale"


@FAST
@given(scenarios(Capabilities()), st.data())
def test_drawn_steps_are_valid_for_their_rank(s, data):
    inputs = make_step_inputs(s)
    checked = validate_metadata(
        inputs.step.metadata,
        page_size=s.page_size,
        total_pages=s.total_pages,
        graph_mode=s.graph_mode,
    )
    check_rank_ownership(
        checked,
        page_size=s.page_size,
        page_range=dp_page_range(s.total_pages, s.dp_size, s.dp_rank),
    )
    assert s.num_heads % s.num_kv_heads == 0
    assert s.num_heads // s.num_kv_heads >= 1
    assert all(q <= c for c, q in zip(s.context_lens, s.query_lens, strict=True))


@FAST
@given(scenarios(Capabilities(), dp_aware=False))
def test_non_dp_backends_get_one_rank(s):
    assert s.dp_size == 1


@FAST
@given(multi_rank_scenarios(Capabilities()))
def test_multi_rank_draws_cover_every_rank_of_one_pool(ranks):
    assert [s.dp_rank for s in ranks] == list(range(ranks[0].dp_size))
    assert len({(s.total_pages, s.page_size, s.num_heads, s.dtype) for s in ranks}) == 1


def test_strategies_reach_every_feature():
    """Over many draws, each drawn dimension shows up."""
    seen: dict[str, set[object]] = {
        k: set()
        for k in (
            "dp",
            "page",
            "group",
            "dtype",
            "kind",
            "layout",
            "graph",
            "shared",
            "strided",
            "divisible",
            "odd_dim",
            "boundary",
            "magnitude",
            "scale",
            "causal",
            "combined",
            "planted",
            "production",
        )
    }

    @settings(max_examples=400, deadline=None, database=None, derandomize=True)
    @given(scenarios(Capabilities(), budget=Budget()))
    def collect(s):
        seen["dp"].add(s.dp_size)
        seen["page"].add(s.page_size)
        seen["group"].add(s.num_heads // s.num_kv_heads)
        seen["dtype"].add(s.dtype)
        kinds = {
            "decode" if q == 1 else "prefill" if q == c else "extend"
            for c, q in zip(s.context_lens, s.query_lens, strict=True)
        }
        seen["kind"].add(frozenset(kinds))
        seen["layout"].add(s.layout)
        seen["graph"].add(s.graph_mode)
        seen["shared"].add(s.shared_prefix > 0)
        seen["strided"].add(s.noncontiguous)
        seen["divisible"].add(s.total_pages % s.dp_size == 0)
        seen["odd_dim"].add(s.head_dim % 2 == 1)
        seen["boundary"].add(any(c % s.page_size == 0 for c in s.context_lens))
        seen["magnitude"].add(s.magnitude > 1)
        seen["scale"].add(s.scale is not None)
        seen["causal"].add(s.causal)
        seen["combined"].add(s.combined_kv)
        seen["planted"].add(s.planted_keys > 0)
        seen["production"].add(max(s.context_lens) > 256 or s.page_size >= 32)

    collect()
    assert {1, 2, 3, 4} <= seen["dp"]
    assert any(dp > 8 for dp in seen["dp"])
    assert {1, 3, 5, 7, 16} <= seen["page"]
    assert {1, 8} <= seen["group"]
    assert {torch.float32, torch.float16, torch.bfloat16} <= seen["dtype"]
    assert any(len(k) > 1 for k in seen["kind"])  # mixed batches
    assert {frozenset({"decode"}), frozenset({"prefill"}), frozenset({"extend"})} <= seen["kind"]
    assert seen["layout"] == set(PoolLayout)
    for flag in (
        "graph",
        "shared",
        "strided",
        "divisible",
        "odd_dim",
        "boundary",
        "magnitude",
        "scale",
        "causal",
        "combined",
        "planted",
        "production",
    ):
        assert seen[flag] == {True, False}, flag


def test_a_scenario_of_many_sequences_is_described_in_one_short_line():
    from dataclasses import replace

    import torch

    from harness.numerics.scenario import MAX_ROWS_SHOWN, Scenario

    many = Scenario(
        num_heads=2,
        num_kv_heads=1,
        head_dim=8,
        page_size=4,
        total_pages=400,
        num_layers=1,
        context_lens=tuple(range(1, 65)),
        query_lens=(1,) * 64,
        dtype=torch.float32,
    )
    text = many.describe()
    assert "rows (q/L) [1/1, 1/2, 1/3, 1/4, ... 58 more ..., 1/63, 1/64]" in text
    assert len(text) < 200
    few = replace(many, context_lens=(5,) * MAX_ROWS_SHOWN, query_lens=(1,) * MAX_ROWS_SHOWN)
    assert "..." not in few.describe()
    assert few.describe().count("1/5") == MAX_ROWS_SHOWN
