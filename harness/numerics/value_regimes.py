"""Real-model value regimes: the inputs served models hand a kernel, beside well-scaled noise.

Random normal q, k and v keep every intermediate of an attention kernel far
inside float16's range. Served models do not: a few channels carry massive
activations (magnitudes in the hundreds or thousands, the same sign on every
token), and some models scale their logits far from ``1/sqrt(head_dim)``
(query pre-attention scalars, attention multipliers, YaRN factors). A
correct kernel keeps its logits and accumulators in fp32 and never notices;
one that keeps a raw ``q.k`` or an unnormalised ``sum_j exp(s_j - m) v_j`` in
the storage dtype overflows, although the answer itself fits. Each regime
here makes one of those intermediates overflow float16 (and lose most of its
precision in bfloat16) while the output stays an ordinary float16 value:

* ``massive-qk``: two channels of every query and key hold ``QK_OUTLIER``
  with one sign per channel, so the raw ``q.k`` of every pair is past
  float16's largest value, while the logits' differences (all the softmax
  sees) come from the other channels as usual;
* ``massive-v``: one or two channels of every value hold ``V_OUTLIER`` (one
  sign per channel): the output there is about ``V_OUTLIER``, while an
  unnormalised weighted sum whose weights add past ``65504 / V_OUTLIER`` (two
  keys of similar logits) is not a float16 number;
* ``tiny-scale``: q and k of magnitude ``TINY_SCALE_MAGNITUDE`` with a scale
  that brings the logits back to a few units: raw ``q.k`` past float16's range,
  as in models whose scale is far below ``1/sqrt(head_dim)``.

``normal`` leaves the drawn values as they are. The oracle computes every
regime in float64 from the exact inputs; the tolerance's scales (the largest
value norm, the logits' magnitude) come from those inputs, so the bound
follows the regime without a rule of its own.
"""

from __future__ import annotations

import math

import torch

VALUE_REGIMES = ("normal", "massive-qk", "massive-v", "tiny-scale")
QK_OUTLIER = 192.0
"""Two channels of this in q and k: a raw ``q.k`` of at least ``2 * 192^2 = 73728`` (float16
stops at 65504), each factor a float16 number."""
QK_OUTLIER_CHANNELS = 2
V_OUTLIER = 57344.0
"""A value channel of this (exact in float16 and bfloat16, 7/8 of float16's range): the
output there is a weighted mean of it, while an unnormalised sum whose weights add past
``65504 / 57344``, about 1.14, is not a float16 number."""
TINY_SCALE_MAGNITUDE = 128.0
"""q and k drawn at this magnitude: raw ``q.k`` of about ``16384 sqrt(D)``."""
TINY_SCALE_LOGITS = 2.0
"""The typical logit a ``tiny-scale`` step keeps: its scale is this over the raw ``q.k``'s size."""


def regime_scale(regime: str, head_dim: int, scale: float) -> float:
    """The softmax scale a step of ``regime`` runs at (``scale`` unless the regime sets it)."""
    if regime == "tiny-scale":
        return TINY_SCALE_LOGITS / (TINY_SCALE_MAGNITUDE**2 * math.sqrt(head_dim))
    return scale


def regime_magnitude(regime: str, magnitude: float) -> float:
    """The q/k magnitude a step of ``regime`` draws at."""
    return TINY_SCALE_MAGNITUDE if regime == "tiny-scale" else magnitude


def outlier_channels(head_dim: int, count: int, gen: torch.Generator) -> list[int]:
    """``count`` distinct channels, never the last one (row logit offsets use it)."""
    usable = max(1, head_dim - 1)
    return sorted(torch.randperm(usable, generator=gen)[: min(count, usable)].tolist())


def outlier_signs(count: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 2, (count,), generator=gen).float() * 2 - 1


def regime_logit_reach(regime: str, scale: float) -> float:
    """What the regime adds to ``|scale * q.k|``: the massive channels' common product."""
    if regime == "massive-qk":
        return QK_OUTLIER_CHANNELS * QK_OUTLIER**2 * scale
    return 0.0


class RegimeChannels:
    """The channels and signs one step's regime uses, drawn once from the step's seed.

    Every token of every layer shares them, as a model's massive activations
    sit in the same channels throughout.
    """

    def __init__(self, regime: str, head_dim: int, seed: int) -> None:
        if regime not in VALUE_REGIMES:
            raise ValueError(
                f"unknown value regime {regime!r}; choose from {', '.join(VALUE_REGIMES)}"
            )
        self.regime = regime
        gen = torch.Generator().manual_seed(seed + 2)  # apart from the data's own draws
        count = QK_OUTLIER_CHANNELS if regime == "massive-qk" else 1 + seed % 2
        self.channels = outlier_channels(head_dim, count, gen)
        self.signs = outlier_signs(len(self.channels), gen)

    def queries_and_keys(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (float32 q or k, ``[..., D]``) with the massive channels set."""
        if self.regime != "massive-qk":
            return tensor
        out = tensor.clone()
        out[..., self.channels] = self.signs * QK_OUTLIER
        return out

    def values(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (float32 v, ``[..., D]``) with the massive channels set (noise kept)."""
        if self.regime != "massive-v":
            return tensor
        out = tensor.clone()
        out[..., self.channels] += self.signs * V_OUTLIER
        return out
