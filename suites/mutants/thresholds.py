"""Threshold mutants: kernel bugs that hide below a production shape.

Real kernels tile queries, split long contexts, hard-code block sizes, cap
launch grids and keep lengths and ids in narrow integers, so their bugs live
past those thresholds. Each backend here is exactly the reference below its
threshold and badly wrong (far beyond rounding, in fp32) past it; only a suite
that draws production shapes catches them. Each overrides one small method of
``ReferenceBackend``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

import torch

from harness.core.contract import LayerCache
from harness.core.kv_pages import dp_page_range
from harness.core.paged_base import PreparedStep
from reference_backends.reference import ReferenceBackend

SPLIT_KEYS = 256  # keys per split-KV partition (flash-decoding)
MAX_SPLITS = 16  # partitions a fixed-size split workspace holds
QUERY_TILE = 64  # query rows per prefill tile
MAX_QUERY_ROWS = 128  # query rows a one-tile-per-sequence grid covers
BLOCK_SIZE = 16  # page size a kernel was written for
HEAD_DIM_BLOCK = 128  # head-dim width of a kernel's loads
GQA_PACK = 8  # query heads packed per KV head
MAX_GRID_SEQUENCES = 64  # sequences a launch grid covers
MAX_DP = 8  # ranks a 3-bit rank field can name


def int16(value: int) -> int:
    """``value`` as a two's-complement int16 would hold it."""
    return (value + 2**15) % 2**16 - 2**15


def masked_keys(logits: torch.Tensor, dropped: torch.Tensor) -> torch.Tensor:
    """``logits`` with the keys where ``dropped`` is True never read."""
    return logits.masked_fill(dropped, float("-inf"))


# -- split-KV (flash-decoding) ------------------------------------------------------


class SplitKvNoRescale(ReferenceBackend):
    """Split-KV merge forgets to rescale each partial output by ``exp(m_i - m)``.

    Threshold: a context longer than one 256-key split. Each split keeps its
    own running max ``m_i``; the merge rescales the partial sums ``l_i`` to the
    global max but adds the partial outputs unscaled, so splits whose max is
    below the global one are over-weighted by ``exp(m - m_i)``.
    """

    @staticmethod
    def softmax(logits: torch.Tensor) -> torch.Tensor:
        if logits.shape[-1] <= SPLIT_KEYS:
            return ReferenceBackend.softmax(logits)  # one split: nothing to merge
        parts = logits.split(SPLIT_KEYS, dim=-1)
        maxes = [part.amax(dim=-1, keepdim=True) for part in parts]
        global_max = torch.stack(maxes).amax(dim=0)
        # a split fully masked for a row (causal prefill) contributes nothing
        safe = [torch.where(m.isfinite(), m, torch.zeros_like(m)) for m in maxes]
        partial = [(part - m).exp() for part, m in zip(parts, safe, strict=True)]
        total = sum(
            w.sum(dim=-1, keepdim=True) * torch.where(m.isfinite(), (m - global_max).exp(), 0.0)
            for w, m in zip(partial, maxes, strict=True)
        )
        return torch.cat(partial, dim=-1) / total  # bug: partial[i] not scaled by exp(m_i - m)


