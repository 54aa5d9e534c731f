"""The shapes engines run every day are drawn, counted and exact: speculative-decoding steps,
rows whose logits lie far from zero, steps past engines' token budgets, pools past 2^31."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.conformance.claim_coverage import labels
from harness.conformance.large_pool import (
    INT32_ELEMENTS,
    WATCHED_PAGES,
    large_pool_inputs,
    large_pool_scenario,
    tensor_bytes,
    unavailable_reason,
)
from harness.conformance.production_shapes import SPEC_GROUPS, TOKEN_BUDGETS
from harness.conformance.profiles import get_profile
from harness.conformance.step_strategies import production_scenarios, scenarios
from harness.conformance.strategies import CI_BUDGET
from harness.core.contract import Capabilities
from harness.core.kv_pages import pages_needed
from harness.core.registry import default_registry
from harness.numerics.logit_shaping import logit_offset_limit
from harness.numerics.oracle import SequenceKV
from harness.numerics.scenario import (
    Scenario,
    backend_for,
    check_outputs,
    make_step_inputs,
    run_scenario,
)

CI = get_profile("ci").settings
ALL = default_registry().entry("reference").capabilities  # claims every variant


def collect(strategy: st.SearchStrategy[Scenario], examples: int) -> list[Scenario]:
    drawn: list[Scenario] = []

    @settings(CI, max_examples=examples, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def record(s: Scenario) -> None:
        drawn.append(s)

    record()
    return drawn


# -- speculative-decoding steps ---------------------------------------------------------


def _uniform(s: Scenario) -> int | None:
    """The common query length of a spec-decode step, else ``None``."""
    return s.query_lens[0] if labels(s)["batch"] == "spec-decode" else None


def test_plain_draws_include_spec_decode_steps_at_every_query_length():
    drawn = collect(scenarios(ALL), 1500)
    lengths = Counter(q for s in drawn if (q := _uniform(s)) is not None)
    assert set(lengths) == set(range(2, 9)), lengths
    assert sum(lengths.values()) >= 0.05 * len(drawn)


def test_spec_decode_regime_reaches_real_models_groups_over_long_contexts():
    drawn = collect(production_scenarios(ALL, "spec-decode"), 300)
    assert all(_uniform(s) is not None for s in drawn)
    groups = {s.num_heads // s.num_kv_heads for s in drawn}
    assert set(SPEC_GROUPS) <= groups, groups
    assert any(s.num_kv_heads == 1 and s.num_heads >= 32 for s in drawn)  # MQA
    assert any(max(s.context_lens) > 4096 for s in drawn)
    assert any(not s.variant.is_plain for s in drawn)  # sinks, windows, soft-caps on too
    assert {q for s in drawn if (q := _uniform(s))} == set(range(2, 9))


def test_plain_spec_decode_steps_reach_gqa_8_with_three_to_seven_tokens():
    """The draws the issue counted none of in 1500: q = 3, 5, 6 or 7 over 2+ rows at GQA 8."""
    drawn = collect(scenarios(ALL), 1500)
    at_gqa_8 = Counter(
        _uniform(s) for s in drawn if _uniform(s) and s.num_heads // s.num_kv_heads == 8
    )
    assert sum(at_gqa_8[q] for q in (3, 5, 6, 7)) >= 5, at_gqa_8


# -- logits far from zero -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "offset"),
    [(torch.float32, -1e5), (torch.float32, 1e5), (torch.bfloat16, -3.5e4), (torch.float16, -3e3)],
)
def test_offsets_move_every_logit_of_a_row_exactly(dtype, offset):
    s = Scenario(
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        context_lens=(9, 30),
        query_lens=(1, 12),
        dtype=dtype,
        logit_offsets=(offset, 0.0),
        planted_keys=1,
    )
    inputs = make_step_inputs(s)
    query = inputs.queries[0].double()
    for row, (tokens, seq) in enumerate(((slice(0, 1), 0), (slice(1, 13), 1))):
        kv: SequenceKV = inputs.sequences[0][seq]
        keys = kv.key.double().repeat_interleave(2, dim=1)  # [L, H, D]
        logits = torch.einsum("qhd,lhd->hql", query[tokens], keys) * s.softmax_scale
        target = offset if row == 0 else 0.0
        assert (logits - target).abs().max() < 200, (row, logits.max(), logits.min())
    reference = default_registry().entry("reference")
    inputs, outputs = run_scenario(lambda sc: backend_for(reference, sc), s)
    assert all(c.passed for c in check_outputs(inputs, outputs))


def test_offsets_stay_inside_what_the_dtype_holds():
    fp16 = Scenario(dtype=torch.float16, head_dim=128)
    assert logit_offset_limit(fp16) == pytest.approx(65504 / 2 / 128**0.5)
    assert logit_offset_limit(replace(fp16, dtype=torch.bfloat16)) == 1e5
    drawn = collect(scenarios(ALL), 600)
    assert all(max(map(abs, s.logit_offsets), default=0) <= logit_offset_limit(s) for s in drawn)
    buckets = Counter(labels(s)["logit_offset"] for s in drawn)
    assert {"-3e4 or past", "+3e4 or past", "-1e3 to -3e4", "+1e3 to +3e4", "near 0"} <= set(
        buckets
    ), buckets


# -- steps past engines' token budgets --------------------------------------------------------


def test_token_budget_steps_reach_every_budget_within_the_cost_limit():
    drawn = collect(production_scenarios(ALL, "token-budget"), 60)
    limit = CI_BUDGET.production
    tokens = [sum(s.query_lens) for s in drawn]
    for budget in TOKEN_BUDGETS:
        assert any(budget <= t <= budget + 64 for t in tokens), (budget, sorted(tokens))
    for s in drawn:
        slots = sum(pages_needed(c, s.page_size) * s.page_size for c in s.context_lens)
        assert slots * s.num_kv_heads * s.head_dim <= limit.cache_elements
        work = sum(q * c for q, c in zip(s.query_lens, s.context_lens, strict=True))
        assert work * s.num_heads * s.head_dim <= limit.work
        assert len(s.context_lens) >= 64  # many short rows, not a few long ones
        assert any(q == 1 for q in s.query_lens)
        assert max(s.query_lens) >= 64


def test_tokens_per_step_are_counted_in_buckets():
    s = Scenario(context_lens=(64,) * 129, query_lens=(64,) * 129, total_pages=129 * 16 + 1)
    assert labels(s)["tokens"] == "8193-16384"
    assert labels(replace(s, context_lens=(5,), query_lens=(1,)))["tokens"] == "1-8192"


# -- a pool past 2^31 elements -----------------------------------------------------------------


def test_the_large_pool_is_past_int32_offsets_and_uses_its_top_pages():
    s = large_pool_scenario(ALL, "cpu")
    assert s is not None
    assert labels(s)["pool"] == "2^31+"
    first_watched = (s.total_pages - WATCHED_PAGES) * s.page_size * s.num_kv_heads * s.head_dim
    assert first_watched >= INT32_ELEMENTS
    assert tensor_bytes(s) == s.total_pages * s.page_size * s.head_dim * 2  # fp16: 2 bytes
    if unavailable_reason(s) is not None:
        pytest.skip(f"pool past 2^31 elements not run on this machine: {unavailable_reason(s)}")
    inputs = large_pool_inputs(s)
    used = inputs.step.metadata.block_table
    assert int(used[used >= 0].min()) >= s.total_pages - WATCHED_PAGES
    assert inputs.caches[0].key.numel() > INT32_ELEMENTS


def test_no_large_pool_for_a_claim_without_a_usable_shape():
    assert large_pool_scenario(Capabilities(max_seq_len=8), "cpu") is None
    assert large_pool_scenario(Capabilities(kv_cache_dtypes=("fp8_e4m3",)), "cpu") is None
