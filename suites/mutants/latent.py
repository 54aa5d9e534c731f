"""Planted MLA bugs: mistakes MLA kernels shipped, each on the ``reference-mla`` backend.

Each is right where its mistake has no effect (a DeepSeek geometry, a short
context, the default scale) and wrong elsewhere, as the engines' were:

* ``LatentScaleOfWidth``: the softmax scale taken as ``1/sqrt(head_dim)`` of the
  latent row (576) instead of the model's (DeepSeek: ``1/sqrt(192)`` times the
  YaRN factor), the error of Megatron-LM #1501 (``kv_channels`` from the wrong
  width) and maxtext #1370 (a reversed MLA scale).
* ``LatentDimsHardcoded``: the latent row split as DeepSeek's 512 + 64 whatever the
  model's, as kernels with 512 and 576 written in did for ``kv_lora_rank`` 256
  (FlashMLA-ETAP #1; SGLang #27369 and vLLM #40705: Mistral-Small-4's 256 + 64).
* ``LatentValuesWholeRow``: values read as the whole latent row (``v = k``), the fast
  path SGLang #27369 and vLLM #40705 fixed for rows wider than their values.
* ``LatentRopeWrittenPastRow``: the new row's rope part stored one row on, past its own
  slot, as SGLang #38666's MLA decode write was (a nope width of the whole row).
* ``LatentSplitMergeValueStride``: split-KV partial outputs stored a latent row apart
  and merged as if a value row apart, the family of split-merge bugs behind vLLM
  #47188 and SGLang #2465 (Triton MLA's stage 2 reads what stage 1 wrote elsewhere).
"""

from __future__ import annotations

import torch

from harness.core.contract import LayerCache
from harness.core.kv_pages import put_rows
from harness.core.paged_base import PreparedStep
from reference_backends.reference import ReferenceMlaBackend

DEEPSEEK_RANK, DEEPSEEK_ROPE = 512, 64
SPLIT_KEYS = 64  # keys per split of the split-merge mutant


class LatentScaleOfWidth(ReferenceMlaBackend):
    """Scales the logits by ``1/sqrt(head_dim)`` of the latent row, not the given scale."""

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return (q @ k.transpose(1, 2)) * self.head_dim**-0.5


class LatentDimsHardcoded(ReferenceMlaBackend):
    """Logits as the nope part (the first 512 entries) plus the rope part (the last 64),
    DeepSeek's split, whatever ``kv_lora_rank`` and the rope width are."""

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        nope = q[..., :DEEPSEEK_RANK] @ k[..., :DEEPSEEK_RANK].transpose(1, 2)
        rope = q[..., -DEEPSEEK_ROPE:] @ k[..., -DEEPSEEK_ROPE:].transpose(1, 2)
        return (nope + rope) * self.scale


class LatentValuesWholeRow(ReferenceMlaBackend):
    """Takes each value as its whole latent row: outputs ``[T, H, head_dim]``."""

    @property
    def value_dim(self) -> int:
        return self.head_dim

    def sequences(self, cache: LayerCache, step: PreparedStep):  # type: ignore[no-untyped-def]
        for tokens, key, _ in super().sequences(cache, step):
            yield tokens, key, key


class LatentRopeWrittenPastRow(ReferenceMlaBackend):
    """Stores a new row's first ``kv_lora_rank`` entries in its slot and its rope part at
    the start of the next slot's row: its own rope entries keep what was there."""

    def store(
        self, cache: LayerCache, step: PreparedStep, key: torch.Tensor, value: torch.Tensor
    ) -> None:
        assert self.kv_lora_rank is not None
        new = key.index_select(0, step.write_tokens)
        rank, rope = self.kv_lora_rank, self.head_dim - self.kv_lora_rank
        latent = cache.key_nhd
        put_rows(latent[..., :rank], step.write_rows, new[..., :rank])
        slots = latent.shape[0] * latent.shape[1]
        past = (step.write_rows + 1).clamp(max=slots - 1)
        put_rows(latent[..., :rope], past, new[..., rank:])


class LatentSplitMergeValueStride(ReferenceMlaBackend):
    """Attention in splits of 64 keys merged by log-sum-exp, where the merge reads the
    partial outputs a value row apart though they were stored a latent row apart."""

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        out = query.new_zeros(*query.shape[:2], self.value_dim)
        for tokens, key, value in self.sequences(cache, step):
            q = query[tokens].float().transpose(0, 1)  # [H, q, D]
            k, v = key.float().expand(q.shape[0], -1, -1), value.float().expand(q.shape[0], -1, -1)
            visible = self.visible(q.shape[1], k.shape[1], step.checked.causal, q.device)
            logits = self.logits(q, k).masked_fill(~visible, float("-inf"))
            parts, lses = [], []
            for start in range(0, k.shape[1], SPLIT_KEYS):
                chunk = logits[..., start : start + SPLIT_KEYS]
                lse = torch.logsumexp(chunk, -1, keepdim=True)  # [H, q, 1]
                probs = (chunk - lse).exp().nan_to_num()
                parts.append(probs @ v[:, start : start + SPLIT_KEYS])
                lses.append(lse)
            merged = _merge(parts, lses, self.head_dim)
            out[tokens] = merged.transpose(0, 1).to(query.dtype)
        return out


def _merge(parts: list[torch.Tensor], lses: list[torch.Tensor], stored_width: int) -> torch.Tensor:
    """The split merge with the stride bug: partials written ``stored_width`` apart per
    (head, token) row, read back a value row apart (right only with a single split)."""
    if len(parts) == 1:
        return parts[0]
    heads, q_len, width = parts[0].shape
    buffer = torch.zeros(len(parts), heads * q_len, stored_width)
    for index, part in enumerate(parts):
        buffer[index, :, :width] = part.reshape(heads * q_len, width)
    flat = buffer.flatten()[: len(parts) * heads * q_len * width]
    read = flat.view(len(parts), heads, q_len, width)
    stacked = torch.stack(lses)  # [S, H, q, 1]
    weights = (stacked - torch.logsumexp(stacked, 0)).exp().nan_to_num()
    return (weights * read).sum(0)


LATENT_MUTANTS: tuple[type, ...] = (
    LatentScaleOfWidth,
    LatentDimsHardcoded,
    LatentValuesWholeRow,
    LatentRopeWrittenPastRow,
    LatentSplitMergeValueStride,
)
