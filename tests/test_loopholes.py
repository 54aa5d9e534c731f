"""The conformance loopholes stay closed: each property below catches its bug and passes a
correct backend, on fixed scenarios (no hypothesis, so each case is exact and quick)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch

from harness import PoolLayout
from harness.conformance.properties import (
    PropertyFailure,
    check_deterministic,
    check_partition_respected,
    check_ranks_together_equal_alone,
)
from harness.conformance.rejection_properties import (
    check_rejects_foreign_block_table_entry,
    check_stale_block_table_entries_ignored,
)
from harness.core.contract import AttentionMetadata, LayerCache
from harness.core.paged_base import PreparedStep
from harness.core.registry import BackendEntry
from harness.numerics.scenario import Scenario
from reference_backends.reference import ReferenceBackend
from suites.conformance.conftest import check
from suites.mutants.backends import (
    ChecksOnlySlots,
    OwnOwnershipCheck,
    RefusesDpGroups,
    RejectsStaleEntries,
    StalePlanCache,
    in_use_pages,
)


def entry(cls: type) -> BackendEntry:
    return BackendEntry(name=cls.__name__, cls=cls, origin="test")


REFERENCE = entry(ReferenceBackend)
TWO_RANKS = Scenario(
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    page_size=4,
    num_layers=1,
    context_lens=(13, 9, 4),
    query_lens=(1, 3, 4),
    dp_size=2,
    dp_rank=1,
    total_pages=19,
    seed=3,
)


class ChecksAllButTheLastEntry(OwnOwnershipCheck):
    """Checks the block table's in-use entries except the last one of each row."""

    def check_ownership(self, metadata: AttentionMetadata, page_size: int, pages: range) -> None:
        for page in in_use_pages(metadata, page_size, drop_last=True):
            if page not in pages:
                raise ValueError(f"page {page} is not this rank's")


class ReturnsNaN(ReferenceBackend):
    """NaN everywhere: bit-equal to itself, so equality alone would pass it."""

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        return torch.full_like(query, float("nan"))


class SumsInPhysicalOrder(ReferenceBackend):
    """Correct, but visits a sequence's keys in physical slot order, so rounding depends on
    where its pages lie (as a kernel iterating over pages in memory order would)."""

    def sequences(
        self, cache: LayerCache, step: PreparedStep
    ) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor]]:
        starts = step.checked.query_start
        for row, rows in enumerate(step.sequence_rows):
            if rows is None or starts[row + 1] == starts[row]:
                continue
            order = rows.sort().values
            key = cache.key.flatten(0, 1)[order].transpose(0, 1)
            value = cache.value.flatten(0, 1)[order].transpose(0, 1)
            yield slice(starts[row], starts[row + 1]), key, value


@pytest.mark.parametrize("layout", list(PoolLayout))
def test_one_foreign_block_table_entry_is_rejected(layout):
    scenario = replace(TWO_RANKS, layout=layout)
    check_rejects_foreign_block_table_entry(REFERENCE, scenario)  # a correct backend passes
    for cls in (ChecksOnlySlots, ChecksAllButTheLastEntry):
        with pytest.raises(PropertyFailure, match="without raising ValueError"):
            check_rejects_foreign_block_table_entry(entry(cls), scenario)


@pytest.mark.parametrize("layout", list(PoolLayout))
def test_stale_entries_past_the_in_use_ones_are_ignored(layout):
    scenario = replace(TWO_RANKS, layout=layout, pad_to=4)
    check_stale_block_table_entries_ignored(REFERENCE, scenario)
    with pytest.raises(PropertyFailure, match="rejected valid input"):
        check_stale_block_table_entries_ignored(entry(RejectsStaleEntries), scenario)


def test_unsupported_inside_the_claim_fails_and_names_the_claim():
    with pytest.raises(PropertyFailure) as info:
        check(check_deterministic, entry(RefusesDpGroups), TWO_RANKS)
    message = str(info.value)
    assert "raised Unsupported for a step inside its declared capabilities" in message
    assert "data parallelism is not implemented yet" in message
    assert "dp_size 2 (max_dp_size any)" in message


def test_nan_outputs_fail_the_equality_properties():
    nan = entry(ReturnsNaN)
    with pytest.raises(PropertyFailure, match="non-finite output"):
        check_deterministic(nan, TWO_RANKS)
    ranks = [replace(TWO_RANKS, dp_rank=r) for r in range(2)]
    with pytest.raises(PropertyFailure, match="non-finite output"):
        check_ranks_together_equal_alone(nan, ranks)


class GarbageInPaddingRows(ReferenceBackend):
    """Correct, but leaves graph-mode padding rows as whatever memory held (as vLLM's
    kernel does): the contract leaves those rows unspecified."""

    calls = 0

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        out = super().attend(query, cache, step)
        type(self).calls += 1
        padding = torch.ones(out.shape[0], dtype=torch.bool)
        for row in step.checked.real_rows:
            padding[step.checked.query_start[row] : step.checked.query_start[row + 1]] = False
        out[padding] = float(type(self).calls)  # differs on every run
        return out


class DiffersOnRealRows(GarbageInPaddingRows):
    """Nondeterministic where it matters: one real row drifts from run to run."""

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        out = super().attend(query, cache, step)
        out[0, 0, 0] += type(self).calls * 1e-3
        return out


def test_padding_rows_are_not_compared_but_real_rows_are():
    padded = replace(TWO_RANKS, pad_to=5)
    assert padded.graph_mode
    check_deterministic(entry(GarbageInPaddingRows), padded)
    ranks = [replace(padded, dp_rank=r) for r in range(2)]
    check_ranks_together_equal_alone(entry(GarbageInPaddingRows), ranks)
    with pytest.raises(PropertyFailure, match="second run differs"):
        check_deterministic(entry(DiffersOnRealRows), padded)


@pytest.mark.parametrize("layout", list(PoolLayout))
def test_together_and_alone_place_each_rank_on_the_same_pages(layout):
    """A correct backend whose rounding follows physical placement is not a DP leak."""
    ranks = [
        replace(TWO_RANKS, dp_rank=r, layout=layout, shuffle_pages=True, seed=3 + r)
        for r in range(2)
    ]
    check_ranks_together_equal_alone(entry(SumsInPhysicalOrder), ranks)


def test_partition_property_runs_the_backend_over_several_steps():
    ranks = [replace(TWO_RANKS, dp_rank=r, dp_size=3, total_pages=40) for r in range(3)]
    check_partition_respected(REFERENCE, ranks)
    with pytest.raises(PropertyFailure, match="each rank keeps to its pages"):
        check_partition_respected(entry(StalePlanCache), ranks)
