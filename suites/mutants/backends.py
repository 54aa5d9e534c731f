"""Deliberately broken backends, one realistic bug each (see each docstring).

Most override one small method of a built-in, so the bug is the only
difference from a backend that passes. ``MUTANTS`` ends with the threshold
mutants of ``suites.mutants.thresholds`` (bugs only production shapes reach), the
variant mutants of ``suites.mutants.variants`` and the field mutants of
``suites.mutants.field`` (bugs that shipped in real engines).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from harness.core.contract import AttentionMetadata, LayerCache
from harness.core.errors import Unsupported
from harness.core.kv_pages import pages_needed, put_rows
from harness.core.paged_base import PreparedStep
from reference_backends.reference import ReferenceBackend

# -- DP partition and ownership ------------------------------------------------------


class PartitionFloor(ReferenceBackend):
    """Rank range from ``total // dp_size`` alone, dropping the remainder's shift.

    Valid pages of ranks after the first are refused when the pool does not
    divide by dp_size.
    """

    def bind_kv_caches(self, layer_caches: list[LayerCache]) -> None:
        super().bind_kv_caches(layer_caches)
        base = layer_caches[0].global_total_pages // self.dp_size
        self._page_range = range(self.dp_rank * base, (self.dp_rank + 1) * base)


class SkipsOwnershipCheck(ReferenceBackend):
    """Never checks that pages belong to its rank: reads and writes other ranks' pages."""

    def bind_kv_caches(self, layer_caches: list[LayerCache]) -> None:
        super().bind_kv_caches(layer_caches)
        self._page_range = range(layer_caches[0].global_total_pages)


class OwnOwnershipCheck(ReferenceBackend):
    """The reference with the harness's validator off and ``check_ownership`` in its place,
    as an outside backend that writes its own checks would be."""

    def check_ownership(self, metadata: AttentionMetadata, page_size: int, pages: range) -> None:
        raise NotImplementedError

    def prepare(self, metadata: AttentionMetadata, graph_mode: bool = False) -> None:
        assert self._page_range is not None
        self.check_ownership(metadata, self._require_bound().page_size, self._page_range)
        self.validate = False
        try:
            super().prepare(metadata, graph_mode=graph_mode)
        finally:
            self.validate = True


def in_use_pages(metadata: AttentionMetadata, page_size: int, drop_last: bool = False) -> list[int]:
    """Every row's in-use block-table entries (without each row's last one if asked)."""
    table, lengths = metadata.block_table.tolist(), metadata.seq_lens.tolist()
    pages = []
    for row, length in zip(table, lengths, strict=True):
        used = pages_needed(length, page_size) - (1 if drop_last and length else 0)
        pages += row[:used]
    return pages


class ChecksOnlySlots(OwnOwnershipCheck):
    """Checks that new slots are its rank's, never the block table: reads foreign pages."""

    def check_ownership(self, metadata: AttentionMetadata, page_size: int, pages: range) -> None:
        for slot in metadata.slot_mapping.tolist():
            if slot != -1 and slot // page_size not in pages:
                raise ValueError(f"slot {slot} is not this rank's")


class ChecksOnlyBlockTable(OwnOwnershipCheck):
    """Checks that in-use pages are its rank's, never the new slots: writes foreign pages."""

    def check_ownership(self, metadata: AttentionMetadata, page_size: int, pages: range) -> None:
        for page in in_use_pages(metadata, page_size):
            if page not in pages:
                raise ValueError(f"page {page} is not this rank's")


class RejectsStaleEntries(ReferenceBackend):
    """Checks every block-table entry, not only the in-use ones: refuses stale ids engines leave."""

    def prepare(self, metadata: AttentionMetadata, graph_mode: bool = False) -> None:
        super().prepare(metadata, graph_mode=graph_mode)
        page_range = self._page_range
        assert page_range is not None
        for page in metadata.block_table.flatten().tolist():
            if page != -1 and page not in page_range:
                raise ValueError(f"block_table holds page {page}, not this rank's")


