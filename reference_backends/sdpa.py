"""``sdpa``: torch ``scaled_dot_product_attention`` over gathered pages, batched.

``prepare`` builds, once per step, the gather indices that lay every
sequence's tokens out as a padded ``[B, KV, L_max, D]`` batch and, when the
batch is ragged or causal with q > 1, a boolean mask (bottom-right causal and
length). ``forward`` then does one gather, one SDPA call and one scatter,
with no host synchronisation (graph-mode safe).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harness.contract import LayerCache
from harness.kv_pages import flat_tokens
from harness.validate import CacheGeometry, CheckedMetadata
from reference_backends.paged_base import PagedBackendBase, PreparedStep


@dataclass(frozen=True)
class SdpaPlan:
    batch: int
    max_q: int
    max_len: int
    key_rows: torch.Tensor  # [B * L_max] flattened-cache rows (0 where padded)
    key_pad: torch.Tensor | None  # [B, 1, L_max, 1] True where padded, None if none
    query_rows: torch.Tensor  # [B * Q_max] token ids (0 where padded)
    out_src: torch.Tensor  # positions in the flattened [B * Q_max] result of real tokens
    out_dst: torch.Tensor  # their token ids in the output
    mask: torch.Tensor | None  # [B, 1, Q_max, L_max] True = attend; None = attend to all


def _build_plan(
    backend: SdpaBackend, checked: CheckedMetadata, geometry: CacheGeometry
) -> SdpaPlan | None:
    real = [r for r in checked.real_rows if checked.query_lens[r] > 0]
    if not real:
        return None
    starts, query_lens = checked.query_start, checked.query_lens
    lens = [checked.seq_lens[r] for r in real]
    qlens = [query_lens[r] for r in real]
    max_len, max_q = max(lens), max(qlens)
    key_rows: list[int] = []
    query_rows: list[int] = []
    out_src: list[int] = []
    out_dst: list[int] = []
    for b, r in enumerate(real):
        rows = backend._local_rows(checked.pages[r], lens[b])
        key_rows.extend(rows + [0] * (max_len - lens[b]))
        tokens = list(range(starts[r], starts[r] + qlens[b]))
        query_rows.extend(tokens + [0] * (max_q - qlens[b]))
        out_src.extend(b * max_q + j for j in range(qlens[b]))
        out_dst.extend(tokens)
    device = geometry.device
    ragged = any(length != max_len for length in lens)
    lengths = torch.tensor(lens, device=device)
    key_pos = torch.arange(max_len, device=device)
    key_valid = key_pos[None, :] < lengths[:, None]  # [B, L]
    needs_mask = ragged or any(q != max_q for q in qlens) or (checked.causal and max_q > 1)
    mask = None
    if needs_mask:
        mask = key_valid[:, None, :].expand(-1, max_q, -1)
        if checked.causal:
            q_pos = (lengths - torch.tensor(qlens, device=device))[:, None] + torch.arange(
                max_q, device=device
            )[None, :]  # [B, Q]
            mask = mask & (key_pos[None, None, :] <= q_pos[:, :, None])
        mask = mask.unsqueeze(1)

    def as_long(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return SdpaPlan(
        batch=len(real),
        max_q=max_q,
        max_len=max_len,
        key_rows=as_long(key_rows),
        key_pad=(~key_valid)[:, None, :, None] if ragged else None,
        query_rows=as_long(query_rows),
        out_src=as_long(out_src),
        out_dst=as_long(out_dst),
        mask=mask,
    )


class SdpaBackend(PagedBackendBase):
    """Batched paged attention through torch SDPA; DP-aware, the fast CPU path."""

    def _plan(self, checked: CheckedMetadata, geometry: CacheGeometry) -> SdpaPlan | None:
        return _build_plan(self, checked, geometry)

    def _gather(self, tensor: torch.Tensor, plan: SdpaPlan) -> torch.Tensor:
        gathered = flat_tokens(tensor).index_select(0, plan.key_rows)
        gathered = gathered.view(plan.batch, plan.max_len, self.num_kv_heads, self.head_dim)
        gathered = gathered.transpose(1, 2)  # [B, KV, L, D]
        if plan.key_pad is not None:  # padding reads arbitrary (maybe NaN) memory
            gathered = gathered.masked_fill(plan.key_pad, 0)
        return gathered

    def _attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        plan: SdpaPlan | None = step.plan
        out = torch.zeros_like(query)
        if plan is None:
            return out
        q = query.index_select(0, plan.query_rows)
        q = q.view(plan.batch, plan.max_q, self.num_heads, self.head_dim).transpose(1, 2)
        result = F.scaled_dot_product_attention(
            q,
            self._gather(cache.key, plan),
            self._gather(cache.value, plan),
            attn_mask=plan.mask,
            scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        result = result.transpose(1, 2).reshape(-1, self.num_heads, self.head_dim)
        return out.index_copy_(0, plan.out_dst, result.index_select(0, plan.out_src))
