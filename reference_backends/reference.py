"""``reference``: the readable baseline, one sequence at a time.

Gathers each sequence's tokens from its pages, computes attention in fp32
with an explicit stable softmax, and casts back. Slow on purpose: every line
maps to the formula in DESIGN.md §2.4.
"""

from __future__ import annotations

import torch

from harness.contract import LayerCache
from harness.kv_pages import flat_tokens
from harness.validate import CacheGeometry, CheckedMetadata
from reference_backends.paged_base import PagedBackendBase, PreparedStep


class ReferenceBackend(PagedBackendBase):
    """Per-sequence paged attention in fp32; DP-aware, any dtype, page size and head dim."""

    def _plan(self, checked: CheckedMetadata, geometry: CacheGeometry) -> list[torch.Tensor]:
        return [
            torch.tensor(self._local_rows(pages, length), dtype=torch.long, device=geometry.device)
            for pages, length in zip(checked.pages, checked.seq_lens, strict=True)
        ]

    def _attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        checked = step.checked
        out = torch.zeros_like(query)
        group = self.num_heads // self.num_kv_heads
        starts = checked.query_start
        for row, (length, rows) in enumerate(zip(checked.seq_lens, step.plan, strict=True)):
            q_len = starts[row + 1] - starts[row]
            if length == 0 or q_len == 0:
                continue  # graph-mode padding: output unspecified, nothing read
            q = query[starts[row] : starts[row + 1]].float().transpose(0, 1)  # [H, q, D]
            k = flat_tokens(cache.key).index_select(0, rows).float()  # [L, KV, D]
            v = flat_tokens(cache.value).index_select(0, rows).float()
            k = k.transpose(0, 1).repeat_interleave(group, dim=0)  # [H, L, D]
            v = v.transpose(0, 1).repeat_interleave(group, dim=0)
            logits = (q @ k.transpose(1, 2)) * self.scale  # [H, q, L]
            if checked.causal:
                positions = torch.arange(length - q_len, length, device=q.device)
                keys = torch.arange(length, device=q.device)
                logits = logits.masked_fill(keys[None, :] > positions[:, None], float("-inf"))
            logits = logits - logits.amax(dim=-1, keepdim=True)
            weights = logits.exp()
            probs = weights / weights.sum(dim=-1, keepdim=True)
            out[starts[row] : starts[row + 1]] = (probs @ v).transpose(0, 1).to(query.dtype)
        return out
