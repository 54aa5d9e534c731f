"""A KV pool past 2^31 elements, where 32-bit element offsets wrap.

Engines allocate one K and one V tensor per layer of many GB. A kernel that
forms an element offset (``page * page_stride + slot * row_stride + ...``)
in int32 reads and writes the wrong memory once a tensor passes 2^31
elements, a bug class that has shipped. So the suite binds such a pool and
uses only its top pages. The tensors come from ``torch.empty``: untouched
virtual memory costs nothing, so only the top ``WATCHED_PAGES`` pages (the
ones in use and a margin) are NaN-poisoned and compared before and after the
step; the rest is never written by this harness, never read by a correct
backend, and not checked.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from harness.core.contract import Capabilities, LayerCache
from harness.core.kv_pages import STALE_MAGNITUDE, PagePool
from harness.numerics.canary import bits
from harness.numerics.latent import for_kind, latent_pairs
from harness.numerics.scenario import Scenario, StepInputs, engine_conventions, make_step_inputs

INT32_ELEMENTS = 2**31
WATCHED_PAGES = 16
"""Pages at the top of the pool that are NaN-poisoned and compared: the ones in use and more."""
CONTEXT_LENS = (37, 21)  # a decode and an extend, both mid-page
QUERY_LENS = (1, 5)
MEMORY_HEADROOM = 1.25  # a pool this many times its size must fit the device's limit


def large_pool_scenario(caps: Capabilities, device: str) -> Scenario | None:
    """The cheapest step over a pool past 2^31 elements inside ``caps``; ``None`` if none fits.

    The claimed dtype with the fewest bytes, the widest claimed head dim up
    to 256 and a page size of 16 where claimed: each K and V tensor just past
    2^31 elements (4 GiB in a 2-byte dtype), with the watched pages above it.
    """
    too_short = caps.max_seq_len is not None and caps.max_seq_len < max(CONTEXT_LENS)
    too_big = caps.max_cache_elements is not None and caps.max_cache_elements < INT32_ELEMENTS
    if not caps.dtypes or too_short or too_big or "auto" not in caps.kv_cache_dtypes:
        return None  # (an FP8-only claim is not tried here)
    dtype = min(caps.dtypes, key=lambda d: torch.empty((), dtype=d).element_size())
    head_dims = [d for d in (caps.head_dims or (128,)) if d <= 256]
    if caps.kind == "mla":  # one latent head of a served model's width
        head_dims = [sum(latent_pairs(caps, production=True)[0])]
    page_sizes = caps.page_sizes or (16,)
    if not head_dims or not page_sizes:
        return None
    head_dim = max(head_dims)
    multiples = (caps.page_size_multiple * n for n in (1, 2))
    allowed = [p for p in page_sizes if caps.allows_page_size(p)] or [
        p for p in multiples if caps.allows_page_size(p)
    ]
    if not allowed:
        return None
    page_size = 16 if 16 in allowed else max(allowed)
    page_elements = page_size * head_dim  # one KV head
    step = Scenario(
        num_heads=2,
        num_kv_heads=1,
        head_dim=head_dim,
        page_size=page_size,
        total_pages=INT32_ELEMENTS // page_elements + WATCHED_PAGES + 1,
        num_layers=1,
        context_lens=CONTEXT_LENS,
        query_lens=QUERY_LENS,
        dtype=dtype,
        device=device,
        planted_keys=1,
        cache_layout=caps.cache_layouts[0],
        **engine_conventions(caps),
    )
    return for_kind(caps, step, production=True)


def tensor_bytes(s: Scenario) -> int:
    """Bytes of one of the pool's K (or V) tensors."""
    item = torch.empty((), dtype=s.cache_dtype).element_size()
    return s.total_pages * s.page_size * s.num_kv_heads * s.head_dim * item