class RefusesDpGroups(ReferenceBackend):
    """Claims any dp_size, then refuses every step of a group with ``Unsupported``."""

    def prepare(self, metadata: AttentionMetadata, graph_mode: bool = False) -> None:
        if self.dp_size > 1:
            raise Unsupported("data parallelism is not implemented yet")
        super().prepare(metadata, graph_mode=graph_mode)


class IgnoresPageOffset(ReferenceBackend):
    """Indexes a per-rank pool with global page ids, as if it held the whole pool."""

    def cache_rows(self, pages: list[int], length: int) -> list[int]:
        size = self._require_bound().page_size
        return [pages[p // size] * size + p % size for p in range(length)]


# -- masking and head mapping -----------------------------------------------------


class TopLeftCausal(ReferenceBackend):
    """Causal mask aligned top-left (SDPA's ``is_causal``): wrong when q < L (extend, decode)."""

    @staticmethod
    def causal_mask(query_len: int, length: int, device: torch.device) -> torch.Tensor:
        return torch.ones(query_len, length, dtype=torch.bool, device=device).tril()


class NoCausalMask(ReferenceBackend):
    """Ignores the causal flag: every query sees the whole sequence."""

    @staticmethod
    def causal_mask(query_len: int, length: int, device: torch.device) -> torch.Tensor:
        return torch.ones(query_len, length, dtype=torch.bool, device=device)


class GqaModulo(ReferenceBackend):
    """Maps query head h to KV head ``h % num_kv_heads`` instead of ``h // group``."""

    def expand_kv_heads(self, kv: torch.Tensor) -> torch.Tensor:
        return kv.repeat(self.num_heads // self.num_kv_heads, 1, 1)


class UnstableSoftmax(ReferenceBackend):
    """Exponentiates raw logits: overflows to inf/NaN once logits reach ~90 (fp32)."""

    @staticmethod
    def softmax(logits: torch.Tensor) -> torch.Tensor:
        weights = logits.exp()
        return weights / weights.sum(dim=-1, keepdim=True)


class IgnoresScale(ReferenceBackend):
    """Hard-codes ``1/sqrt(head_dim)`` and ignores the scale it was given."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.scale = 1.0 / math.sqrt(self.head_dim)


# -- which tokens are read --------------------------------------------------------


class DropsLastToken(ReferenceBackend):
    """Off by one: attends to the first ``L - 1`` tokens of each sequence."""

    def cache_rows(self, pages: list[int], length: int) -> list[int]:
        return super().cache_rows(pages, max(1, length - 1))


class ReadsWholeLastPage(ReferenceBackend):
    """Reads every slot of the last page, including its unwritten tail."""

    def cache_rows(self, pages: list[int], length: int) -> list[int]:
        size = self._require_bound().page_size
        return super().cache_rows(pages, pages_needed(length, size) * size)


class AssumesContiguousPages(ReferenceBackend):
    """Treats a sequence's pages as consecutive from its first page."""

    def cache_rows(self, pages: list[int], length: int) -> list[int]:
        geometry = self._require_bound()
        first = (pages[0] - geometry.page_offset) * geometry.page_size
        rows = [first + p for p in range(length)]
        limit = geometry.num_pages * geometry.page_size
        return [r % limit for r in rows]


# -- which tokens are written -----------------------------------------------------


class WritesPaddingSlots(ReferenceBackend):
    """Writes tokens with slot -1 too, to the pool's last slot (Python's index -1)."""

    def prepare(self, metadata: AttentionMetadata, graph_mode: bool = False) -> None:
        super().prepare(metadata, graph_mode=graph_mode)
        assert self._step is not None
        assert self._geometry is not None
        slots = self._step.checked.slots
        base = self._geometry.page_offset * self._geometry.page_size
        last = self._geometry.num_pages * self._geometry.page_size - 1
        rows = [last if s == -1 else s - base for s in slots]
        device = self._geometry.device
        self._step = replace(
            self._step,
            write_tokens=torch.arange(len(slots), device=device),
            write_rows=torch.tensor(rows, dtype=torch.long, device=device),
        )


class ZeroesPageTail(ReferenceBackend):
    """Zeroes the unwritten tail of each sequence's last page ("fresh" memory): never read,
    so outputs stay right, but it writes slots outside ``slot_mapping``."""

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_idx: int
    ) -> torch.Tensor:
        out = super().forward(query, key, value, layer_idx)
        geometry = self._require_bound()
        assert self._step is not None
        size, base = geometry.page_size, geometry.page_offset * geometry.page_size
        cache = self._caches[layer_idx]
        checked = self._step.checked
        for pages, length in zip(checked.pages, checked.seq_lens, strict=True):
            if length % size:
                last = pages[-1] * size - base
                rows = torch.arange(last + length % size, last + size, device=query.device)
                zeros = torch.zeros(len(rows), *cache.key.shape[2:], dtype=cache.key.dtype)
                put_rows(cache.key, rows, zeros.to(query.device))
                put_rows(cache.value, rows, zeros.to(query.device))
        return out


class ClearsBlockTablePadding(ReferenceBackend):
    """Replaces the caller's -1 block-table entries with 0 in place (so a gather never
    indexes -1), after reading them: outputs stay right, the caller's metadata does not."""

    def prepare(self, metadata: AttentionMetadata, graph_mode: bool = False) -> None:
        super().prepare(metadata, graph_mode=graph_mode)
        metadata.block_table.clamp_(min=0)


class IgnoresLayerIndex(ReferenceBackend):
    """Reads and writes layer 0's cache whatever ``layer_idx`` says."""

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_idx: int
    ) -> torch.Tensor:
        return super().forward(query, key, value, 0)


# -- inputs, state and determinism ------------------------------------------------


class ModifiesQueryInPlace(ReferenceBackend):
    """Pre-scales the caller's query in place to save a multiply."""

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        query.mul_(self.scale)
        scale, self.scale = self.scale, 1.0
        try:
            return super().attend(query, cache, step)
        finally:
            self.scale = scale


class IgnoresStrides(ReferenceBackend):
    """Reads the query's storage as if it were contiguous (a raw-pointer kernel's bug)."""

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        dense = query.as_strided(
            query.shape, torch.empty(query.shape).stride(), query.storage_offset()
        )
        return super().attend(dense, cache, step)


class NonDeterministic(ReferenceBackend):
    """Adds last-bit noise, as an atomic-add reduction in a varying order would."""

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        out = super().attend(query, cache, step)
        noise = torch.randint(-1, 2, out.shape, device=out.device).to(out.dtype)
        return out + out * noise * torch.finfo(out.dtype).eps


class StalePlanCache(ReferenceBackend):
    """Caches the step plan by token count: a later step of the same size reuses stale pages."""

    def prepare(self, metadata: AttentionMetadata, graph_mode: bool = False) -> None:
        previous = getattr(self, "_cached", None)
        tokens = int(metadata.slot_mapping.shape[0])
        if previous is not None and previous[0] == tokens:
            self._step = previous[1]
            return
        super().prepare(metadata, graph_mode=graph_mode)
        self._cached = (tokens, self._step)


MUTANTS: tuple[type, ...] = (
    PartitionFloor,
    SkipsOwnershipCheck,
    ChecksOnlySlots,
    ChecksOnlyBlockTable,
    RejectsStaleEntries,
    RefusesDpGroups,
    IgnoresPageOffset,
    TopLeftCausal,
    NoCausalMask,
    GqaModulo,
    UnstableSoftmax,
    IgnoresScale,
    DropsLastToken,
    ReadsWholeLastPage,
    AssumesContiguousPages,
    WritesPaddingSlots,
    ZeroesPageTail,
    IgnoresLayerIndex,
    ModifiesQueryInPlace,
    ClearsBlockTablePadding,
    IgnoresStrides,
    NonDeterministic,
    StalePlanCache,
)

# Re-exported at the bottom, so ``suites.mutants.backends:Name`` resolves for them too.
from suites.mutants.thresholds import (  # noqa: E402, F401
    THRESHOLD_MUTANTS,
    DpRank3Bits,
    ElementOffsetInt32,
    GqaPack8,
    GridCap64,
    HardcodedBlock16,
    HeadDimCap128,
    PageIdInt16,
    QueryTileCap128,
    QueryTileCausalOffset,
    SeqLenInt16,
    SplitKvFloorPartitions,
    SplitKvMaxPartitions,
    SplitKvNoRescale,
)

MUTANTS += THRESHOLD_MUTANTS

from suites.mutants.variants import (  # noqa: E402, F401
    VARIANT_MUTANTS,
    AlibiSignFlipped,
    Fp8ScaleInvertedOnRead,
    Fp8ScaleInvertedOnWrite,
    HndReadAsNhd,
    IgnoresSinks,
    LseInLog2,
    NonPositiveWindowMeansNone,
    OutBufferIgnored,
    SoftCapBeforeScale,
    WindowOffByOne,
    WindowOnlyInPrefill,
)

MUTANTS += VARIANT_MUTANTS

from suites.mutants.field import (  # noqa: E402, F401
    FIELD_MUTANTS,
    AlibiDroppedInDecode,
    CombinedKvBlockStrideAssumed,
    FiniteSentinelMax,
    Fp8ScalesFallBackToOne,
    Fp8ScalesIgnoredInRaggedPrefill,
    GqaGroupPaddedToPow2,
    HeadDimTailUnmasked,
    MergeStartsEmptyNaN,
    NewKvStridesAssumed,
    OutputChunkAtColumnZero,
    PageTokensPast128Dropped,
    ScratchWrapsPastTokenBudget,
    SinksIgnoredInPrefill,
    SoftCapAfterMaskInDecode,
    SoftCapIgnored,
    SpecVerifyNoCausal,
    SpecVerifyPaddedQStride,
    SpecVerifyRowsAsDecode,
    SplitCountEmptyTail,
    SplitKvEmptySplitNaN,
    WindowIgnoredOnCachedPrefix,
    WindowMaskFinite,
)

MUTANTS += FIELD_MUTANTS

from suites.mutants.values import (  # noqa: E402, F401
    VALUE_MUTANTS,
    AccumulatorInStorageDtype,
    DefaultScalePastOneSplit,
    RawScoresInStorageDtype,
    ScoresInStorageDtype,
)

MUTANTS += VALUE_MUTANTS

from suites.mutants.state import (  # noqa: E402, F401
    STATE_MUTANTS,
    KvScalesFromLastPlan,
    ScalePlannedOncePerStep,
    SinksPlannedByFirstLayer,
    SoftCapPlannedOncePerStep,
    WindowPlannedOncePerStep,
)

MUTANTS += STATE_MUTANTS

from suites.mutants.padding import (  # noqa: E402, F401
    PADDING_MUTANTS,
    PaddingRowsLeftStale,
    PaddingRowsReadPageZero,
    PaddingRowsZeroOverZero,
)

MUTANTS += PADDING_MUTANTS

from suites.mutants.combinations import (  # noqa: E402, F401
    COMBINATION_MUTANTS,
    LseOfFirstSplitOnly,
    LseRowsShiftedByPadding,
    SequencesPastGridLimitDropped,
    SplitWorkPastPlanDropped,
)

MUTANTS += COMBINATION_MUTANTS

from suites.mutants.latent import (  # noqa: E402, F401
    LATENT_MUTANTS,
    LatentDimsHardcoded,
    LatentRopeWrittenPastRow,
    LatentScaleOfWidth,
    LatentSplitMergeValueStride,
    LatentValuesWholeRow,
)

MUTANTS += LATENT_MUTANTS
