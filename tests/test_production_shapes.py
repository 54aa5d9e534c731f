"""Production-shape strategies: inside the claim, inside the cost limit, past each threshold."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.conformance.production_shapes import REGIMES, CostLimit, both_sides
from harness.conformance.step_strategies import production_scenarios
from harness.conformance.strategies import CI_BUDGET
from harness.core.contract import Capabilities
from harness.core.kv_pages import PoolLayout, dp_page_range, pages_needed
from harness.core.registry import default_registry
from harness.numerics.logit_shaping import plant_positions
from harness.numerics.scenario import Scenario, backend_for, make_step_inputs

DRAWS = settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
NARROW = Capabilities(
    dtypes=(torch.float16,), page_sizes=(16, 64), head_dims=(128,), max_seq_len=3000, max_dp_size=4
)


ANY = Capabilities()


def collect(regime: str, caps: Capabilities = ANY, examples: int = 40) -> list[Scenario]:
    drawn: list[Scenario] = []

    @settings(DRAWS, max_examples=examples)
    @given(production_scenarios(caps, regime))
    def record(s: Scenario) -> None:
        drawn.append(s)

    record()
    return drawn


def _cost(s: Scenario) -> tuple[int, int]:
    held = s.total_pages
    if s.layout is PoolLayout.PER_RANK:
        held = len(dp_page_range(s.total_pages, s.dp_size, s.dp_rank))
    elements = held * s.page_size * s.num_kv_heads * s.head_dim
    work = sum(
        s.num_heads * q * c * s.head_dim for c, q in zip(s.context_lens, s.query_lens, strict=True)
    )
    return elements, work


def test_both_sides_of_each_threshold():
    assert both_sides((64,)) == (63, 64, 65)


@given(regime=st.sampled_from(REGIMES), data=st.data())
@settings(DRAWS, max_examples=60)
def test_draws_stay_inside_a_narrow_claim(regime, data):
    s = data.draw(production_scenarios(NARROW, regime))
    assert s.dtype == torch.float16
    assert s.page_size in (16, 64)
    assert s.head_dim == 128
    assert max(s.context_lens) <= 3000
    assert s.dp_size <= 4


@given(regime=st.sampled_from(REGIMES), data=st.data())
@settings(DRAWS, max_examples=60)
def test_draws_are_valid_steps_within_the_cost_limit(regime, data):
    s = data.draw(production_scenarios(Capabilities(), regime))
    limit = CI_BUDGET.production
    elements, work = _cost(s)
    slack = len(s.context_lens) * s.page_size * s.num_kv_heads * s.head_dim  # page rounding
    assert elements <= limit.cache_elements + slack * s.dp_size + 4 * s.page_size * 2**12
    assert work <= limit.work
    assert all(1 <= q <= c for c, q in zip(s.context_lens, s.query_lens, strict=True))


def test_each_regime_reaches_past_its_thresholds():
    reach = {regime: collect(regime) for regime in REGIMES}
    contexts = [c for s in reach["split-kv"] for c in s.context_lens]
    assert {63, 65, 255, 257, 4095, 4097} & set(contexts)
    assert any(c > 256 for c in contexts)
    assert any(c < 256 for c in contexts)
    assert any(c >= 32768 for s in reach["long-context"] for c in s.context_lens)
    queries = [q for s in reach["query-tiles"] for q in s.query_lens]
    assert any(q > 128 for q in queries)
    assert any(64 < q <= 128 for q in queries)
    assert any(len(s.context_lens) >= 64 for s in reach["many-sequences"])
    heads = reach["head-geometry"]
    assert any(s.num_heads // s.num_kv_heads > 8 for s in heads)
    assert any(s.num_kv_heads == 1 and s.num_heads >= 32 for s in heads)
    assert any(s.head_dim == 256 for s in heads)
    assert any(s.page_size >= 128 for s in reach["page-sizes"])
    groups = reach["dp-groups"]
    assert any(s.dp_size > 8 and s.dp_rank >= 8 for s in groups)
    assert any(s.total_pages % s.dp_size for s in groups)


def test_dp_groups_reach_page_ids_past_int16():
    found = False
    reference = default_registry().entry("reference")
    for s in collect("dp-groups", examples=60):
        inputs = make_step_inputs(s)
        found |= bool((inputs.step.metadata.block_table >= 2**15).any())
        backend = backend_for(reference, s)  # its prepare validates the step and ownership
        backend.bind_kv_caches(inputs.caches)
        backend.prepare(inputs.step.metadata, graph_mode=s.graph_mode)
    assert found


def test_cost_limit_sizes():
    limit = CostLimit(cache_elements=1024, work=4096)
    assert limit.max_tokens(2, 64) == 8
    assert limit.max_query_context(4, 8) == 128


def test_planted_positions_are_boundaries():
    positions = plant_positions(300, 16, range(300))
    assert {0, 299, 15, 16, 63, 64, 255, 256} <= set(positions)
    assert plant_positions(300, 16, range(100, 300))[0] >= 100


def test_planted_keys_hold_large_weight_and_do_not_change_other_draws():
    base = Scenario(
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        page_size=16,
        total_pages=80,
        num_layers=1,
        context_lens=(1024,),
        query_lens=(1,),
        seed=3,
    )
    plain = make_step_inputs(base)
    planted = make_step_inputs(Scenario(**{**base.__dict__, "planted_keys": 1}))
    key, plain_key = planted.sequences[0][0].key, plain.sequences[0][0].key
    changed = (key != plain_key).any(-1).any(-1).nonzero().flatten().tolist()
    assert len(changed) == 1  # one planted key; every other key is the same draw
    assert changed[0] in plant_positions(1024, 16, range(1024))
    q = planted.queries[0][0].double()  # [H, D]
    logits = (
        torch.einsum("hd,lhd->hl", q, key.double().repeat_interleave(4, 1)) * base.softmax_scale
    )
    gap = logits[:, changed[0]] - logits.median(dim=1).values
    assert (gap > 4).all()  # the planted key stands out for every head
    assert pages_needed(1024, 16) <= base.total_pages


def test_production_geometries_run_at_served_models_scales():
    """Granite's 1/128, Gemma-2 27B's 1/12 and DeepSeek-V3's YaRN scale, beside the default."""
    drawn = {s.scale for regime in ("split-kv", "head-geometry") for s in collect(regime)}
    assert None in drawn
    assert {0.0078125, 144.0**-0.5} <= drawn, drawn
