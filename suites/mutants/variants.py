"""Planted bugs in attention variants: one realistic mistake each, on the ``reference`` backend.

Each claims what ``reference`` claims (every variant), so the suite draws
the variant it breaks; each is right on plain attention and wrong only
where its variant is on.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from harness.core.contract import LayerCache
from harness.core.paged_base import PagedBackendBase, PreparedStep
from reference_backends.reference import ReferenceBackend


class WindowOffByOne(ReferenceBackend):
    """Sliding window with ``>=`` for ``>``: each query sees ``W + 1`` keys."""

    def visible(
        self, query_len: int, length: int, causal: bool, device: torch.device
    ) -> torch.Tensor:
        window = self.variant.sliding_window
        visible = super().visible(query_len, length, causal, device)
        if window is None:
            return visible
        query_pos = torch.arange(length - query_len, length, device=device)[:, None]
        key_pos = torch.arange(length, device=device)[None, :]
        return visible | ((key_pos == query_pos - window) & (key_pos >= 0))


class NonPositiveWindowMeansNone(ReferenceBackend):
    """Takes a window below 1 as "no window" (as -1 is in some engines) instead of refusing it."""

    def __init__(self, *, sliding_window: int | None = None, **kwargs: Any) -> None:
        if sliding_window is not None and sliding_window < 1:
            sliding_window = None
        super().__init__(sliding_window=sliding_window, **kwargs)


class WindowOnlyInPrefill(ReferenceBackend):
    """Applies the sliding window to prefill and extend rows, not to decode (q = 1)."""

    def visible(
        self, query_len: int, length: int, causal: bool, device: torch.device
    ) -> torch.Tensor:
        if query_len == 1 and causal:
            return self.causal_mask(query_len, length, device)
        return super().visible(query_len, length, causal, device)


class SoftCapBeforeScale(ReferenceBackend):
    """Caps the raw ``q.k`` and scales afterwards: ``scale * cap * tanh(q.k / cap)``."""

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        cap = self.variant.logits_soft_cap
        if cap is None:
            return super().logits(q, k)
        raw = q @ k.transpose(1, 2)
        logits = cap * torch.tanh(raw / cap) * self.scale
        if self.variant.alibi_slopes is not None:
            logits = logits + self.alibi_bias(q.shape[1], k.shape[1], q.device)
        return logits


class IgnoresSinks(ReferenceBackend):
    """Takes the ``sinks`` keyword and leaves them out of the softmax."""

    def attend_with_lse(
        self, query: torch.Tensor, cache: LayerCache, step: PreparedStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        given, self.variant = self.variant, replace(self.variant, sinks=None)
        try:
            return super().attend_with_lse(query, cache, step)
        finally:
            self.variant = given


class AlibiSignFlipped(ReferenceBackend):
    """ALiBi bias ``slope * (query_pos - key_pos)``: far keys favoured instead of penalised."""

    def alibi_bias(self, query_len: int, length: int, device: torch.device) -> torch.Tensor:
        return -super().alibi_bias(query_len, length, device)


class Fp8ScaleInvertedOnRead(ReferenceBackend):
    """Dequantizes an FP8 cache as ``stored / scale`` instead of ``stored * scale``."""

    def sequences(self, cache, step):  # type: ignore[no-untyped-def]
        for tokens, key, value in super().sequences(cache, step):
            if self.variant.quantized:
                key = key / self.variant.k_scale**2
                value = value / self.variant.v_scale**2
            yield tokens, key, value


class Fp8ScaleInvertedOnWrite(ReferenceBackend):
    """Stores ``k * k_scale`` in an FP8 cache instead of ``k / k_scale`` (reads correctly)."""

    def _write_step(self, query, key, value, layer_idx, out=None):  # type: ignore[no-untyped-def]
        v = self.variant
        if not v.quantized:
            return super()._write_step(query, key, value, layer_idx, out)
        squared_k = (key.float() * v.k_scale**2).to(key.dtype)
        squared_v = (value.float() * v.v_scale**2).to(value.dtype)
        return super()._write_step(query, squared_k, squared_v, layer_idx, out)


class HndReadAsNhd(ReferenceBackend):
    """Writes an HND cache correctly, then reads it by reshaping the raw tensor to NHD."""

    def sequences(self, cache, step):  # type: ignore[no-untyped-def]
        if cache.layout == "HND":
            pages, heads, size, dim = cache.key.shape
            cache = LayerCache(
                key=cache.key.reshape(pages, size, heads, dim),
                value=cache.value.reshape(pages, size, heads, dim),
                page_offset=cache.page_offset,
                total_pages=cache.total_pages,
            )
        yield from super().sequences(cache, step)


class LseInLog2(ReferenceBackend):
    """Returns the log-sum-exp in base 2, as a kernel working with ``exp2`` keeps it."""

    def attend_with_lse(
        self, query: torch.Tensor, cache: LayerCache, step: PreparedStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = super().attend_with_lse(query, cache, step)
        return out, lse / torch.log(torch.tensor(2.0))


class OutBufferIgnored(ReferenceBackend):
    """Accepts ``out=`` but returns a new tensor and leaves the buffer untouched."""

    def forward(self, query, key, value, layer_idx, *, out=None):  # type: ignore[no-untyped-def]
        return PagedBackendBase.forward(self, query, key, value, layer_idx)


VARIANT_MUTANTS: tuple[type, ...] = (
    WindowOffByOne,
    NonPositiveWindowMeansNone,
    WindowOnlyInPrefill,
    SoftCapBeforeScale,
    IgnoresSinks,
    AlibiSignFlipped,
    Fp8ScaleInvertedOnRead,
    Fp8ScaleInvertedOnWrite,
    HndReadAsNhd,
    LseInLog2,
    OutBufferIgnored,
)
