"""The backend contract: the public API outside backends are written against.

Names and field meanings here are normative; new fields only with defaults.
The backend author's reference, field by field and rule by rule, is
``docs/contract.md`` in the repository.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from harness.core.page_formats import PageFormat

DEFAULT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
VARIANT_FEATURES = ("sliding_window", "soft_cap", "sinks", "alibi", "fp8")
"""The names ``Capabilities.incompatible`` pairs: the variant flags, and an FP8 cache."""
PADDING_ROWS = ("unspecified", "finite", "zero")
"""What ``Capabilities.padding_rows`` may promise of graph-mode padding rows' outputs."""
UNUSED_CACHE = ("any", "finite")
"""What a backend's engine keeps in cache memory no token occupies (``Capabilities.unused_cache``):
``any`` (the contract: garbage, NaN included; the suites fill it with NaN) or ``finite``
(an engine that zero-fills its cache and writes finite K/V only: the suites fill it with
large finite stale values, which still fail a kernel that reads them into an output)."""
ATTENTION_KINDS = ("mha", "mla")
"""The attention a backend serves (``Capabilities.kind``): ``mha`` (multi-head and grouped-query
attention over per-head K/V pages) or ``mla`` (multi-head latent attention: one latent row per
token shared by every query head; see ``LayerCache.latent``)."""
PADDING_CONVENTIONS = ("empty", "one-token")
"""How graph-mode padding rows come (``Capabilities.padding_convention``): ``empty`` is the
contract's (``seq_len`` 0, a block-table row of -1); ``one-token`` is vLLM's and SGLang's
captured graphs' (``seq_len`` 1, one new token, block-table entry 0 the rank's padding
page: the first of its range, never given to a sequence and holding zeros). Slots are -1
in both: a padding row writes nothing."""


@dataclass(frozen=True, eq=False, kw_only=True)
class LayerCache:
    """One layer's paged KV cache, NHD: ``[num_pages, page_size, num_kv_heads, head_dim]``.

    ``layout="HND"`` holds ``[num_pages, num_kv_heads, page_size, head_dim]``
    instead (only for a backend that claims it in ``cache_layouts``);
    ``key_nhd``/``value_nhd`` view either as NHD. An FP8 cache
    (``kv_cache_dtype``) holds ``torch.float8_e4m3fn`` or ``float8_e5m2``.

    ``page_offset`` is the global id of ``key[0]``: a per-rank pool holds only
    its rank's pages, yet metadata always speaks in global page ids.
    ``key``/``value`` may be strided views (engines pass the halves of one
    ``[num_pages, 2, page_size, num_kv_heads, head_dim]`` tensor), so a backend
    writes through the given tensors, never through a reshaped copy.

    An MLA layer (a backend of kind ``mla``) is one latent cache
    ``[num_pages, page_size, kv_lora_rank + rope_dim]`` (``latent``): ``key`` is it as
    ``[num_pages, page_size, 1, kv_lora_rank + rope_dim]`` and ``value`` the view of its
    first ``kv_lora_rank`` entries, the same memory, as SGLang's MLA pool passes it.

    A backend that owns its page format (``Capabilities.page_format``) gets
    caches whose ``layout`` is the format's name, whose ``storage`` is the
    engine's own tensor, and whose ``key``/``value`` are NHD views into it
    (``harness.core.page_formats``).
    """

    key: torch.Tensor
    value: torch.Tensor
    page_offset: int = 0
    total_pages: int | None = None
    layout: str = "NHD"
    storage: torch.Tensor | None = None  # an engine-owned format's own tensor

    @property
    def key_nhd(self) -> torch.Tensor:
        """``key`` as ``[num_pages, page_size, num_kv_heads, head_dim]`` (a view)."""
        return self.key.transpose(1, 2) if self.layout == "HND" else self.key

    @property
    def value_nhd(self) -> torch.Tensor:
        """``value`` as ``[num_pages, page_size, num_kv_heads, head_dim]`` (a view)."""
        return self.value.transpose(1, 2) if self.layout == "HND" else self.value

    @property
    def latent(self) -> torch.Tensor:
        """An MLA layer's latent cache ``[num_pages, page_size, kv_lora_rank + rope_dim]``
        (a view of ``key``, whose one head it is)."""
        if self.num_kv_heads != 1:
            raise ValueError(
                f"a latent cache has one head per token; this cache has {self.num_kv_heads}"
            )
        return self.key_nhd[:, :, 0]

    @property
    def value_dim(self) -> int:
        """Entries per value row: ``head_dim``, or an MLA layer's ``kv_lora_rank``."""
        return int(self.value.shape[3])

    @property
    def num_pages(self) -> int:
        return int(self.key.shape[0])

    @property
    def page_size(self) -> int:
        return int(self.key_nhd.shape[1])

    @property
    def num_kv_heads(self) -> int:
        return int(self.key_nhd.shape[2])

    @property
    def head_dim(self) -> int:
        return int(self.key.shape[3])

    @property
    def global_total_pages(self) -> int:
        """Pages in the whole pool across every rank."""
        if self.total_pages is None:
            return self.page_offset + self.num_pages
        return self.total_pages

    @property
    def held_pages(self) -> range:
        """Global ids of the pages these tensors hold."""
        return range(self.page_offset, self.page_offset + self.num_pages)


