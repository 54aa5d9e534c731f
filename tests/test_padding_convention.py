"""``Capabilities.padding_convention``: a backend whose engine pads graph-mode batches with
one-token rows over a reserved page is judged on padding rows of that form."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from harness.conformance.properties import (
    check_every_rank_matches_oracle,
    check_matches_oracle,
    check_only_mapped_slots_change,
)
from harness.conformance.stateful import conformance_machine, run_machine
from harness.conformance.step_strategies import multi_rank_scenarios, scenarios
from harness.conformance.strategies import CI_BUDGET
from harness.core.batches import BatchBuilder
from harness.core.contract import PADDING_CONVENTIONS, Capabilities, LayerCache
from harness.core.errors import PropertyFailure
from harness.core.kv_pages import PagePool, PoolLayout, dp_page_range
from harness.core.paged_base import PreparedStep
from harness.core.registry import BackendEntry
from harness.numerics.scenario import Scenario, scenario_caches
from reference_backends.reference import ReferenceBackend
from suites.mutants.padding import PaddingRowsZeroOverZero

DRAWS = settings(
    max_examples=15,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
ONE_TOKEN = Scenario(
    context_lens=(5, 9),
    query_lens=(1, 9),
    pad_to=4,
    padding_convention="one-token",
    total_pages=12,
    dp_size=2,
    dp_rank=1,
    seed=3,
)


class OneTokenPadding(PaddingRowsZeroOverZero):
    """A kernel whose empty rows come out 0/0, run as its engine pads: one token, no NaN."""

    @classmethod
    def capabilities(cls) -> Capabilities:
        return dataclasses.replace(super().capabilities(), padding_convention="one-token")


class WritesPaddingTokens(ReferenceBackend):
    """Writes padding rows' K/V to the padding page (slot -1 means: write nothing)."""

    @classmethod
    def capabilities(cls) -> Capabilities:
        return dataclasses.replace(super().capabilities(), padding_convention="one-token")

    def attend_with_lse(
        self, query: torch.Tensor, cache: LayerCache, step: PreparedStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert step.geometry is not None
        checked = step.checked
        for row, pages in enumerate(checked.pages):
            tokens = range(checked.query_start[row], checked.query_start[row + 1])
            if pages and all(checked.slots[t] == -1 for t in tokens):  # a padding row
                cache.key_nhd[pages[0] - step.geometry.page_offset, 0] = 1.0  # a stray write
        return super().attend_with_lse(query, cache, step)


def entry(cls: type) -> BackendEntry:
    return BackendEntry(cls.__name__, cls, "test")


def test_an_unknown_convention_is_refused_by_name():
    with pytest.raises(ValueError, match="padding_convention"):
        Capabilities(padding_convention="seq-len-one")
    assert PADDING_CONVENTIONS == ("empty", "one-token")
    assert Capabilities().padding_convention == "empty"


def test_each_rank_holds_back_its_first_page_for_padding():
    pool = PagePool(9, 2, shuffle_seed=1, padding_pages=True)
    for rank in (0, 1):
        first = dp_page_range(9, 2, rank).start
        assert pool.padding_page(rank) == first
        handed = pool.allocate(rank, pool.num_free(rank))
        assert first not in handed
        assert len(handed) == len(dp_page_range(9, 2, rank)) - 1
    assert PagePool(9, 2).padding_page(0) is None


def test_one_token_padding_rows_read_the_padding_page_and_write_nothing():
    pool = PagePool(9, 2, padding_pages=True)
    builder = BatchBuilder(pool, 1, 4)
    seq = builder.admit()
    step = builder.step([(seq, 6)], pad_to=3, pad_query_len=2)
    m = step.metadata
    assert m.seq_lens.tolist() == [6, 1, 1]
    assert m.query_start_loc.tolist() == [0, 6, 7, 8]
    assert m.block_table[1:, 0].tolist() == [5, 5]  # rank 1's range starts at page 5
    assert (m.block_table[1:, 1:] == -1).all()
    assert m.slot_mapping[6:].tolist() == [-1, -1]
    assert 5 not in step.rows[0].pages


@pytest.mark.parametrize("layout", list(PoolLayout))
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3"])
def test_padding_pages_hold_zeros_and_the_rest_stays_poisoned(layout, kv_cache_dtype):
    from harness.core.variants import AttentionVariant

    variant = AttentionVariant(kv_cache_dtype=kv_cache_dtype)
    s = dataclasses.replace(ONE_TOKEN, layout=layout, variant=variant)
    for cache in scenario_caches(s):
        for rank in range(s.dp_size):
            page = dp_page_range(s.total_pages, s.dp_size, rank).start - cache.page_offset
            if 0 <= page < cache.key.shape[0]:
                assert (cache.key[page].float() == 0).all()
                assert (cache.value[page].float() == 0).all()
                assert cache.key[page + 1].float().isnan().all()


def test_a_kernel_that_cannot_take_empty_rows_passes_as_its_engine_pads():
    empty = dataclasses.replace(ONE_TOKEN, padding_convention="empty", total_pages=10)
    with pytest.raises(PropertyFailure, match="padding rows"):
        check_matches_oracle(entry(PaddingRowsZeroOverZero), empty)
    check_matches_oracle(entry(OneTokenPadding), ONE_TOKEN)


def test_the_suite_draws_padding_rows_as_the_backend_declares():
    declared = entry(OneTokenPadding)
    caps = declared.capabilities
    padded = []

    @DRAWS
    @given(scenarios(caps), multi_rank_scenarios(caps))
    def check(s: Scenario, group: list[Scenario]) -> None:
        assert s.padding_convention == "one-token"
        if s.graph_mode:
            padded.append(s)
        check_matches_oracle(declared, s)
        check_every_rank_matches_oracle(declared, group)

    check()
    assert padded
    machine = conformance_machine(declared, CI_BUDGET)
    run_machine(machine, settings(DRAWS, max_examples=6, stateful_step_count=8))


def test_a_write_of_a_padding_token_is_caught_by_the_canary():
    with pytest.raises(PropertyFailure, match="slots"):
        check_only_mapped_slots_change(entry(WritesPaddingTokens), ONE_TOKEN)
