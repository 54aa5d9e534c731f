"""Value-regime mutants: intermediates kept in the storage dtype, and scales taken as the default.

Each reproduces a reported bug (the thread in its ``Source:`` line) that only
real-model values show: massive activations in q, k or v, or a softmax scale
far from ``1/sqrt(head_dim)`` (``harness.numerics.value_regimes``). On
well-scaled random inputs each is exact to within rounding; in its regime
the output is NaN or far off. Each overrides one small method of
``ReferenceBackend`` and claims what it claims.
"""

from __future__ import annotations

import math

import torch

from harness.core.contract import LayerCache
from harness.core.paged_base import PreparedStep
from reference_backends.reference import ReferenceBackend

SPLIT_KEYS = 256  # keys per split-KV partition


class _RoundsToStorage(ReferenceBackend):
    """Remembers the step's storage dtype (the query's) for the methods that round to it."""

    storage: torch.dtype = torch.float32

    def attend_with_lse(
        self, query: torch.Tensor, cache: LayerCache, step: PreparedStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.storage = query.dtype
        return super().attend_with_lse(query, cache, step)


class RawScoresInStorageDtype(_RoundsToStorage):
    """``q.k`` is formed in the storage dtype and scaled afterwards: float16 overflows to inf.

    Source: pytorch/pytorch#119131 (SDPA's math backend in float16: |q| up to 576 and |k|
    up to 383 give a raw dot product past 65504, NaN out, "float16's max normal value is
    65504"); ggml-org/llama.cpp#4490 (Phi-2: "we need to perform the KQ multiplication
    with F32 precision, otherwise we get NaNs").
    Regime: float16 or bfloat16 with a raw ``|q.k|`` past float16's range or large beside
    the logits' spread (massive activations in q and k, a scale far below the default):
    NaN in float16, the logits' differences lost in bfloat16. Well-scaled inputs are exact.
    """

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        raw = q @ k.transpose(1, 2)
        rounding = raw.to(self.storage).float() - raw  # inf where the dtype overflows
        return super().logits(q, k) + rounding * self.scale


class AccumulatorInStorageDtype(_RoundsToStorage):
    """The unnormalised ``sum_j exp(s_j - m) v_j`` is stored in the storage dtype, then divided.

    Source: ggml-org/llama.cpp#13975 (Metal flash attention kept its output accumulator in
    F16, which overflows past ~32k context: Gemma 3 27B broke); flashinfer-ai/flashinfer#5107
    (split-KV partial outputs cast to bf16/fp16 before the merge).
    Regime: float16 with large values (a massive channel of v) over enough keys that the
    unnormalised sum passes 65504 although the output (a weighted mean) does not: inf,
    then NaN or inf out. bfloat16 and float32 hold the sum.
    """

    def weighted_values(self, probs: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        peak = probs.amax(dim=-1, keepdim=True)  # exp(s_j - m) is probs / peak
        peak = torch.where(peak > 0, peak, 1.0)  # a sink took every weight: nothing to add
        accumulated = (probs / peak) @ v
        return accumulated.to(self.storage).float() * peak


class ScoresInStorageDtype(_RoundsToStorage):
    """The scaled logits are kept in the storage dtype before the softmax.

    Source: flashinfer-ai/flashinfer#4297 and #4298 (the ``FP16_QK_REDUCTION`` path keeps
    ``DTypeQKAccum = __half``; its -5e4 mask sentinel rounds to -49984);
    thu-ml/SageAttention#93 (reduced-precision accumulation in attention gives NaN images).
    Regime: float16 or bfloat16 with logits large beside their spread (massive activations
    shift every logit of a row by thousands): the logits' differences are rounded away.
    """

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return super().logits(q, k).to(self.storage).float()


class DefaultScalePastOneSplit(ReferenceBackend):
    """The split-KV path computes its logits with ``1/sqrt(head_dim)``, not the given scale.

    Source: vllm-project/vllm#36637 (GPTBigCode hard-coded ``1/sqrt(head_dim)`` and ignored
    ``scale_attn_weights``); ggml-org/llama.cpp#14892 (PLaMo2 passed ``kq_scale = 1.0``);
    onnxruntime/mobius#548 (a missing YaRN softmax correction matched at one key and
    diverged past it).
    Regime: a non-default softmax scale on a context past one 256-key split: the keys past
    the first split get the default scale. The default scale, or one split, is exact.
    """

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        logits = super().logits(q, k)
        if k.shape[1] <= SPLIT_KEYS:
            return logits
        given, self.scale = self.scale, 1.0 / math.sqrt(self.head_dim)
        try:
            default = super().logits(q, k)
        finally:
            self.scale = given
        logits[..., SPLIT_KEYS:] = default[..., SPLIT_KEYS:]
        return logits


VALUE_MUTANTS: tuple[type, ...] = (
    RawScoresInStorageDtype,
    AccumulatorInStorageDtype,
    ScoresInStorageDtype,
    DefaultScalePastOneSplit,
)
