"""Stateful runs: small ones, and production ones inside the cost limit and past thresholds."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from harness.conformance.production_shapes import CostLimit
from harness.conformance.stateful import conformance_machine, run_machine
from harness.conformance.stateful_shapes import (
    MAX_LIVE,
    PRODUCTION_DP,
    RunShape,
    production_context,
    run_shapes,
)
from harness.conformance.strategies import CI_BUDGET
from harness.core.contract import Capabilities
from harness.core.registry import default_registry
from harness.numerics.scenario import Scenario

DRAWS = settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


ANY = Capabilities()


def shapes(caps: Capabilities = ANY) -> list[RunShape]:
    drawn: list[RunShape] = []

    @DRAWS
    @given(run_shapes(caps, CI_BUDGET, "cpu", 8))
    def record(shape: RunShape) -> None:
        drawn.append(shape)

    record()
    return drawn


def test_a_production_run_affords_one_prefill_of_its_longest_context_per_sequence():
    limit = CostLimit()
    runs = ((1, 1, 64, 1, 1), (64, 8, 128, 2, 4), (8, 2, 96, 1, 3))
    for heads, kv_heads, dim, layers, dp in runs:
        g = Scenario(num_heads=heads, num_kv_heads=kv_heads, head_dim=dim, num_layers=layers)
        longest = production_context(g, dp, limit, claimed=10**6)
        assert longest * longest // 2 * heads * dim * layers <= limit.work
        assert MAX_LIVE * dp * longest * kv_heads * dim <= limit.cache_elements
    tiny = Scenario(num_heads=1, num_kv_heads=1, head_dim=64)
    assert production_context(tiny, 1, limit, claimed=300) == 300  # the claim binds


def test_production_runs_reach_past_the_split_thresholds_with_production_pages():
    drawn = shapes()
    production = [s for s in drawn if s.regime is not None]
    assert len(production) >= 5, [s.regime for s in drawn]
    assert len({s.regime for s in production}) >= 3
    assert max(s.max_context for s in production) > 1024
    assert any(s.geometry.page_size >= 32 for s in production)
    assert all(s.dp_size <= PRODUCTION_DP for s in production)
    assert all(s.max_context <= CI_BUDGET.max_context for s in drawn if s.regime is None)


def test_production_prompts_and_chunks_sit_on_both_sides_of_the_tiles():
    g = Scenario(num_heads=1, num_kv_heads=1, head_dim=64, page_size=32)
    shape = RunShape(g, 1, 1448, "split-kv")
    prompts: set[int] = set()
    chunks: set[int] = set()

    @DRAWS
    @given(shape.prompts(), shape.chunks(300))
    def record(prompt: int, chunk: int) -> None:
        prompts.add(prompt)
        chunks.add(chunk)

    record()
    assert max(prompts) <= 1448 - 4
    assert prompts & {255, 257, 1023, 1025}, prompts
    assert chunks <= {63, 64, 65, 127, 128, 129, 256, 257, 300}
    assert chunks & {65, 129, 257}, chunks


def test_a_claim_narrows_production_runs():
    caps = Capabilities(page_sizes=(16,), max_seq_len=200, max_dp_size=2)
    for shape in shapes(caps):
        assert shape.geometry.page_size == 16
        assert shape.max_context <= 200


def test_stateful_runs_step_past_256_keys_on_the_backend_own_cache():
    entry = default_registry().entry("reference")
    contexts: list[int] = []
    machine = conformance_machine(
        entry,
        CI_BUDGET,
        on_step=lambda s: contexts.extend(s.context_lens),
    )
    run_machine(machine, settings(DRAWS, max_examples=20, stateful_step_count=10))
    assert max(contexts) > 256, max(contexts)
