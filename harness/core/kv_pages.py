"""KV pages: the DP partition, the page allocator and cache construction.

``dp_page_range`` is the one partition function. The
``PagePool`` hands each rank pages only from its own range, so every batch
built on it is by construction one that rank may legally see.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable, Sequence

import torch

from harness.core.contract import LayerCache
from harness.core.errors import OutOfPages
from harness.core.page_formats import PageFormat, check_views


def _require_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {value!r}")
    return value


def dp_page_range(total_pages: int, dp_size: int, dp_rank: int) -> range:
    """Global page ids owned by ``dp_rank``: balanced and contiguous.

    ``base, extra = divmod(total_pages, dp_size)``; rank ``r`` gets
    ``base + (r < extra)`` pages starting at ``r * base + min(r, extra)``.
    """
    total_pages = _require_int("total_pages", total_pages)
    dp_size = _require_int("dp_size", dp_size)
    dp_rank = _require_int("dp_rank", dp_rank)
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank must be in [0, {dp_size}), got {dp_rank}")
    if total_pages < dp_size:
        raise ValueError(
            f"total_pages ({total_pages}) must be >= dp_size ({dp_size}): "
            "every rank needs at least one page"
        )
    base, extra = divmod(total_pages, dp_size)
    start = dp_rank * base + min(dp_rank, extra)
    return range(start, start + base + (dp_rank < extra))


class PoolLayout(enum.Enum):
    """How cache tensors map to ranks."""

    SHARED = "shared"
    """One pool on one device; every rank binds all of it, ``page_offset = 0``."""
    PER_RANK = "per_rank"
    """One pool per rank holding only its own pages, ``page_offset = range.start``."""


class PagePool:
    """Allocates global page ids per DP rank, with reference counts.

    Reference counts let sequences share prefix pages: a page returns to its
    rank's free list when its last holder frees it. ``shuffle_seed`` hands
    pages out in a random order, so block tables are not monotone;
    ``from_top`` hands out each range's last pages first.
    """

    def __init__(
        self,
        total_pages: int,
        dp_size: int = 1,
        *,
        shuffle_seed: int | None = None,
        from_top: bool = False,
        padding_pages: bool = False,
    ) -> None:
        dp_page_range(total_pages, dp_size, 0)  # validates all three arguments
        self.total_pages = total_pages
        self.dp_size = dp_size
        self.ranges = [dp_page_range(total_pages, dp_size, r) for r in range(dp_size)]
        self.padding_pages = padding_pages
        self._free: list[list[int]] = []
        for page_range in self.ranges:
            pages = list(page_range)[1:] if padding_pages else list(page_range)
            if shuffle_seed is not None:
                random.Random(shuffle_seed * 1_000_003 + page_range.start).shuffle(pages)
            if not from_top:  # from_top: a pool whose low pages are taken by others
                pages.reverse()  # pop() from the end hands out the first page first
            self._free.append(pages)
        self._refs: dict[int, int] = {}

    def rank_range(self, rank: int) -> range:
        self._check_rank(rank)
        return self.ranges[rank]

    def padding_page(self, rank: int) -> int | None:
        """The page ``rank``'s padding rows read (``None`` unless ``padding_pages``)."""
        self._check_rank(rank)
        return self.ranges[rank].start if self.padding_pages else None

    def num_free(self, rank: int) -> int:
        self._check_rank(rank)
        return len(self._free[rank])

    def allocate(self, rank: int, count: int) -> list[int]:
        """Take ``count`` pages from ``rank``'s range; all or nothing."""
        self._check_rank(rank)
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        free = self._free[rank]
        if count > len(free):
            raise OutOfPages(
                f"rank {rank} needs {count} pages but has {len(free)} free "
                f"of {len(self.ranges[rank])}"
            )
        pages = [free.pop() for _ in range(count)]
        for page in pages:
            self._refs[page] = 1
        return pages

    def retain(self, pages: Iterable[int]) -> None:
        """Add a holder to pages already allocated (prefix sharing); all or nothing."""
        pages = list(pages)
        for page in pages:
            if page not in self._refs:
                raise ValueError(f"page {page} is not allocated")
        for page in pages:
            self._refs[page] += 1

    def free(self, pages: Iterable[int]) -> None:
        """Drop one holder of each page; a page with none left is free again. All or nothing."""
        pages = list(pages)
        drops: dict[int, int] = {}
        for page in pages:
            drops[page] = drops.get(page, 0) + 1
        for page, count in drops.items():
            if self._refs.get(page, 0) < count:
                raise ValueError(f"page {page} is not allocated (double free?)")
        for page in pages:
            refs = self._refs[page]
            if refs > 1:
                self._refs[page] = refs - 1
                continue
            del self._refs[page]
            self._free[self.owner(page)].append(page)

    def owner(self, page: int) -> int:
        """The rank whose range holds ``page``."""
        for rank, page_range in enumerate(self.ranges):
            if page in page_range:
                return rank
        raise ValueError(f"page {page} is outside the pool [0, {self.total_pages})")

    def refcount(self, page: int) -> int:
        return self._refs.get(page, 0)

    def _check_rank(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.dp_size:
            raise ValueError(f"rank must be an int in [0, {self.dp_size}), got {rank!r}")


STALE_MAGNITUDE = 8.0
"""Stale values' scale: eight times the drawn K/V, so a kernel that lets one reach an
output is far from the oracle, while a product of it with a masked weight of 0 is 0."""


STALE_PAGES = 7
"""Distinct pages of stale values, repeated over the pool: drawing a whole pool at random
took most of a thorough run's time for a large pool (its ranks, every example)."""


def fill_stale(cache: LayerCache, gen: torch.Generator) -> None:
    """Fill every slot with finite random values, as K/V an earlier sequence left behind.

    ``STALE_PAGES`` random pages repeat over the pool, so the fill costs a copy.
    """
    for tensor in (cache.key_nhd,) if is_latent(cache) else (cache.key_nhd, cache.value_nhd):
        pages = tensor.shape[0]
        distinct = min(pages, STALE_PAGES)
        stale = torch.randn((distinct, *tensor.shape[1:]), generator=gen) * STALE_MAGNITUDE
        stale = stale.to(dtype=tensor.dtype, device=tensor.device)
        whole = pages // distinct * distinct
        if whole:
            blocks = tensor[:whole].unflatten(0, (whole // distinct, distinct))
            blocks.copy_(stale.expand(whole // distinct, *stale.shape))
        tensor[whole:].copy_(stale[: pages - whole])


def zero_padding_pages(cache: LayerCache, total_pages: int, dp_size: int) -> None:
    """Zero every rank's padding page (``PagePool.padding_page``) that ``cache`` holds, as an
    engine's never-written null block is: a padding row reading one token there reads zeros."""
    held = range(cache.page_offset, cache.page_offset + cache.key.shape[0])
    for rank in range(dp_size):
        page = dp_page_range(total_pages, dp_size, rank).start
        if page in held:
            cache.key[page - cache.page_offset].zero_()
            cache.value[page - cache.page_offset].zero_()


def make_layer_caches(
    *,
    num_layers: int,
    total_pages: int,
    page_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    layout: PoolLayout = PoolLayout.SHARED,
    dp_size: int = 1,
    dp_rank: int = 0,
    fill: float = float("nan"),
    combined_kv: bool = False,
    cache_layout: str = "NHD",
    page_format: PageFormat | None = None,
    value_dim: int | None = None,
) -> list[LayerCache]:
    """Cache tensors for one rank in either layout, filled with ``fill``.

    ``value_dim`` makes MLA latent caches: ``key`` is the latent cache with one head and
    ``value`` the view of each row's first ``value_dim`` entries (one tensor per layer).

    The default NaN fill stands for the garbage a real engine leaves in
    unwritten memory: a backend that reads it produces NaN and fails.
    ``combined_kv`` holds each layer in one ``[pages, 2, page_size, KV, D]``
    tensor, as engines do, and hands out its two halves: strided views that a
    backend must write through, since no flat view of them exists.
    ``cache_layout="HND"`` swaps the page-size and head dimensions; ``dtype``
    may be an FP8 dtype (an FP8 KV cache). With ``page_format`` (a backend's
    own, ``cache_layout`` its name) each layer comes from the format, filled
    through its NHD views; ``combined_kv`` is then the format's business.
    """
    if layout is PoolLayout.SHARED:
        offset, held = 0, total_pages
    else:
        page_range = dp_page_range(total_pages, dp_size, dp_rank)
        offset, held = page_range.start, len(page_range)
    inner = (num_kv_heads, page_size) if cache_layout == "HND" else (page_size, num_kv_heads)
    shape = (held, *inner, head_dim)
    if value_dim is not None and (combined_kv or page_format is not None):
        raise ValueError("an MLA latent cache is one tensor per layer: no combined K/V or format")
    if page_format is not None:
        return [
            _formatted_cache(page_format, shape, dtype, device, fill, offset, total_pages)
            for _ in range(num_layers)
        ]
    caches = []
    for _ in range(num_layers):
        if combined_kv:
            both = torch.full((held, 2, *shape[1:]), fill, dtype=dtype, device=device)
            key, value = both[:, 0], both[:, 1]
        elif value_dim is not None:
            key = torch.full(shape, fill, dtype=dtype, device=device)
            value = key[..., :value_dim]
        else:
            key = torch.full(shape, fill, dtype=dtype, device=device)
            value = torch.full(shape, fill, dtype=dtype, device=device)
        caches.append(
            LayerCache(
                key=key,
                value=value,
                page_offset=offset,
                total_pages=total_pages,
                layout=cache_layout,
            )
        )
    return caches


def _formatted_cache(
    fmt: PageFormat,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: str | torch.device,
    fill: float,
    page_offset: int,
    total_pages: int,
) -> LayerCache:
    held, page_size, num_kv_heads, head_dim = shape
    tensors = fmt.allocate(
        num_pages=held,
        page_size=page_size,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        device=device,
    )
    check_views(tensors, (held, page_size, num_kv_heads, head_dim), fmt)
    tensors.key.fill_(fill)
    tensors.value.fill_(fill)
    return LayerCache(
        key=tensors.key,
        value=tensors.value,
        page_offset=page_offset,
        total_pages=total_pages,
        layout=fmt.name,
        storage=tensors.storage,
    )


def pages_needed(length: int, page_size: int) -> int:
    """Pages holding ``length`` tokens: the in-use prefix of a block-table row."""
    return -(-length // page_size)


def token_slots(pages: Sequence[int], positions: Iterable[int], page_size: int) -> list[int]:
    """Global slots of token ``positions`` of a sequence laid on ``pages``."""
    return [pages[p // page_size] * page_size + p % page_size for p in positions]


def local_slots(cache: LayerCache, global_slots: torch.Tensor) -> torch.Tensor:
    """Turn global slot ids into row indices of ``cache`` flattened to tokens."""
    return global_slots - cache.page_offset * cache.page_size


def _rows_mergeable(tensor: torch.Tensor) -> bool:
    """Whether pages and in-page offsets merge into one token dimension without a copy."""
    pages, size = tensor.shape[0], tensor.shape[1]
    return pages <= 1 or size <= 1 or tensor.stride(0) == tensor.stride(1) * size


def flat_tokens(tensor: torch.Tensor) -> torch.Tensor:
    """View a ``[pages, page_size, heads, dim]`` cache tensor as ``[slots, heads, dim]``.

    Raises ``ValueError`` when no such view exists (a half of a combined
    ``[pages, 2, ...]`` tensor): a reshaped copy would silently drop writes.
    """
    if not _rows_mergeable(tensor):
        raise ValueError(
            f"a cache tensor with shape {tuple(tensor.shape)} and strides {tensor.stride()} "
            "has no [slots, heads, dim] view; index it by (page, offset) instead"
        )
    return tensor.view(-1, tensor.shape[2], tensor.shape[3])


def token_index(tensor: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(page, offset)`` of flattened-cache ``rows`` in a ``[pages, page_size, ...]`` tensor.

    Negative rows map to page ``num_pages`` so indexing raises, as a flat
    ``index_copy_`` / ``index_select`` would, instead of wrapping around.
    """
    size = tensor.shape[1]
    pages = torch.div(rows, size, rounding_mode="floor").masked_fill(rows < 0, tensor.shape[0])
    return pages, rows.remainder(size)


FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """An FP8 tensor as ``uint8`` (same memory): torch's CPU indexing kernels lack FP8."""
    return tensor.view(torch.uint8) if tensor.dtype in FP8_DTYPES else tensor


def put_rows(tensor: torch.Tensor, rows: torch.Tensor, src: torch.Tensor) -> None:
    """Write ``src[i]`` to flattened-cache row ``rows[i]`` of ``tensor``, in place.

    Works on any strided view (a combined K/V half or an HND cache seen as
    NHD included): the write goes through ``tensor`` itself, by a flat view
    when one exists, else by ``(page, offset)`` pairs.
    """
    if tensor.dtype in FP8_DTYPES:
        tensor, src = _as_bytes(tensor), _as_bytes(src.to(tensor.dtype))
    if _rows_mergeable(tensor):
        flat_tokens(tensor).index_copy_(0, rows, src)
    else:
        tensor.index_put_(token_index(tensor, rows), src)


def take_rows(tensor: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Flattened-cache rows of ``tensor`` as a new contiguous ``[len(rows), heads, dim]``."""
    if tensor.dtype in FP8_DTYPES:
        return take_rows(_as_bytes(tensor), rows).view(tensor.dtype)
    if _rows_mergeable(tensor):
        return flat_tokens(tensor).index_select(0, rows)
    return tensor[token_index(tensor, rows)]


def write_tokens(
    cache: LayerCache,
    global_slots: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Store key/value rows at global slots (all slots must be held by ``cache``).

    An FP8 cache stores ``key / k_scale`` and ``value / v_scale`` rounded to it. An MLA
    latent cache (whose value is a view of its key) gets the key, its latent rows, only.
    """
    rows = local_slots(cache, global_slots.to(device=cache.key.device, dtype=torch.long))
    if cache.key.dtype in FP8_DTYPES:
        key, value = key.float() / k_scale, value.float() / v_scale
    put_rows(cache.key_nhd, rows, key.to(cache.key.dtype))
    if not is_latent(cache):
        put_rows(cache.value_nhd, rows, value.to(cache.value.dtype))


def is_latent(cache: LayerCache) -> bool:
    """Whether ``cache`` is an MLA latent cache: its value the first entries of each key row,
    in place (the same memory, offset and strides), narrower than the key."""
    key, value = cache.key, cache.value
    return (
        cache.value_dim < cache.head_dim
        and value.untyped_storage().data_ptr() == key.untyped_storage().data_ptr()
        and value.storage_offset() == key.storage_offset()
        and value.stride() == key.stride()
    )


def read_tokens(
    cache: LayerCache, pages: Sequence[int], length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``length`` tokens of a sequence on ``pages``, contiguous ``[L, KV, D]``."""
    slots = torch.tensor(token_slots(pages, range(length), cache.page_size), dtype=torch.long)
    rows = local_slots(cache, slots).to(cache.key.device)
    return take_rows(cache.key_nhd, rows), take_rows(cache.value_nhd, rows)
