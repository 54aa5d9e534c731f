"""Attention variants: the optional model-level features a backend may claim.

Sliding window, logit soft-cap, attention sinks, ALiBi and an FP8 KV cache
arrive as constructor keywords, one value per backend (a model's layer set)
for its whole life. ``AttentionVariant`` holds them validated and in one
normal form (tuples of floats, so it is hashable and prints in a
reproducer); ``AttentionVariant.from_kwargs`` is the one place their values
are checked, with a ``ValueError`` that names the keyword. The definitions
the oracle computes are in ``docs/contract.md`` ("Attention variants").

A backend that does not claim a variant is never given its keyword by the
suites: ``constructor_kwargs`` lists only the variants that are on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from harness.core.errors import Unsupported

KV_CACHE_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,  # the cache holds the model dtype, as before
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
"""``kv_cache_dtype`` names and the torch dtype of the cache tensors they mean."""

CACHE_LAYOUTS = ("NHD", "HND")
"""``LayerCache.layout``: NHD ``[pages, page_size, kv_heads, dim]`` or HND
``[pages, kv_heads, page_size, dim]``."""


def _finite_positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a finite float > 0, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite float > 0, got {value!r}")
    return float(value)


def _per_head(name: str, value: object, num_heads: int) -> tuple[float, ...] | None:
    """``value`` as one finite float per query head, or ``None``."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.shape[0] != num_heads:
            raise ValueError(
                f"{name} must be a 1-D tensor of num_heads={num_heads} values, "
                f"got shape {tuple(value.shape)}"
            )
        values = value.detach().double().cpu().tolist()
    elif isinstance(value, Sequence) and not isinstance(value, str):
        values = list(value)
        if len(values) != num_heads:
            raise ValueError(f"{name} must hold num_heads={num_heads} values, got {len(values)}")
    else:
        raise ValueError(f"{name} must be a tensor [num_heads] or None, got {value!r}")
    if not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
        raise ValueError(f"{name} must be finite, got {values}")
    return tuple(float(v) for v in values)


@dataclass(frozen=True)
class AttentionVariant:
    """The variant keywords of one backend; the defaults are plain causal attention."""

    sliding_window: int | None = None
    logits_soft_cap: float | None = None
    sinks: tuple[float, ...] | None = None
    alibi_slopes: tuple[float, ...] | None = None
    kv_cache_dtype: str = "auto"
    k_scale: float = 1.0
    v_scale: float = 1.0

    @classmethod
    def from_kwargs(
        cls,
        *,
        num_heads: int,
        sliding_window: object = None,
        logits_soft_cap: object = None,
        sinks: object = None,
        alibi_slopes: object = None,
        kv_cache_dtype: object = "auto",
        k_scale: object = 1.0,
        v_scale: object = 1.0,
    ) -> AttentionVariant:
        """Validated keywords; a bad value is a ``ValueError`` naming its keyword."""
        if sliding_window is not None and (
            isinstance(sliding_window, bool)
            or not isinstance(sliding_window, int)
            or sliding_window < 1
        ):
            raise ValueError(f"sliding_window must be an int >= 1 or None, got {sliding_window!r}")
        cap = None
        if logits_soft_cap is not None:
            cap = _finite_positive("logits_soft_cap", logits_soft_cap)
        if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                f"got {kv_cache_dtype!r}"
            )
        return cls(
            sliding_window=sliding_window,
            logits_soft_cap=cap,
            sinks=_per_head("sinks", sinks, num_heads),
            alibi_slopes=_per_head("alibi_slopes", alibi_slopes, num_heads),
            kv_cache_dtype=kv_cache_dtype,
            k_scale=_finite_positive("k_scale", k_scale),
            v_scale=_finite_positive("v_scale", v_scale),
        )

    @property
    def cache_dtype(self) -> torch.dtype | None:
        """The dtype the cache tensors must have; ``None``: the model's dtype."""
        return KV_CACHE_DTYPES[self.kv_cache_dtype]

    @property
    def quantized(self) -> bool:
        return self.cache_dtype is not None

    @property
    def is_plain(self) -> bool:
        return self == AttentionVariant()

    def constructor_kwargs(self, device: str | torch.device = "cpu") -> dict[str, Any]:
        """The keywords to pass a backend: only the variants that are on."""
        kwargs: dict[str, Any] = {}
        if self.sliding_window is not None:
            kwargs["sliding_window"] = self.sliding_window
        if self.logits_soft_cap is not None:
            kwargs["logits_soft_cap"] = self.logits_soft_cap
        if self.sinks is not None:
            kwargs["sinks"] = torch.tensor(self.sinks, dtype=torch.float32, device=device)
        if self.alibi_slopes is not None:
            kwargs["alibi_slopes"] = torch.tensor(
                self.alibi_slopes, dtype=torch.float32, device=device
            )
        if self.quantized:
            kwargs |= {
                "kv_cache_dtype": self.kv_cache_dtype,
                "k_scale": self.k_scale,
                "v_scale": self.v_scale,
            }
        return kwargs

    def claim(self) -> dict[str, Any]:
        """``Capabilities.unsupported_reason`` keywords for this variant."""
        return {
            "sliding_window": self.sliding_window is not None,
            "soft_cap": self.logits_soft_cap is not None,
            "sinks": self.sinks is not None,
            "alibi": self.alibi_slopes is not None,
            "kv_cache_dtype": self.kv_cache_dtype,
            "window": self.sliding_window,
        }

    def describe(self) -> str:
        """Short words for a reproducer line; empty when plain."""
        words = []
        if self.sliding_window is not None:
            words.append(f"window={self.sliding_window}")
        if self.logits_soft_cap is not None:
            words.append(f"soft_cap={self.logits_soft_cap:g}")
        if self.sinks is not None:
            words.append("sinks=[" + ",".join(f"{s:.3g}" for s in self.sinks[:4]) + "...]")
        if self.alibi_slopes is not None:
            words.append("alibi=[" + ",".join(f"{s:.3g}" for s in self.alibi_slopes[:4]) + "...]")
        if self.quantized:
            words.append(f"{self.kv_cache_dtype} k_scale={self.k_scale:g} v_scale={self.v_scale:g}")
        return " ".join(words)


