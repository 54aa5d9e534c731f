"""The paged backend base class: argument checks, binding, DP ownership, KV writes.

Subclasses implement only the attention itself (``attend``, plus an optional
``plan_step`` run in ``prepare``), so the contract's rules live in one place.
Both built-ins are written on it; backend authors import it from
``harness.backend_kit``.

Devices: everything here is plain torch, so the claim is the class
attribute ``devices`` (CPU and CUDA), and a subclass keeps it when it
overrides ``capabilities()`` to narrow something else: an override
returning ``Capabilities``' default devices (``("cpu",)``, whether left
out or written) gets ``cls.devices`` filled in. To claim fewer devices,
set ``devices = ("cpu",)`` on the subclass; any other ``devices`` an
override returns (``("cuda",)``) is kept as it is.
``dataclasses.replace(super().capabilities(), ...)`` keeps the claim too.

Variants: the constructor takes every variant keyword, validates it
(``self.variant``) and raises ``Unsupported`` for one the class's
``capabilities()`` does not claim. ``forward`` stores new K/V quantized
for an FP8 cache, ``sequences`` hands ``attend`` them dequantized, and
``forward(..., out=)`` is handled here for every subclass.
``forward_with_lse`` calls ``attend_with_lse``, which a subclass that
claims ``lse`` implements.

MLA: a subclass whose ``capabilities()`` says ``kind="mla"`` is built with
``kv_lora_rank``; ``forward`` stores each new token's latent row once (the
value is a view of it) and ``attend`` returns ``[T, num_heads, kv_lora_rank]``;
``sequences`` yields the latent rows as the key and their first
``kv_lora_rank`` entries as the value.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from harness.core.contract import AttentionMetadata, Capabilities, LayerCache
from harness.core.errors import CacheBindingError, Unsupported
from harness.core.kv_pages import FP8_DTYPES, put_rows, take_rows, token_slots
from harness.core.validate import (
    CacheGeometry,
    CheckedMetadata,
    check_rank_is_bound,
    check_rank_ownership,
    read_metadata,
    validate_backend_args,
    validate_forward_inputs,
    validate_layer_caches,
    validate_metadata,
)
from harness.core.variants import (
    AttentionVariant,
    check_claimed,
    check_latent_scales,
    dequantize,
    quantize,
)


@dataclass(frozen=True)
class PreparedStep:
    """One step as ``prepare`` left it for ``forward`` and ``attend``.

    ``checked`` is the step's metadata as host lists; ``write_tokens`` and
    ``write_rows`` the tokens whose slot is not -1 and their rows in the
    flattened local cache (``forward`` writes them before ``attend``);
    ``sequence_rows`` each row's cache rows in order, ``None`` for a padding
    row (empty when ``per_sequence_rows`` is off); ``plan`` what the
    subclass's ``plan_step`` returned; ``geometry`` the bound caches' (page
    size, the rank's page offset, device); ``views`` the engine metadata views
    built from it so far (``harness.core.engine_metadata``), one per step.
    """

    checked: CheckedMetadata
    write_tokens: torch.Tensor  # indices of tokens whose slot is not -1
    write_rows: torch.Tensor  # their rows in the flattened (local) cache
    sequence_rows: list[torch.Tensor | None]  # per row: its tokens' cache rows (None: padding)
    plan: Any  # the subclass's own per-step data
    geometry: CacheGeometry | None = None
    views: dict[Any, Any] = dataclasses.field(default_factory=dict)


_DEFAULT_DEVICES = Capabilities().devices


def _takes_new_kv(method: Any) -> bool:
    """Whether ``method`` declares ``key`` and ``value`` parameters (the step's new K/V)."""
    parameters = inspect.signature(method).parameters
    return "key" in parameters and "value" in parameters


def _keeping_devices(declared: Any) -> Any:
    """``declared`` (a class or static method) with the class's ``devices`` for the default."""

    @functools.wraps(declared.__func__)
    def capabilities(cls: type[PagedBackendBase]) -> Any:
        caps = declared.__get__(None, cls)()  # bound to the class asked, as Python would
        if isinstance(caps, Capabilities) and caps.devices == _DEFAULT_DEVICES:
            return dataclasses.replace(caps, devices=cls.devices)
        return caps  # other devices are the override's own; a wrong type is capabilities_of's

    return classmethod(capabilities)


def _check_storage(geometry: CacheGeometry, variant: Any, backend: type[PagedBackendBase]) -> None:
    """The cache's layout is claimed and its dtype is what ``kv_cache_dtype`` says."""
    caps = backend.capabilities()
    if geometry.layout not in caps.cache_layouts:
        raise Unsupported(
            f"{backend.__name__}: cache layout {geometry.layout!r} is not claimed "
            f"(cache_layouts={caps.cache_layouts})"
        )
    wanted = variant.cache_dtype
    if wanted is not None and geometry.dtype != wanted:
        raise CacheBindingError(
            f"kv_cache_dtype={variant.kv_cache_dtype!r} needs a {wanted} cache, "
            f"got {geometry.dtype}"
        )
    if wanted is None and geometry.dtype in FP8_DTYPES:
        raise CacheBindingError(
            f"a {geometry.dtype} cache needs kv_cache_dtype='fp8_e4m3' or 'fp8_e5m2' "
            "and its k_scale/v_scale in the constructor"
        )


class PagedBackendBase:
    """DP-aware paged attention skeleton following the backend contract.

    Set ``per_sequence_rows = False`` in a subclass that does not call
    ``sequences`` to skip building per-sequence indices in ``prepare``.
    ``validate=False`` skips the per-step metadata and ownership checks
    (for timing); constructor and binding checks always run.
    See the module's docstring for devices, variants and MLA.
    """

    per_sequence_rows: bool = True
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    _new_kv_takers: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Wrap an overriding ``capabilities()`` so that it keeps the class's devices, and
        note which of ``attend`` / ``attend_with_lse`` take the step's new K/V."""
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("capabilities")
        if isinstance(declared, classmethod | staticmethod):
            cls.capabilities = _keeping_devices(declared)  # type: ignore[method-assign]
        cls._new_kv_takers = frozenset(
            name for name in ("attend", "attend_with_lse") if _takes_new_kv(getattr(cls, name))
        )

    def __init__(
        self,
        *,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        dp_size: int = 1,
        dp_rank: int = 0,
        validate: bool = True,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
        sinks: torch.Tensor | None = None,
        alibi_slopes: torch.Tensor | None = None,
        kv_cache_dtype: str = "auto",
        k_scale: float = 1.0,
        v_scale: float = 1.0,
        kv_lora_rank: int | None = None,
    ) -> None:
        if type(self).attend is PagedBackendBase.attend:
            raise TypeError(
                f"{type(self).__name__} does not implement attend(query, cache, step): a "
                "PagedBackendBase subclass computes its attention there"
            )
        validate_backend_args(
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            scale=scale,
            dp_size=dp_size,
            dp_rank=dp_rank,
            kv_lora_rank=kv_lora_rank,
        )
        self.variant = AttentionVariant.from_kwargs(
            num_heads=num_heads,
            sliding_window=sliding_window,
            logits_soft_cap=logits_soft_cap,
            sinks=sinks,
            alibi_slopes=alibi_slopes,
            kv_cache_dtype=kv_cache_dtype,
            k_scale=k_scale,
            v_scale=v_scale,
        )
        check_claimed(self.variant, type(self).capabilities(), type(self).__name__, kv_lora_rank)
        check_latent_scales(self.variant, kv_lora_rank)
        self.kv_lora_rank = kv_lora_rank
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = float(scale)
        self.dp_size = dp_size
        self.dp_rank = dp_rank
        self.validate = validate
        self._caches: list[LayerCache] = []
        self._geometry: CacheGeometry | None = None
        self._page_range: range | None = None
        self._step: PreparedStep | None = None

    def bind_kv_caches(self, layer_caches: list[LayerCache]) -> None:
        geometry = validate_layer_caches(
            layer_caches,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            value_dim=self.kv_lora_rank,
        )
        _check_storage(geometry, self.variant, type(self))
        self._page_range = check_rank_is_bound(geometry, self.dp_size, self.dp_rank)
        self._geometry = geometry
        self._caches = list(layer_caches)
        self._step = None

    def prepare(self, metadata: AttentionMetadata, graph_mode: bool = False) -> None:
        geometry = self._require_bound()
        self._step = None  # a rejected step must not leave the previous one runnable
        assert self._page_range is not None
        if self.validate:
            checked = validate_metadata(
                metadata,
                page_size=geometry.page_size,
                total_pages=geometry.total_pages,
                graph_mode=graph_mode,
            )
            check_rank_ownership(checked, page_size=geometry.page_size, page_range=self._page_range)
        else:
            checked = read_metadata(metadata, page_size=geometry.page_size)
        device = geometry.device
        tokens = [i for i, slot in enumerate(checked.slots) if slot != -1]
        base = geometry.page_offset * geometry.page_size
        rows = [checked.slots[i] - base for i in tokens]
        sequence_rows: list[torch.Tensor | None] = []
        if self.per_sequence_rows:
            sequence_rows = [
                torch.tensor(self.cache_rows(pages, length), dtype=torch.long, device=device)
                if length
                else None
                for pages, length in zip(checked.pages, checked.seq_lens, strict=True)
            ]
        self._step = PreparedStep(
            checked=checked,
            write_tokens=torch.tensor(tokens, dtype=torch.long, device=device),
            write_rows=torch.tensor(rows, dtype=torch.long, device=device),
            sequence_rows=sequence_rows,
            plan=self.plan_step(checked, geometry),
            geometry=geometry,
        )

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        layer_idx: int,
        *,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        cache, step = self._write_step(query, key, value, layer_idx, out)
        result = self.attend(query, cache, step, **self._new_kv("attend", key, value))
        if out is None:
            return result
        out.copy_(result)
        return out

    def forward_with_lse(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_idx: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The output and the natural-log sum-exp of each (token, head), ``[T, H]`` float32."""
        cache, step = self._write_step(query, key, value, layer_idx)
        return self.attend_with_lse(
            query, cache, step, **self._new_kv("attend_with_lse", key, value)
        )

    def _new_kv(self, method: str, key: torch.Tensor, value: torch.Tensor) -> dict[str, Any]:
        """``key=``/``value=`` for a subclass method that declares them, else nothing."""
        return {"key": key, "value": value} if method in self._new_kv_takers else {}

    def _write_step(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        layer_idx: int,
        out: torch.Tensor | None = None,
    ) -> tuple[LayerCache, PreparedStep]:
        """Check ``forward``'s inputs (``out`` too), then store the step's new K/V.

        FP8 caches get them quantized. Nothing is written when a check fails.
        """
        geometry = self._require_bound()
        if self._step is None:
            raise RuntimeError("forward called before prepare")
        step = self._step
        validate_forward_inputs(
            query,
            key,
            value,
            layer_idx,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            num_tokens=len(step.checked.slots),
            geometry=geometry,
            value_dim=self.kv_lora_rank,
        )
        if out is not None:
            _check_out_buffer(out, (*query.shape[:2], self.value_dim), query)
        cache = self._caches[layer_idx]
        if step.write_tokens.numel():
            self.store(cache, step, key, value)
        return cache, step

    def store(
        self, cache: LayerCache, step: PreparedStep, key: torch.Tensor, value: torch.Tensor
    ) -> None:
        """Write the step's new K/V (``step.write_tokens`` of ``key``/``value``) to their rows.

        The default goes through the bound views (quantized for an FP8 cache); a
        backend with a write op of its own (an engine's, into its own page
        format) overrides it.
        """
        # through the bound tensors themselves: they may be views of an engine's buffer
        new_k = key.index_select(0, step.write_tokens)
        stored = self.variant.cache_dtype
        if stored is not None:
            new_k = quantize(new_k, self.variant.k_scale, stored)
        put_rows(cache.key_nhd, step.write_rows, new_k)
        if self.kv_lora_rank is not None:
            return  # MLA: one latent row per token; the value is a view of it
        new_v = value.index_select(0, step.write_tokens)
        if stored is not None:
            new_v = quantize(new_v, self.variant.v_scale, stored)
        put_rows(cache.value_nhd, step.write_rows, new_v)

    @classmethod
    def capabilities(cls) -> Capabilities:
        """Every float dtype, any page size and head dim, on ``cls.devices``; ``out=``."""
        return Capabilities(devices=cls.devices, out_buffer=True)

    # -- subclass hooks ---------------------------------------------------

    def plan_step(self, checked: CheckedMetadata, geometry: CacheGeometry) -> Any:
        """Per-step data for ``attend`` (``step.plan``), built in ``prepare``."""
        return None

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        """Attention for every query token over ``cache``, whose new K/V are written.

        A subclass whose ``attend`` (or ``attend_with_lse``) declares keyword
        parameters ``key`` and ``value`` gets the step's new keys and values
        too, ``[T, num_kv_heads, head_dim]`` as ``forward`` received them
        (an extend kernel takes them as arguments beside the cached prefix).
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement attend(query, cache, step), the attention "
            "PagedBackendBase.forward calls after writing the new K/V"
        )

    def attend_with_lse(
        self, query: torch.Tensor, cache: LayerCache, step: PreparedStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``attend`` plus the log-sum-exp ``[T, H]`` in float32 (capability ``lse``)."""
        raise Unsupported(f"{type(self).__name__} does not compute the log-sum-exp")

    # -- helpers ----------------------------------------------------------

    @property
    def value_dim(self) -> int:
        """Width of a value row and of the output: ``head_dim``, or MLA's ``kv_lora_rank``."""
        return self.head_dim if self.kv_lora_rank is None else self.kv_lora_rank

    def _require_bound(self) -> CacheGeometry:
        if self._geometry is None:
            raise RuntimeError("bind_kv_caches must be called before prepare/forward")
        return self._geometry

    def sequences(
        self, cache: LayerCache, step: PreparedStep
    ) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor]]:
        """Each real sequence's query rows and its contiguous K/V, ``[KV, L, D]``.

        From an FP8 cache the K/V come dequantized, in float32.
        """
        starts = step.checked.query_start
        for row, rows in enumerate(step.sequence_rows):
            if rows is None or starts[row + 1] == starts[row]:
                continue  # graph-mode padding: nothing to read, output unspecified
            key = take_rows(cache.key_nhd, rows)
            value = take_rows(cache.value_nhd, rows)
            if self.variant.quantized:
                key = dequantize(key, self.variant.k_scale)
                value = dequantize(value, self.variant.v_scale)
            yield slice(starts[row], starts[row + 1]), key.transpose(0, 1), value.transpose(0, 1)

    def per_head(self, which: str, device: torch.device) -> torch.Tensor | None:
        """The variant's ``sinks`` or ``alibi_slopes`` as float32 on ``device``, made once
        per device (kernels take them as tensors); ``None`` when the variant has none."""
        values = getattr(self.variant, which)
        if values is None:
            return None
        cached: dict[tuple[str, torch.device], torch.Tensor] = self.__dict__.setdefault(
            "_per_head_tensors", {}
        )
        if (which, device) not in cached:
            cached[which, device] = torch.tensor(values, dtype=torch.float32, device=device)
        return cached[which, device]

    def cache_rows(self, pages: list[int], length: int) -> list[int]:
        """Flattened-cache rows of a sequence's first ``length`` tokens.

        A row is ``local_page * page_size + offset``: a number, not a view, as
        the cache may be strided views with no flat form (see ``take_rows``).
        """
        geometry = self._require_bound()
        base = geometry.page_offset * geometry.page_size
        return [slot - base for slot in token_slots(pages, range(length), geometry.page_size)]


def _check_out_buffer(out: object, shape: tuple[int, ...], query: torch.Tensor) -> None:
    """``out=`` must be a tensor of the output's shape, dtype and device (strides are free)."""
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if tuple(out.shape) != shape or out.dtype != query.dtype or out.device != query.device:
        raise ValueError(
            f"out is {tuple(out.shape)} {out.dtype} on {out.device}; the output is "
            f"{shape} {query.dtype} on {query.device}"
        )
