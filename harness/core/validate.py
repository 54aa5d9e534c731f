"""Validation helpers the built-in backends call (and outside backends may).

The metadata constructor does not validate; these functions
do, once per step, and hand back host-side lists so a backend need not read
the device tensors again. Every error names the field and the value.

Block-table entries past a row's in-use prefix (and every entry of a padded
row) are only checked to be >= -1: engines reuse block-table buffers and
leave stale ids there, and no backend may read them.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from harness.core.contract import AttentionMetadata, LayerCache
from harness.core.errors import CacheBindingError, ForeignPageError, MetadataError
from harness.core.kv_pages import FP8_DTYPES, dp_page_range, is_latent, pages_needed
from harness.core.variants import CACHE_LAYOUTS


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_backend_args(
    *,
    num_heads: object,
    num_kv_heads: object,
    head_dim: object,
    scale: object,
    dp_size: object = 1,
    dp_rank: object = 0,
    kv_lora_rank: object = None,
) -> None:
    """Reject bad constructor arguments with a ``ValueError`` naming the field.

    ``kv_lora_rank`` (MLA) must lie in ``[1, head_dim)`` with one KV head: the latent
    row's first ``kv_lora_rank`` entries are its value, the rest its rope part.
    """
    for name, value in (
        ("num_heads", num_heads),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
    ):
        if not _is_int(value) or value <= 0:  # type: ignore[operator]
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    assert isinstance(num_heads, int)
    assert isinstance(num_kv_heads, int)
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
        )
    try:
        finite = not isinstance(scale, bool) and math.isfinite(scale)  # type: ignore[arg-type]
    except (TypeError, OverflowError):  # a str, or an int beyond float range
        finite = False
    if not finite or scale <= 0:  # type: ignore[operator]
        raise ValueError(f"scale must be a finite positive float, got {scale!r}")
    validate_dp_config(dp_size, dp_rank)
    if kv_lora_rank is not None:
        assert isinstance(head_dim, int)
        if not _is_int(kv_lora_rank) or not 0 < kv_lora_rank < head_dim:  # type: ignore[operator]
            raise ValueError(
                f"kv_lora_rank must be an int in [1, head_dim={head_dim}), got {kv_lora_rank!r}"
            )
        if num_kv_heads != 1:
            raise ValueError(
                f"num_kv_heads must be 1 for MLA (one latent row per token), got {num_kv_heads}"
            )


def validate_dp_config(dp_size: object, dp_rank: object) -> None:
    if not _is_int(dp_size) or dp_size < 1:  # type: ignore[operator]
        raise ValueError(f"dp_size must be an int >= 1, got {dp_size!r}")
    if not _is_int(dp_rank) or not 0 <= dp_rank < dp_size:  # type: ignore[operator]
        raise ValueError(f"dp_rank must be an int in [0, {dp_size}), got {dp_rank!r}")


@dataclass(frozen=True)
class CacheGeometry:
    """What every bound layer shares, as ``validate_layer_caches`` found it.

    ``num_pages`` is how many pages the bound tensors hold; they are the
    global pages ``page_offset .. page_offset + num_pages - 1`` of a pool of
    ``total_pages`` (``num_pages == total_pages`` for a shared pool).
    """

    num_layers: int
    num_pages: int
    page_size: int
    page_offset: int
    total_pages: int
    dtype: torch.dtype
    device: torch.device
    layout: str = "NHD"


def validate_layer_caches(
    layer_caches: object, *, num_kv_heads: int, head_dim: int, value_dim: int | None = None
) -> CacheGeometry:
    """Check that all layers share one geometry matching the backend's heads.

    ``value_dim`` (default ``head_dim``) is the value rows' width: an MLA
    backend's ``kv_lora_rank``, whose value is a view of the latent cache.

    Strided views are accepted (an engine passes the halves of one
    ``[pages, 2, page_size, KV, D]`` tensor), so backends write through the
    given tensors; only tensors whose own slots alias each other are refused.
    """
    if not isinstance(layer_caches, (list, tuple)) or not layer_caches:
        raise CacheBindingError("layer_caches must be a non-empty list of LayerCache")
    first = layer_caches[0]
    for i, cache in enumerate(layer_caches):
        where = f"layer_caches[{i}]"
        if not isinstance(cache, LayerCache):
            raise CacheBindingError(f"{where} is {type(cache).__name__}, expected LayerCache")
        for name in ("key", "value"):
            tensor = getattr(cache, name)
            if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
                raise CacheBindingError(
                    f"{where}.{name} must be a 4-D tensor "
                    "[num_pages, page_size, num_kv_heads, head_dim]"
                )
        if cache.key.shape[:3] != cache.value.shape[:3]:
            raise CacheBindingError(
                f"{where}: key shape {tuple(cache.key.shape)} and "
                f"value shape {tuple(cache.value.shape)} differ before head_dim"
            )
        if cache.key.dtype != cache.value.dtype or cache.key.device != cache.value.device:
            raise CacheBindingError(f"{where}: key and value differ in dtype or device")
        if not cache.key.dtype.is_floating_point:
            raise CacheBindingError(f"{where}: dtype {cache.key.dtype} is not floating point")
        if cache.layout not in CACHE_LAYOUTS and cache.storage is None:
            raise CacheBindingError(
                f"{where}: layout {cache.layout!r} is not one of {', '.join(CACHE_LAYOUTS)} "
                "(a backend-owned page format's caches carry their storage)"
            )
        for name in ("key", "value"):
            tensor = getattr(cache, name)
            if any(n > 1 and s == 0 for n, s in zip(tensor.shape, tensor.stride(), strict=True)):
                raise CacheBindingError(
                    f"{where}.{name} has stride 0 in a dimension of size > 1 "
                    f"(strides {tensor.stride()}): its slots share memory, so a write "
                    "to one would change others"
                )
        if cache.num_kv_heads != num_kv_heads:
            raise CacheBindingError(
                f"{where}: num_kv_heads is {cache.num_kv_heads} in the cache, "
                f"{num_kv_heads} in the backend"
            )
        if cache.head_dim != head_dim:
            raise CacheBindingError(
                f"{where}: head_dim is {cache.head_dim} in the cache, {head_dim} in the backend"
            )
        wanted_value = head_dim if value_dim is None else value_dim
        if cache.value_dim != wanted_value:
            raise CacheBindingError(
                f"{where}: value rows are {cache.value_dim} wide in the cache, "
                f"{wanted_value} in the backend"
                + (" (its kv_lora_rank)" if value_dim is not None else "")
            )
        if value_dim is not None and not is_latent(cache):
            raise CacheBindingError(
                f"{where}: an MLA layer's value must be the view key[..., :kv_lora_rank] of "
                "its latent cache (the same memory), not a tensor of its own"
            )
        if cache.num_pages < 1 or cache.page_size < 1:
            raise CacheBindingError(f"{where}: needs at least one page of at least one token")
        if not _is_int(cache.page_offset) or cache.page_offset < 0:
            raise CacheBindingError(
                f"{where}: page_offset must be an int >= 0, got {cache.page_offset!r}"
            )
        total = cache.total_pages
        if total is not None and (
            not _is_int(total) or total < cache.page_offset + cache.num_pages
        ):
            raise CacheBindingError(
                f"{where}: total_pages {total!r} < page_offset {cache.page_offset} "
                f"+ num_pages {cache.num_pages}"
            )
        same = (
            cache.key.shape == first.key.shape
            and cache.key.dtype == first.key.dtype
            and cache.key.device == first.key.device
            and cache.page_offset == first.page_offset
            and cache.global_total_pages == first.global_total_pages
            and cache.layout == first.layout
        )
        if not same:
            raise CacheBindingError(
                f"{where}: shape, dtype, device, page_offset, total_pages or layout differ "
                "from layer 0"
            )
    return CacheGeometry(
        num_layers=len(layer_caches),
        num_pages=first.num_pages,
        page_size=first.page_size,
        page_offset=first.page_offset,
        total_pages=first.global_total_pages,
        dtype=first.key.dtype,
        device=first.key.device,
        layout=first.layout,
    )


def check_rank_is_bound(geometry: CacheGeometry, dp_size: int, dp_rank: int) -> range:
    """The rank's page range, which must lie inside the bound tensors."""
    try:
        page_range = dp_page_range(geometry.total_pages, dp_size, dp_rank)
    except ValueError as exc:
        raise CacheBindingError(f"bad DP partition for the bound cache: {exc}") from exc
    held = range(geometry.page_offset, geometry.page_offset + geometry.num_pages)
    if page_range.start < held.start or page_range.stop > held.stop:
        hint = ""
        if geometry.total_pages == held.stop and dp_size > 1 and held.start > 0:
            hint = (
                f"; the pool's size was taken as page_offset + num_pages = {held.stop}: a "
                "per-rank cache must give the whole pool's total_pages"
            )
        raise CacheBindingError(
            f"rank {dp_rank} of {dp_size} owns pages [{page_range.start}, {page_range.stop}) "
            f"but the bound cache holds [{held.start}, {held.stop}){hint}"
        )
    return page_range


