"""``reference``: the readable baseline, one sequence at a time.

Gathers each sequence's tokens from its pages, computes attention in fp32
with an explicit stable softmax, and casts back. Slow on purpose: every line
maps to the formula in DESIGN.md §2.4.
"""

from __future__ import annotations

import torch

from harness.contract import LayerCache
from reference_backends.paged_base import PagedBackendBase, PreparedStep


class ReferenceBackend(PagedBackendBase):
    """Per-sequence paged attention in fp32; DP-aware, any dtype, page size and head dim."""

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        out = torch.zeros_like(query)
        group = self.num_heads // self.num_kv_heads
        for tokens, key, value in self.sequences(cache, step):
            q = query[tokens].float().transpose(0, 1)  # [H, q, D]
            k = key.float().repeat_interleave(group, dim=0)  # [H, L, D]
            v = value.float().repeat_interleave(group, dim=0)
            logits = (q @ k.transpose(1, 2)) * self.scale  # [H, q, L]
            if step.checked.causal:  # query j sits at position L - q + j
                q_len, length = q.shape[1], k.shape[1]
                positions = torch.arange(length - q_len, length, device=q.device)
                keys = torch.arange(length, device=q.device)
                logits = logits.masked_fill(keys[None, :] > positions[:, None], float("-inf"))
            logits = logits - logits.amax(dim=-1, keepdim=True)
            weights = logits.exp()
            probs = weights / weights.sum(dim=-1, keepdim=True)
            out[tokens] = (probs @ v).transpose(0, 1).to(query.dtype)
        return out
