"""One step's metadata as the engines' kernels take it: vLLM's, FlashInfer's and SGLang's.

An adapter that runs an engine's kernel through the harness needs the step in
the engine's own form, and each form has a trap: vLLM's Triton kernel reads
block-table entries past a row's in-use ones (its last key tile spans whole
tiles of pages) without a mask, so the padding must be a readable page, not
-1; every form counts pages or slots local to the rank's bound tensors, so a
DP rank's page offset must be taken off the global ids; graph-mode padding
rows (``seq_len == 0``) must stay empty. These views do it once, from the
step's ``CheckedMetadata``, on the step's device, and are cached on the step
(every layer's ``attend`` of one step shares them).

- ``vllm_metadata(step)``: ``cu_seqlens_q``, ``seqused_k``, ``max_seqlen_q``,
  ``max_seqlen_k`` and a local int32 ``block_table`` padded with a safe page
  to a multiple of ``pages_per_tile`` columns.
- ``flashinfer_metadata(step)``: ``qo_indptr``, ``paged_kv_indptr``,
  ``paged_kv_indices``, ``paged_kv_last_page_len``.
- ``sglang_metadata(step)``: token-level ``kv_indptr`` / ``kv_indices`` over
  each whole sequence, the same over the cached prefix only (the extend
  kernel takes the new tokens' K/V as arguments), and ``req_to_token``.
- ``decode_rows(step)``: the step as a decode-only kernel takes it (MLA decode
  kernels: vLLM's CPU and Triton ones): one row per query token, each over its
  sequence's pages up to its own causal extent, as vLLM's ``forward_mqa`` flattens
  speculative and chunked rows.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch

from harness.core.kv_pages import token_slots
from harness.core.validate import CacheGeometry, CheckedMetadata


@dataclass(frozen=True)
class VllmMetadata:
    """vLLM's ``unified_attention`` arguments for one step (``vllm_metadata``)."""

    cu_seqlens_q: torch.Tensor  # int32 [B + 1]: query_start_loc
    seqused_k: torch.Tensor  # int32 [B]: each row's whole length (0: padding row)
    max_seqlen_q: int
    max_seqlen_k: int
    block_table: torch.Tensor  # int32 [B, W]: local page ids, then pad_page to W


@dataclass(frozen=True)
class FlashInferMetadata:
    """FlashInfer's paged-KV plan arguments for one step (``flashinfer_metadata``)."""

    qo_indptr: torch.Tensor  # int32 [B + 1]
    paged_kv_indptr: torch.Tensor  # int32 [B + 1]: cumulative page counts
    paged_kv_indices: torch.Tensor  # int32 [pages]: local page ids, row after row
    paged_kv_last_page_len: torch.Tensor  # int32 [B]: tokens on the last page (0: empty)


