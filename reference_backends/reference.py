"""``reference``: the readable baseline, one sequence at a time.

Gathers each sequence's tokens from its pages, computes attention in fp32
with an explicit stable softmax, and casts back. Slow on purpose: every step
of the contract's formula is its own small method.
"""

from __future__ import annotations

import torch

from harness.contract import LayerCache
from harness.paged_base import PagedBackendBase, PreparedStep


class ReferenceBackend(PagedBackendBase):
    """Per-sequence paged attention in fp32; DP-aware, any dtype, page size and head dim."""

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        out = torch.zeros_like(query)
        for tokens, key, value in self.sequences(cache, step):
            q = query[tokens].float().transpose(0, 1)  # [H, q, D]
            k = self.expand_kv_heads(key.float())  # [H, L, D]
            v = self.expand_kv_heads(value.float())
            logits = (q @ k.transpose(1, 2)) * self.scale  # [H, q, L]
            if step.checked.causal:
                visible = self.causal_mask(q.shape[1], k.shape[1], q.device)
                logits = logits.masked_fill(~visible, float("-inf"))
            out[tokens] = (self.softmax(logits) @ v).transpose(0, 1).to(query.dtype)
        return out

    def expand_kv_heads(self, kv: torch.Tensor) -> torch.Tensor:
        """``[KV, L, D]`` -> ``[H, L, D]``: query head h reads KV head ``h // group``."""
        return kv.repeat_interleave(self.num_heads // self.num_kv_heads, dim=0)

    @staticmethod
    def causal_mask(query_len: int, length: int, device: torch.device) -> torch.Tensor:
        """``[q, L]``, True where visible: query j sits at position ``L - q + j``."""
        positions = torch.arange(length - query_len, length, device=device)
        return torch.arange(length, device=device)[None, :] <= positions[:, None]

    @staticmethod
    def softmax(logits: torch.Tensor) -> torch.Tensor:
        """Stable softmax: subtract the row maximum before exponentiating."""
        weights = (logits - logits.amax(dim=-1, keepdim=True)).exp()
        return weights / weights.sum(dim=-1, keepdim=True)