PLAIN = AttentionVariant()
"""Plain causal attention: no variant on."""


def check_claimed(
    variant: AttentionVariant, caps: Any, backend: str, kv_lora_rank: int | None = None
) -> None:
    """``Unsupported`` when ``variant`` (or the attention kind: MLA when ``kv_lora_rank`` is
    given) asks for something ``caps`` does not claim."""
    reason = caps.unsupported_reason(kv_lora_rank=kv_lora_rank, **variant.claim())
    if reason is not None:
        raise Unsupported(f"{backend}: {reason} (not in its capabilities())")


def check_latent_scales(variant: AttentionVariant, kv_lora_rank: int | None) -> None:
    """An MLA latent row is one FP8 tensor with one scale: ``k_scale`` must equal ``v_scale``."""
    if kv_lora_rank is not None and variant.quantized and variant.k_scale != variant.v_scale:
        raise ValueError(
            f"an MLA latent cache has one scale: k_scale {variant.k_scale} != "
            f"v_scale {variant.v_scale}"
        )


# -- the cache's storage: what a backend writes and what it reads --------------------


def quantize(values: torch.Tensor, scale: float, cache_dtype: torch.dtype) -> torch.Tensor:
    """What an FP8 cache stores for ``values``: ``values / scale`` in fp32, rounded to fp8."""
    return (values.float() / scale).to(cache_dtype)


def dequantize(stored: torch.Tensor, scale: float) -> torch.Tensor:
    """What attention reads from an FP8 cache, in float32: ``stored * scale``."""
    return stored.float() * scale


def fp8_ulp(values: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``cache_dtype`` around ``|values|`` (subnormal spacing near zero)."""
    info = torch.finfo(cache_dtype)
    mantissa_bits = round(-math.log2(info.eps))
    exponent = torch.floor(torch.log2(values.abs().double().clamp_min(info.smallest_normal)))
    return torch.exp2(exponent - mantissa_bits)


def alibi_slopes_for(num_heads: int) -> tuple[float, ...]:
    """The standard ALiBi slopes (Press et al.): ``2^(-8 h / n)`` for the nearest power of two."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = [2.0 ** (-8.0 * (h + 1) / closest) for h in range(closest)]
    extra = [2.0 ** (-4.0 * (2 * h + 1) / closest) for h in range(num_heads - closest)]
    return tuple(base + extra)