@dataclass(frozen=True)
class SglangMetadata:
    """SGLang's Triton-backend tables for one step (``sglang_metadata``).

    Slots are local token rows (``local page * page_size + offset``) of the
    bound cache, int64 as SGLang's ``kv_indices`` are. ``kv_*`` cover each
    whole sequence (the decode kernel's view, the new tokens written);
    ``prefix_kv_*`` only its cached part before this step's tokens (the
    extend kernel's view, which takes the new K/V as ``k_extend``/``v_extend``).
    """

    qo_indptr: torch.Tensor  # int32 [B + 1]
    kv_indptr: torch.Tensor  # int32 [B + 1]: cumulative seq_lens
    kv_indices: torch.Tensor  # int64 [sum(seq_lens)]
    prefix_kv_indptr: torch.Tensor  # int32 [B + 1]: cumulative seq_len - query_len
    prefix_kv_indices: torch.Tensor  # int64 [sum(prefix lens)]
    prefix_lens: torch.Tensor  # int32 [B]
    seq_lens: torch.Tensor  # int32 [B]
    req_to_token: torch.Tensor  # int32 [B, max(seq_lens)]: slots, then pad_slot
    max_len_extend: int  # longest query of the step

    def last_keys(self, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(kv_indptr, kv_indices)`` of each sequence's last ``min(seq_len, keep)`` keys:
        the trimmed tables SGLang's sliding-window decode reads."""
        lens = torch.clamp(self.seq_lens.long(), max=max(keep, 0))
        indptr = torch.zeros_like(self.kv_indptr)
        indptr[1:] = torch.cumsum(lens, 0)
        starts = self.kv_indptr[:-1].long() + self.seq_lens.long() - lens
        first = torch.repeat_interleave(indptr[:-1].long(), lens)
        offsets = torch.arange(first.numel(), device=first.device) - first
        return indptr, self.kv_indices[torch.repeat_interleave(starts, lens) + offsets]


@dataclass(frozen=True)
class DecodeRows:
    """A step as a decode-only kernel takes it (``decode_rows``): one row per query token."""

    tokens: torch.Tensor  # int64 [N]: each decode row's query token
    block_table: torch.Tensor  # int32 [N, W]: local page ids of its sequence, then pad_page
    seq_lens: torch.Tensor  # int32 [N]: the keys each decode row sees

    @property
    def num_rows(self) -> int:
        return int(self.tokens.shape[0])


def _int32(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def _cumulative(counts: list[int]) -> list[int]:
    return [0, *itertools.accumulate(counts)]


def _local_pages(checked: CheckedMetadata, geometry: CacheGeometry) -> list[list[int]]:
    """Each row's in-use pages as ids into the bound tensors (the rank's offset taken off)."""
    return [[page - geometry.page_offset for page in pages] for pages in checked.pages]


def _geometry_of(step: Any) -> CacheGeometry:
    geometry = getattr(step, "geometry", None)
    if geometry is None:
        raise ValueError(
            "this step carries no cache geometry: engine metadata views need a PreparedStep "
            "made by PagedBackendBase.prepare after bind_kv_caches"
        )
    return geometry


def _cached(step: Any, key: tuple[Any, ...], build: Any) -> Any:
    views = step.views
    if key not in views:
        views[key] = build()
    return views[key]


def _check_pad(value: int, name: str, limit: int) -> None:
    if not 0 <= value < limit:
        raise ValueError(f"{name}={value} is not a row of the bound cache (0 .. {limit - 1})")


def vllm_metadata(step: Any, *, pages_per_tile: int = 1, pad_page: int = 0) -> VllmMetadata:
    """The step as vLLM's ``unified_attention`` takes it.

    ``block_table`` has a multiple of ``pages_per_tile`` columns (a kernel
    whose key tile spans ``BLOCK_N // page_size`` pages reads whole tiles of
    entries), filled past each row's in-use pages with ``pad_page``, a local
    page id the kernel may read and must mask (0, the rank's first page, by
    default). Padding rows have ``seqused_k == 0`` and a row of ``pad_page``.
    """
    if pages_per_tile < 1:
        raise ValueError(f"pages_per_tile={pages_per_tile} must be at least 1")
    geometry = _geometry_of(step)
    _check_pad(pad_page, "pad_page", geometry.num_pages)

    def build() -> VllmMetadata:
        checked: CheckedMetadata = step.checked
        pages = _local_pages(checked, geometry)
        widest = max((len(row) for row in pages), default=0)
        width = max(1, -(-widest // pages_per_tile)) * pages_per_tile
        table = [row + [pad_page] * (width - len(row)) for row in pages]
        device = geometry.device
        return VllmMetadata(
            cu_seqlens_q=_int32(checked.query_start, device),
            seqused_k=_int32(checked.seq_lens, device),
            max_seqlen_q=max(checked.query_lens, default=0),
            max_seqlen_k=max(checked.seq_lens, default=0),
            block_table=torch.tensor(table, dtype=torch.int32, device=device).reshape(
                len(table), width
            ),
        )

    return _cached(step, ("vllm", pages_per_tile, pad_page), build)


def flashinfer_metadata(step: Any) -> FlashInferMetadata:
    """The step as FlashInfer's paged-KV wrappers plan it (local page ids)."""
    geometry = _geometry_of(step)

    def build() -> FlashInferMetadata:
        checked: CheckedMetadata = step.checked
        pages = _local_pages(checked, geometry)
        size = geometry.page_size
        last = [
            length - (len(row) - 1) * size if row else 0
            for row, length in zip(pages, checked.seq_lens, strict=True)
        ]
        device = geometry.device
        return FlashInferMetadata(
            qo_indptr=_int32(checked.query_start, device),
            paged_kv_indptr=_int32(_cumulative([len(row) for row in pages]), device),
            paged_kv_indices=_int32([page for row in pages for page in row], device),
            paged_kv_last_page_len=_int32(last, device),
        )

    return _cached(step, ("flashinfer",), build)


def sglang_metadata(step: Any, *, pad_slot: int = 0) -> SglangMetadata:
    """The step as SGLang's Triton decode and extend kernels take it.

    ``req_to_token`` row ``i`` holds sequence ``i``'s slots, then ``pad_slot``
    (a local token row, 0 by default) to the longest sequence of the step.
    """
    geometry = _geometry_of(step)
    _check_pad(pad_slot, "pad_slot", geometry.num_pages * geometry.page_size)

    def build() -> SglangMetadata:
        checked: CheckedMetadata = step.checked
        size = geometry.page_size
        slots = [  # local pages, so these are rows of the bound tensors
            token_slots(row, range(length), size)
            for row, length in zip(_local_pages(checked, geometry), checked.seq_lens, strict=True)
        ]
        prefix = [
            max(length - q, 0) if length else 0
            for length, q in zip(checked.seq_lens, checked.query_lens, strict=True)
        ]
        widest = max(checked.seq_lens, default=0)
        device = geometry.device

        def int64(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        return SglangMetadata(
            qo_indptr=_int32(checked.query_start, device),
            kv_indptr=_int32(_cumulative(checked.seq_lens), device),
            kv_indices=int64([s for row in slots for s in row]),
            prefix_kv_indptr=_int32(_cumulative(prefix), device),
            prefix_kv_indices=int64(
                [s for row, n in zip(slots, prefix, strict=True) for s in row[:n]]
            ),
            prefix_lens=_int32(prefix, device),
            seq_lens=_int32(checked.seq_lens, device),
            req_to_token=torch.tensor(
                [row + [pad_slot] * (widest - len(row)) for row in slots],
                dtype=torch.int32,
                device=device,
            ).reshape(len(slots), widest),
            max_len_extend=max(checked.query_lens, default=0),
        )

    return _cached(step, ("sglang", pad_slot), build)


def decode_rows(step: Any, *, pad_page: int = 0) -> DecodeRows:
    """Every real query token as a decode row over its sequence's pages.

    Token ``j`` of a row of ``q`` new tokens over ``L`` keys sees ``L - q + j + 1``
    of them (all ``L`` without the causal mask); padding rows give none. Block-table
    rows are filled past the in-use pages with ``pad_page`` (a local page id).
    """
    geometry = _geometry_of(step)
    _check_pad(pad_page, "pad_page", geometry.num_pages)

    def build() -> DecodeRows:
        checked: CheckedMetadata = step.checked
        tokens: list[int] = []
        lengths: list[int] = []
        tables: list[list[int]] = []
        rows = zip(checked.seq_lens, _local_pages(checked, geometry), strict=True)
        for row, (length, pages) in enumerate(rows):
            if length == 0:
                continue  # graph-mode padding: nothing to read
            first, q_len = checked.query_start[row], checked.query_lens[row]
            for j in range(q_len):
                tokens.append(first + j)
                lengths.append(length - q_len + j + 1 if checked.causal else length)
                tables.append(pages)
        width = max((len(t) for t in tables), default=1)
        padded = [t + [pad_page] * (width - len(t)) for t in tables]
        device = geometry.device
        return DecodeRows(
            tokens=torch.tensor(tokens, dtype=torch.int64, device=device),
            block_table=torch.tensor(padded, dtype=torch.int32, device=device).reshape(
                len(padded), width
            ),
            seq_lens=_int32(lengths, device),
        )

    return _cached(step, ("decode rows", pad_page), build)