def unavailable_reason(s: Scenario) -> str | None:
    """Why this machine cannot hold the pool's K and V tensors; ``None`` when it can.

    On the CPU the tensors are virtual memory: Linux grants them unless it
    counts every byte (``vm.overcommit_memory = 2``) or one allocation is
    larger than RAM and swap. On CUDA they are real device memory.
    """
    size = tensor_bytes(s)
    if s.device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info()
        if 2 * size * MEMORY_HEADROOM > free:
            return f"needs 2 x {size / 2**30:.1f} GiB of device memory, {free / 2**30:.1f} free"
        return None
    if not sys.platform.startswith("linux"):
        return "untouched-memory accounting is known only on Linux"
    policy = Path("/proc/sys/vm/overcommit_memory").read_text().strip()
    if policy == "2":
        return "vm.overcommit_memory is 2: untouched pages count against the commit limit"
    meminfo = dict(
        line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line
    )
    limit = sum(int(meminfo.get(k, "0 kB").split()[0]) * 1024 for k in ("MemTotal", "SwapTotal"))
    if policy == "0" and size * MEMORY_HEADROOM > limit:
        return (
            f"one {size / 2**30:.1f} GiB tensor is more than RAM and swap ({limit / 2**30:.1f} GiB)"
        )
    return None


def _watched(tensor: torch.Tensor) -> torch.Tensor:
    """The top ``WATCHED_PAGES`` pages of an NHD view as ``[slots, KV, D]`` (a copy for HND)."""
    top = tensor[-WATCHED_PAGES:]
    return top.reshape(-1, *top.shape[2:])


def large_pool_caches(s: Scenario) -> list[LayerCache]:
    """Untouched K/V tensors of ``s.total_pages`` pages (in the backend's own page format
    where it has one), the top ones NaN-poisoned (stale finite values where its engine
    keeps unused memory finite)."""
    inner = (
        (s.num_kv_heads, s.page_size) if s.cache_layout == "HND" else (s.page_size, s.num_kv_heads)
    )
    shape = (s.total_pages, *inner, s.head_dim)
    gen = torch.Generator().manual_seed(s.seed + 3)
    caches = []
    for _ in range(s.num_layers):
        fmt = s.owned_format
        if fmt is None:
            key = torch.empty(shape, dtype=s.cache_dtype, device=s.device)
            value = (
                key[..., : s.kv_lora_rank]  # MLA: the latent rows' prefix
                if s.kv_lora_rank is not None
                else torch.empty(shape, dtype=s.cache_dtype, device=s.device)
            )
            cache = LayerCache(key=key, value=value, layout=s.cache_layout)
        else:
            tensors = fmt.allocate(
                num_pages=s.total_pages,
                page_size=s.page_size,
                num_kv_heads=s.num_kv_heads,
                head_dim=s.head_dim,
                dtype=s.cache_dtype,
                device=s.device,
            )
            cache = LayerCache(
                key=tensors.key, value=tensors.value, layout=fmt.name, storage=tensors.storage
            )
        for tensor in (cache.key_nhd, cache.value_nhd):
            top = tensor[-WATCHED_PAGES:]
            if s.unused_cache == "finite":
                top.copy_((torch.randn(top.shape, generator=gen) * STALE_MAGNITUDE).to(top.dtype))
            else:
                top.fill_(float("nan"))
        caches.append(cache)
    return caches


def large_pool_inputs(s: Scenario) -> StepInputs:
    """The step's inputs on the large pool, its sequences on the pool's top pages."""
    pool = PagePool(s.total_pages, from_top=True)
    return make_step_inputs(s, pool=pool, caches=large_pool_caches(s))


def watched_snapshot(inputs: StepInputs) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Bit patterns of each layer's watched K and V pages (NaN != NaN, so bits, not values)."""
    return [(bits(_watched(c.key_nhd)), bits(_watched(c.value_nhd))) for c in inputs.caches]


def changed_watched_slots(
    inputs: StepInputs, before: list[tuple[torch.Tensor, torch.Tensor]]
) -> list[set[int]]:
    """Per layer, the global slots of the watched pages whose K or V bits changed."""
    s = inputs.scenario
    first_slot = (s.total_pages - WATCHED_PAGES) * s.page_size
    changed = []
    for cache, (key, value) in zip(inputs.caches, before, strict=True):
        now_k, now_v = bits(_watched(cache.key_nhd)), bits(_watched(cache.value_nhd))
        differs = (now_k != key).flatten(1).any(-1) | (now_v != value).flatten(1).any(-1)
        rows = differs.nonzero().flatten()
        changed.append({first_slot + int(r) for r in rows.tolist()})
    return changed