@dataclass(frozen=True, eq=False, kw_only=True)
class AttentionMetadata:
    """One step's batch description, shared by all layers.

    The constructor does not validate: :func:`harness.validate_metadata` does.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    max_query_len: int
    max_seq_len: int
    causal: bool = True

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @property
    def query_lens(self) -> torch.Tensor:
        return self.query_start_loc[1:] - self.query_start_loc[:-1]


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """What a backend claims to support; ``None`` means "any".

    The suites draw cases only inside this claim.
    """

    dtypes: tuple[torch.dtype, ...] = DEFAULT_DTYPES
    # The attention served: "mha" (MHA/GQA) or "mla" (latent caches; for "mla", head_dims
    # are latent widths kv_lora_rank + rope_dim and kv_lora_ranks the value widths claimed).
    kind: str = "mha"
    kv_lora_ranks: tuple[int, ...] | None = None
    devices: tuple[str, ...] = ("cpu",)
    page_sizes: tuple[int, ...] | None = None
    head_dims: tuple[int, ...] | None = None
    max_seq_len: int | None = None
    graph_mode: bool = True
    non_causal: bool = True
    max_dp_size: int | None = None
    # Devices where the backend runs in an interpreter or emulator (a Triton kernel on
    # the CPU): conformance draws fewer, smaller examples there, and benchmarks do not
    # time it. Listing a device here does not claim it; ``devices`` does.
    interpreted_devices: tuple[str, ...] = ()
    # Attention variants (all off by default, so a backend that predates them stays valid):
    sliding_window: bool = False  # the ``sliding_window`` constructor keyword
    soft_cap: bool = False  # ``logits_soft_cap``
    sinks: bool = False  # ``sinks``
    alibi: bool = False  # ``alibi_slopes``
    kv_cache_dtypes: tuple[str, ...] = ("auto",)  # ``kv_cache_dtype`` values, with scales
    cache_layouts: tuple[str, ...] = ("NHD",)  # ``LayerCache.layout`` values
    out_buffer: bool = False  # ``forward(..., out=buffer)`` writes into and returns it
    lse: bool = False  # ``forward_with_lse(query, key, value, layer_idx) -> (out, lse)``
    # Rules that narrow the claims above, as kernels state them (defaults: no rule):
    dtypes_by_device: Mapping[str, tuple[torch.dtype, ...]] | None = None  # device -> its dtypes
    page_size_multiple: int = 1  # every page size a multiple of this (16: tensor-core tiles)
    fp8_page_size_multiple: int = 1  # FP8 caches only at page sizes a multiple of this
    head_dim_multiple: int = 1
    min_head_dim: int = 1
    min_sliding_window: int = 1  # the smallest window served (some kernels take 0 as "none")
    incompatible: tuple[str, ...] = ()  # variant pairs never combined: ("alibi+sinks",)
    soft_cap_logit_bound: float | None = None  # the soft-cap only while |logit| <= this x cap
    # What graph-mode padding rows' outputs hold: "unspecified" (the contract's default:
    # never checked), "finite" (an engine may feed them to later layers) or "zero".
    padding_rows: str = "unspecified"
    # How graph-mode padding rows come: "empty" (seq_len 0, the contract's) or "one-token"
    # (seq_len 1 over the rank's zero-filled padding page, as engines' captured graphs pad).
    padding_convention: str = "empty"
    # What unused cache memory holds in the backend's engine: "any" (NaN included: the
    # suites fill it with NaN) or "finite" (zero-filled, finite K/V only: stale finite values).
    unused_cache: str = "any"
    # An engine-owned page format (``harness.core.page_formats.PageFormat``): every cache
    # the harness makes for the backend comes from it; its name is in ``cache_layouts``.
    page_format: PageFormat | None = None
    # The most elements one layer's cache tensor may hold: a kernel that indexes its cache
    # with 32-bit offsets claims 2**31 - 1 (the suite then draws no pool past it).
    max_cache_elements: int | None = None
    # Query tokens one kernel program takes (what an interpreted run's cost is counted in):
    # a decode-only kernel that runs each query token as a decode row takes 1.
    query_tile: int = 16

    def __post_init__(self) -> None:
        for pair in self.incompatible:
            names = pair.split("+")
            unknown = [n for n in names if n not in VARIANT_FEATURES]
            if len(names) != 2 or unknown:
                raise ValueError(
                    f"Capabilities(incompatible=...): {pair!r} is not two of "
                    f"{', '.join(VARIANT_FEATURES)} joined by '+'"
                )
        for name in (
            "query_tile",
            "page_size_multiple",
            "fp8_page_size_multiple",
            "head_dim_multiple",
            "min_head_dim",
            "min_sliding_window",
        ):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"Capabilities({name}=...) must be >= 1, got {getattr(self, name)}"
                )
        if self.soft_cap_logit_bound is not None and not self.soft_cap_logit_bound > 0:
            raise ValueError("Capabilities(soft_cap_logit_bound=...) must be > 0")
        if self.page_format is not None and self.page_format.name not in self.cache_layouts:
            raise ValueError(
                f"Capabilities(page_format=...): its name {self.page_format.name!r} must be "
                f"one of cache_layouts {self.cache_layouts}"
            )
        if self.unused_cache not in UNUSED_CACHE:
            raise ValueError(
                f"Capabilities(unused_cache=...) must be one of {', '.join(UNUSED_CACHE)}, "
                f"got {self.unused_cache!r}"
            )
        if self.padding_convention not in PADDING_CONVENTIONS:
            raise ValueError(
                "Capabilities(padding_convention=...) must be one of "
                f"{', '.join(PADDING_CONVENTIONS)}, got {self.padding_convention!r}"
            )
        if self.kind not in ATTENTION_KINDS:
            raise ValueError(
                f"Capabilities(kind=...) must be one of {', '.join(ATTENTION_KINDS)}, "
                f"got {self.kind!r}"
            )
        if self.kv_lora_ranks is not None and self.kind != "mla":
            raise ValueError("Capabilities(kv_lora_ranks=...) is a claim of kind 'mla' only")
        if self.padding_rows not in PADDING_ROWS:
            raise ValueError(
                f"Capabilities(padding_rows=...) must be one of {', '.join(PADDING_ROWS)}, "
                f"got {self.padding_rows!r}"
            )

    def dtypes_on(self, device: str) -> tuple[torch.dtype, ...]:
        """The dtypes claimed on ``device``: ``dtypes``, narrowed by ``dtypes_by_device``."""
        if self.dtypes_by_device is None or device not in self.dtypes_by_device:
            return self.dtypes
        return tuple(d for d in self.dtypes if d in self.dtypes_by_device[device])

    def allows_page_size(self, page_size: int) -> bool:
        listed = self.page_sizes is None or page_size in self.page_sizes
        return listed and page_size % self.page_size_multiple == 0

    def allows_fp8_at(self, page_size: int) -> bool:
        """Whether an FP8 cache is served at this (claimed) page size."""
        return page_size % self.fp8_page_size_multiple == 0

    def fp8_page_size(self, page_size: int) -> int:
        """The smallest claimed page size from ``page_size`` up that serves an FP8 cache."""
        step = math.lcm(self.page_size_multiple, self.fp8_page_size_multiple)
        if self.page_sizes is not None:
            fitting = [p for p in self.page_sizes if p >= page_size and p % step == 0]
            return min(fitting, default=page_size)
        return -(-page_size // step) * step

    def allows_head_dim(self, head_dim: int) -> bool:
        listed = self.head_dims is None or head_dim in self.head_dims
        return listed and head_dim % self.head_dim_multiple == 0 and head_dim >= self.min_head_dim

    def allows_latent(self, head_dim: int, kv_lora_rank: int) -> bool:
        """Whether an MLA geometry (latent width ``head_dim``, value width ``kv_lora_rank``)
        is claimed: a head dim allowed, and a rank listed (or any), below it."""
        listed = self.kv_lora_ranks is None or kv_lora_rank in self.kv_lora_ranks
        return listed and 0 < kv_lora_rank < head_dim and self.allows_head_dim(head_dim)

    def allows_variants(self, features: Iterable[str]) -> bool:
        """Whether the variant features on together (``VARIANT_FEATURES`` names) may combine."""
        on = set(features)
        return not any(set(pair.split("+")) <= on for pair in self.incompatible)

    def unsupported_reason(
        self,
        *,
        dtype: torch.dtype | None = None,
        device: str | None = None,
        page_size: int | None = None,
        head_dim: int | None = None,
        seq_len: int | None = None,
        graph_mode: bool = False,
        causal: bool = True,
        dp_size: int = 1,
        sliding_window: bool = False,
        soft_cap: bool = False,
        sinks: bool = False,
        alibi: bool = False,
        kv_cache_dtype: str = "auto",
        cache_layout: str | None = None,
        out_buffer: bool = False,
        lse: bool = False,
        window: int | None = None,
        kv_lora_rank: int | None = None,
    ) -> str | None:
        """Why a case lies outside this claim, or ``None`` when it is inside."""
        on_device = self.dtypes if device is None else self.dtypes_on(device)
        features = [
            name
            for name, on in zip(
                VARIANT_FEATURES,
                (sliding_window, soft_cap, sinks, alibi, kv_cache_dtype != "auto"),
                strict=True,
            )
            if on
        ]
        checks = [
            (
                (kv_lora_rank is not None) != (self.kind == "mla"),
                "MLA attention" if kv_lora_rank is not None else "MHA attention (an MLA backend)",
            ),
            (
                kv_lora_rank is not None
                and head_dim is not None
                and not self.allows_latent(head_dim, kv_lora_rank),
                f"latent geometry kv_lora_rank {kv_lora_rank} of {head_dim}",
            ),
            (dtype is not None and dtype not in self.dtypes, f"dtype {dtype}"),
            (device is not None and device not in self.devices, f"device {device!r}"),
            (
                dtype is not None and dtype in self.dtypes and dtype not in on_device,
                f"dtype {dtype} on {device!r}",
            ),
            (
                page_size is not None and not self.allows_page_size(page_size),
                f"page_size {page_size}",
            ),
            (
                head_dim is not None and not self.allows_head_dim(head_dim),
                f"head_dim {head_dim}",
            ),
            (
                seq_len is not None and self.max_seq_len is not None and seq_len > self.max_seq_len,
                f"seq_len {seq_len} > {self.max_seq_len}",
            ),
            (graph_mode and not self.graph_mode, "graph_mode"),
            (not causal and not self.non_causal, "non-causal attention"),
            (
                self.max_dp_size is not None and dp_size > self.max_dp_size,
                f"dp_size {dp_size} > {self.max_dp_size}",
            ),
            (sliding_window and not self.sliding_window, "sliding_window"),
            (soft_cap and not self.soft_cap, "logits_soft_cap"),
            (sinks and not self.sinks, "sinks"),
            (alibi and not self.alibi, "alibi_slopes"),
            (kv_cache_dtype not in self.kv_cache_dtypes, f"kv_cache_dtype {kv_cache_dtype!r}"),
            (
                kv_cache_dtype != "auto"
                and page_size is not None
                and not self.allows_fp8_at(page_size),
                f"kv_cache_dtype {kv_cache_dtype!r} at page_size {page_size} (FP8 needs a "
                f"multiple of {self.fp8_page_size_multiple})",
            ),
            (
                cache_layout is not None and cache_layout not in self.cache_layouts,
                f"cache layout {cache_layout!r}",
            ),
            (out_buffer and not self.out_buffer, "forward(out=...)"),
            (lse and not self.lse, "forward_with_lse"),
            (
                window is not None and window < self.min_sliding_window,
                f"sliding_window {window} < {self.min_sliding_window}",
            ),
            (not self.allows_variants(features), "the combination " + "+".join(features)),
        ]
        for failed, what in checks:
            if failed:
                return f"unsupported {what}"
        return None


DEFAULT_CAPABILITIES = Capabilities()


@runtime_checkable
class AttentionBackend(Protocol):
    """What every attention backend implements.

    The constructor takes ``num_heads, num_kv_heads, head_dim, scale`` and,
    when DP-aware, ``dp_size, dp_rank`` by keyword. ``forward`` writes each
    new key/value row to its slot, then returns attention over the cache.

    Optional, each behind its ``Capabilities`` flag: the variant keywords
    (``sliding_window``, ``logits_soft_cap``, ``sinks``, ``alibi_slopes``,
    ``kv_cache_dtype``/``k_scale``/``v_scale``) in the constructor, a keyword
    ``out=`` on ``forward`` and a method ``forward_with_lse``.
    """

    def bind_kv_caches(self, layer_caches: list[LayerCache]) -> None: ...

    def prepare(self, metadata: AttentionMetadata, graph_mode: bool = False) -> None: ...

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_idx: int
    ) -> torch.Tensor: ...


def capabilities_of(backend_cls: type) -> Capabilities:
    """A backend's declared capabilities, or the documented defaults."""
    declare = getattr(backend_cls, "capabilities", None)
    if declare is None:
        return DEFAULT_CAPABILITIES
    caps = declare()
    if not isinstance(caps, Capabilities):
        raise TypeError(
            f"{backend_cls.__qualname__}.capabilities() returned {type(caps).__name__}, "
            "expected harness.Capabilities"
        )
    return caps