class SplitKvFloorPartitions(ReferenceBackend):
    """Split-KV partition count from floor division: the tail chunk is never read.

    Threshold: a context past 256 keys that is not a multiple of 256.
    ``num_splits = max(1, L // 256)`` instead of ``ceil(L / 256)``, so the last
    ``L % 256`` keys are dropped from the softmax (exact for L <= 256 and for
    multiples of 256).
    """

    @staticmethod
    def softmax(logits: torch.Tensor) -> torch.Tensor:
        length = logits.shape[-1]
        read = max(1, length // SPLIT_KEYS) * SPLIT_KEYS
        dropped = torch.arange(length, device=logits.device) >= read
        return ReferenceBackend.softmax(masked_keys(logits, dropped))


class SplitKvMaxPartitions(ReferenceBackend):
    """Split-KV workspace sized for 16 partitions: keys past 16 x 256 = 4096 are dropped.

    Threshold: a context longer than 4096 keys. The partition count is clamped
    to the workspace's 16 slots instead of the workspace being sized from the
    longest context, so every key past 4096 is never read.
    """

    @staticmethod
    def softmax(logits: torch.Tensor) -> torch.Tensor:
        length = logits.shape[-1]
        dropped = torch.arange(length, device=logits.device) >= MAX_SPLITS * SPLIT_KEYS
        return ReferenceBackend.softmax(masked_keys(logits, dropped))


# -- query tiles ----------------------------------------------------------------------


class QueryTileCausalOffset(ReferenceBackend):
    """64-row query tiles take each row's causal limit from its index inside the tile.

    Threshold: more than 64 query rows in one sequence (prefill, extend). The
    tile's start (``tile * 64``) is left out of the row's position, so rows of
    every tile after the first see as many keys as the first tile's rows.
    """

    @staticmethod
    def causal_mask(query_len: int, length: int, device: torch.device) -> torch.Tensor:
        rows = torch.arange(query_len, device=device) % QUERY_TILE  # bug: + tile start
        positions = length - query_len + rows
        return torch.arange(length, device=device)[None, :] <= positions[:, None]


class QueryTileCap128(ReferenceBackend):
    """The grid covers 128 query rows per sequence and the epilogue clamps the row index.

    Threshold: more than 128 query rows in one sequence (prefill, extend).
    Rows past the 128th are never computed: they store row 127's output.
    """

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        out = super().attend(query, cache, step)
        for start, stop in itertools.pairwise(step.checked.query_start):
            if stop - start > MAX_QUERY_ROWS:
                out[start + MAX_QUERY_ROWS : stop] = out[start + MAX_QUERY_ROWS - 1]
        return out


# -- block size, head dim, GQA ----------------------------------------------------


class HardcodedBlock16(ReferenceBackend):
    """Hard-codes BLOCK_SIZE 16: reads only the first 16 tokens of each page.

    Threshold: a page size above 16 with a sequence holding a page's 17th
    token. The in-page loop runs over ``min(page_size, 16)`` offsets, so every
    token at offset 16 or more of its page is left out of the softmax.
    """

    def softmax(self, logits: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        page_size = self._require_bound().page_size
        offsets = torch.arange(logits.shape[-1], device=logits.device) % page_size
        return ReferenceBackend.softmax(masked_keys(logits, offsets >= BLOCK_SIZE))


class HeadDimCap128(ReferenceBackend):
    """Loads head dims through one 128-wide block: dims past 128 read as zero.

    Threshold: a head dim above 128 (192, 256). Keys lose their dims past 128
    in the logits and values lose them in the output, so those output dims
    are zero and the attention weights are wrong.
    """

    def expand_kv_heads(self, kv: torch.Tensor) -> torch.Tensor:
        expanded = super().expand_kv_heads(kv)
        expanded[..., HEAD_DIM_BLOCK:] = 0
        return expanded


class GqaPack8(ReferenceBackend):
    """Packs at most 8 query heads per KV head: head j of a group writes tile row j % 8.

    Threshold: a GQA group above 8 (16, or MQA with 32+ query heads). The
    group's query heads are packed into an 8-row tile, so heads past the 8th
    of each group get the output of head ``j % 8`` of that group.
    """

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        out = super().attend(query, cache, step)
        group = self.num_heads // self.num_kv_heads
        heads = torch.arange(self.num_heads, device=out.device)
        source = heads // group * group + heads % group % GQA_PACK
        return out.index_select(1, source)


# -- launch grid and narrow integers ------------------------------------------------


class GridCap64(ReferenceBackend):
    """Launch grid capped at 64 sequences: rows past the 64th are never computed.

    Threshold: a batch of more than 64 rows. ``grid = (min(batch, 64), ...)``
    with no loop over the rest, so their outputs stay zero.
    """

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        capped = replace(step, sequence_rows=step.sequence_rows[:MAX_GRID_SEQUENCES])
        return super().attend(query, cache, capped)


class SeqLenInt16(ReferenceBackend):
    """Keeps seq_len in an int16: a context of 32768 or more wraps.

    Threshold: a context of 32768 tokens (long decode). The wrapped length is
    negative, the key loop runs zero times and the row's output is zero (from
    65536 on it wraps to a short positive length and reads a prefix).
    """

    def sequences(
        self, cache: LayerCache, step: PreparedStep
    ) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor]]:
        for tokens, key, value in super().sequences(cache, step):
            length = int16(key.shape[1])
            if length > 0:
                yield tokens, key[:, :length], value[:, :length]