@dataclass(frozen=True)
class CheckedMetadata:
    """Host-side lists of a validated step (one read of the device tensors).

    ``query_start`` is ``query_start_loc`` (rows + 1 entries; row ``i``'s
    query tokens are ``query_start[i]:query_start[i + 1]``); ``seq_lens``
    holds each row's whole length (0 for a graph-mode padding row);
    ``pages`` each row's in-use global page ids, ``ceil(seq_len /
    page_size)`` of them, without the stale entries past them; ``slots``
    the global slot of every query token (-1: write nothing); ``causal``
    the metadata's mask flag.
    """

    query_start: list[int]
    seq_lens: list[int]
    pages: list[list[int]]  # the in-use pages of each row
    slots: list[int]
    causal: bool

    @property
    def query_lens(self) -> list[int]:
        return [b - a for a, b in itertools.pairwise(self.query_start)]

    @property
    def real_rows(self) -> list[int]:
        """Rows that are sequences, not graph-mode padding."""
        return [i for i, length in enumerate(self.seq_lens) if length > 0]


_FIELD_SPECS = (
    ("query_start_loc", torch.int32, 1),
    ("seq_lens", torch.int32, 1),
    ("block_table", torch.int32, 2),
    ("slot_mapping", torch.int64, 1),
)


def _check_tensor_fields(metadata: AttentionMetadata) -> None:
    device = None
    for name, dtype, ndim in _FIELD_SPECS:
        tensor = getattr(metadata, name)
        if not isinstance(tensor, torch.Tensor):
            raise MetadataError(name, f"must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dtype != dtype:
            raise MetadataError(name, f"dtype must be {dtype}, got {tensor.dtype}")
        if tensor.dim() != ndim:
            raise MetadataError(name, f"must be {ndim}-D, got shape {tuple(tensor.shape)}")
        if device is None:
            device = tensor.device
        elif tensor.device != device:
            raise MetadataError(name, f"is on {tensor.device}, other fields on {device}")


def _check_shapes(metadata: AttentionMetadata) -> tuple[int, int]:
    batch = metadata.seq_lens.shape[0]
    if metadata.query_start_loc.shape[0] != batch + 1:
        raise MetadataError(
            "query_start_loc",
            f"length {metadata.query_start_loc.shape[0]} != len(seq_lens) + 1 = {batch + 1}",
        )
    if metadata.block_table.shape[0] != batch:
        raise MetadataError(
            "block_table",
            f"has {metadata.block_table.shape[0]} rows, expected len(seq_lens) = {batch}",
        )
    return batch, metadata.slot_mapping.shape[0]


def _check_query_starts(starts: list[int], num_tokens: int) -> None:
    if starts[0] != 0:
        raise MetadataError("query_start_loc", f"must start at 0, starts at {starts[0]}")
    for i, (a, b) in enumerate(itertools.pairwise(starts)):
        if b < a:
            raise MetadataError("query_start_loc", f"decreases at index {i + 1}: {a} -> {b}")
    if starts[-1] != num_tokens:
        raise MetadataError(
            "query_start_loc", f"ends at {starts[-1]} but slot_mapping has {num_tokens} tokens"
        )


def validate_metadata(
    metadata: AttentionMetadata,
    *,
    page_size: int,
    total_pages: int | None = None,
    graph_mode: bool = False,
) -> CheckedMetadata:
    """Check every field of ``metadata`` against the contract.

    Beyond types and shapes it checks that each new token's slot is the one
    its block table implies, so a backend that writes by ``slot_mapping`` and
    reads by ``block_table`` sees the same memory.
    """
    if not isinstance(metadata, AttentionMetadata):
        raise MetadataError(
            "metadata", f"expected AttentionMetadata, got {type(metadata).__name__}"
        )
    _check_tensor_fields(metadata)
    _, num_tokens = _check_shapes(metadata)
    if not isinstance(metadata.causal, bool):
        raise MetadataError("causal", f"must be a bool, got {metadata.causal!r}")
    starts = metadata.query_start_loc.tolist()
    seq_lens = metadata.seq_lens.tolist()
    table = metadata.block_table.tolist()
    slots = metadata.slot_mapping.tolist()
    _check_query_starts(starts, num_tokens)
    query_lens = [b - a for a, b in itertools.pairwise(starts)]
    maxima = (
        ("max_query_len", metadata.max_query_len, max(query_lens, default=0)),
        ("max_seq_len", metadata.max_seq_len, max(seq_lens, default=0)),
    )
    for name, value, expect in maxima:
        if not _is_int(value) or value != expect:
            raise MetadataError(name, f"is {value!r}, the maximum over rows is {expect}")
    pages_in_use: list[list[int]] = []
    for row, (length, q_len) in enumerate(zip(seq_lens, query_lens, strict=True)):
        pages_in_use.append(
            _check_row(
                row,
                length,
                q_len,
                table[row],
                slots[starts[row] : starts[row + 1]],
                page_size,
                total_pages,
                graph_mode,
            )
        )
    seen: set[int] = set()
    for token, slot in enumerate(slots):
        if slot != -1 and slot in seen:
            raise MetadataError("slot_mapping", f"slot {slot} is written twice (token {token})")
        seen.add(slot)
    return CheckedMetadata(starts, seq_lens, pages_in_use, slots, metadata.causal)


def _check_row(
    row: int,
    length: int,
    q_len: int,
    table_row: list[int],
    row_slots: list[int],
    page_size: int,
    total_pages: int | None,
    graph_mode: bool,
) -> list[int]:
    if length < 0:
        raise MetadataError("seq_lens", f"row {row} is negative: {length}")
    if any(s < -1 for s in row_slots):
        raise MetadataError("slot_mapping", f"row {row} has slot {min(row_slots)} < -1")
    if any(p < -1 for p in table_row):
        raise MetadataError("block_table", f"row {row} has entry {min(table_row)} < -1")
    if length == 0:
        if q_len and not graph_mode:
            raise MetadataError(
                "seq_lens",
                f"row {row} is 0 with {q_len} query tokens; "
                "padded rows are allowed only with graph_mode=True",
            )
        if any(s != -1 for s in row_slots):
            bad = next(s for s in row_slots if s != -1)
            raise MetadataError("slot_mapping", f"padded row {row} writes slot {bad}; must be -1")
        return []
    if length < q_len:
        raise MetadataError(
            "seq_lens", f"row {row} is {length}, shorter than its {q_len} query tokens"
        )
    needed = pages_needed(length, page_size)
    if needed > len(table_row):
        raise MetadataError(
            "block_table",
            f"row {row} needs {needed} pages for {length} tokens, has {len(table_row)} columns",
        )
    pages = table_row[:needed]
    for page in pages:
        if page < 0 or (total_pages is not None and page >= total_pages):
            raise MetadataError(
                "block_table",
                f"row {row} uses page {page}, outside "
                f"[0, {total_pages if total_pages is not None else 'inf'})",
            )
    if len(set(pages)) != len(pages):
        twice = next(p for p in pages if pages.count(p) > 1)
        raise MetadataError("block_table", f"row {row} uses page {twice} twice")
    if graph_mode and row_slots and all(s == -1 for s in row_slots):
        return pages  # a padding row in engines' one-token form: it reads, and writes nothing
    for j, slot in enumerate(row_slots):
        pos = length - q_len + j
        expect = pages[pos // page_size] * page_size + pos % page_size
        if slot != expect:
            raise MetadataError(
                "slot_mapping",
                f"token {j} of row {row} (position {pos}) "
                f"has slot {slot}, its block table gives {expect}",
            )
    return pages


def check_rank_ownership(checked: CheckedMetadata, *, page_size: int, page_range: range) -> None:
    """Reject in-use pages or written slots outside ``page_range``."""
    for row, pages in enumerate(checked.pages):
        for page in pages:
            if page not in page_range:
                raise ForeignPageError(
                    "block_table",
                    f"row {row} uses page {page}, outside this rank's "
                    f"pages [{page_range.start}, {page_range.stop})",
                )
    for token, slot in enumerate(checked.slots):
        if slot != -1 and slot // page_size not in page_range:
            raise ForeignPageError(
                "slot_mapping",
                f"token {token} writes slot {slot} (page "
                f"{slot // page_size}), outside this rank's pages "
                f"[{page_range.start}, {page_range.stop})",
            )


def validate_forward_inputs(
    query: object,
    key: object,
    value: object,
    layer_idx: object,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    num_tokens: int,
    geometry: CacheGeometry,
    value_dim: int | None = None,
) -> None:
    """Check ``forward``'s tensors against the bound cache and the prepared step
    (``value_dim``: an MLA backend's ``kv_lora_rank``)."""
    expect = {
        "query": (num_tokens, num_heads, head_dim),
        "key": (num_tokens, num_kv_heads, head_dim),
        "value": (num_tokens, num_kv_heads, head_dim if value_dim is None else value_dim),
    }
    quantized = geometry.dtype in FP8_DTYPES  # the model dtype is the query's, not the cache's
    model_dtype = query.dtype if quantized and isinstance(query, torch.Tensor) else geometry.dtype
    if model_dtype in FP8_DTYPES:
        raise ValueError(f"query dtype {model_dtype} is an FP8 dtype: only the cache may be")
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tuple(tensor.shape) != expect[name]:
            raise ValueError(f"{name} shape {tuple(tensor.shape)} != expected {expect[name]}")
        if tensor.dtype != model_dtype:
            what = "query dtype" if quantized else "cache dtype"
            raise ValueError(f"{name} dtype {tensor.dtype} != {what} {model_dtype}")
        if tensor.device != geometry.device:
            raise ValueError(f"{name} is on {tensor.device}, the cache on {geometry.device}")
    if not _is_int(layer_idx) or not 0 <= layer_idx < geometry.num_layers:  # type: ignore[operator]
        raise ValueError(
            f"layer_idx must be an int in [0, {geometry.num_layers}), got {layer_idx!r}"
        )


def read_metadata(metadata: AttentionMetadata, *, page_size: int) -> CheckedMetadata:
    """The host-side lists of ``metadata`` without checking it (``validate=False``)."""
    seq_lens = metadata.seq_lens.tolist()
    table = metadata.block_table.tolist()
    pages = [
        row[: pages_needed(length, page_size)] for row, length in zip(table, seq_lens, strict=True)
    ]
    return CheckedMetadata(
        metadata.query_start_loc.tolist(),
        seq_lens,
        pages,
        metadata.slot_mapping.tolist(),
        bool(metadata.causal),
    )