class PageIdInt16(ReferenceBackend):
    """Narrows block-table page ids to int16: pages from 32768 on wrap negative.

    Threshold: a sequence holding page 32768 or later (large pools, or a high
    rank's pages). The negative id addresses memory before the bound pool,
    modelled as counting back from its end: another page's tokens or NaN (it
    lands on the right page only when the pool's page count divides 65536).
    """

    def cache_rows(self, pages: list[int], length: int) -> list[int]:
        geometry = self._require_bound()
        limit = geometry.num_pages * geometry.page_size
        rows = super().cache_rows([int16(page) for page in pages], length)
        return [row % limit for row in rows]


def int32(value: int) -> int:
    """``value`` as a two's-complement int32 would hold it."""
    return (value + 2**31) % 2**32 - 2**31


class ElementOffsetInt32(ReferenceBackend):
    """Forms each cached token's element offset ``row * num_kv_heads * head_dim`` in int32.

    Threshold: a K/V tensor past 2^31 elements with a sequence on pages whose
    offsets lie past it (``harness.conformance.large_pool``'s test; no drawn step comes
    near). The wrapped, negative offset addresses memory before the tensor,
    modelled as counting back from its end: untouched memory, or other pages.

    Source: vllm-project/vllm#50427 (FlexAttention's paged K/V offsets overflow
    int32: a crash or silently wrong output); also vllm-project/vllm#1514
    (integer-overflow fixes in attention and cache ops).
    """

    def cache_rows(self, pages: list[int], length: int) -> list[int]:
        geometry = self._require_bound()
        row_elements = self.num_kv_heads * self.head_dim
        limit = geometry.num_pages * geometry.page_size
        rows = super().cache_rows(pages, length)
        return [int32(row * row_elements) // row_elements % limit for row in rows]


class DpRank3Bits(ReferenceBackend):
    """The kernel's stale-id guard takes its page range from a 3-bit rank field.

    Threshold: dp_size above 8, on ranks 8 and up. The kernel skips block-table
    entries outside ``dp_page_range(total, dp_size, rank & 7)`` (a guard
    against stale ids); on rank 8 and up that is another rank's range, every
    page is skipped and each output is zero. Validation is the contract's and
    still correct, so nothing is refused.
    """

    def cache_rows(self, pages: list[int], length: int) -> list[int]:
        geometry = self._require_bound()
        guard = dp_page_range(geometry.total_pages, self.dp_size, self.dp_rank % MAX_DP)
        rows = super().cache_rows(pages, length)
        size = geometry.page_size
        return [row for p, row in enumerate(rows) if pages[p // size] in guard]

    def sequences(
        self, cache: LayerCache, step: PreparedStep
    ) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor]]:
        for tokens, key, value in super().sequences(cache, step):
            if key.shape[1]:  # no page passed the guard: the row keeps its zeros
                yield tokens, key, value


THRESHOLD_MUTANTS: tuple[type, ...] = (
    SplitKvNoRescale,
    SplitKvFloorPartitions,
    SplitKvMaxPartitions,
    QueryTileCausalOffset,
    QueryTileCap128,
    HardcodedBlock16,
    HeadDimCap128,
    GqaPack8,
    GridCap64,
    SeqLenInt16,
    PageIdInt16,
    ElementOffsetInt32,
    DpRank3Bits,
)
