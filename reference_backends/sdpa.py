"""``sdpa``: torch ``scaled_dot_product_attention`` over gathered pages, batched.

``prepare`` builds, once per step, the indices that lay every sequence's
pages out as a padded ``[B, KV, L_max, D]`` batch and, when the batch is
ragged or causal with q > 1, a boolean mask (bottom-right causal and length).
``forward`` gathers whole pages (block copies, not token rows) into buffers
kept across calls, zeroes only the padded token rows, and makes one SDPA call:
no host synchronisation (graph-mode safe) and no fresh large allocations,
whose page faults cost more than the copy itself on the CPU.

Variants, as far as SDPA can express them: a sliding window is part of the
boolean mask; ALiBi is an additive float mask; a sink is one more key, all
zeros with a zero value, whose mask entry is the sink's logit, so it joins
the softmax's denominator and adds nothing to the output. Those two run
the SDPA call in float32, because SDPA takes a 16-bit mask in a 16-bit call
and a bias of hundreds rounded to bf16 is off by whole units. FP8 caches
are dequantized after the gather; the HND layout is gathered through its
NHD view. A soft-cap acts on the logits inside the softmax, which SDPA
does not expose, and SDPA returns no log-sum-exp: neither is claimed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harness.core.contract import Capabilities, LayerCache
from harness.core.kv_pages import pages_needed
from harness.core.paged_base import PagedBackendBase, PreparedStep
from harness.core.validate import CacheGeometry, CheckedMetadata
from harness.core.variants import CACHE_LAYOUTS, KV_CACHE_DTYPES, PLAIN, AttentionVariant


@dataclass(frozen=True)
class SdpaPlan:
    batch: int
    max_q: int
    max_len: int
    pages_per_seq: int
    pages: torch.Tensor  # [B * pages_per_seq] local page indices (0 where padded)
    pad_rows: torch.Tensor | None  # token rows of the gathered batch past a sequence's end
    query_rows: torch.Tensor | None  # [B * Q_max] token ids; None when the batch is dense
    out_src: torch.Tensor | None  # rows of the flattened result that are real tokens
    out_dst: torch.Tensor | None  # their token ids
    mask: torch.Tensor | None  # [B, 1, Q_max, L_max] True = attend; None = attend to all
    bias: torch.Tensor | None = None  # [B, H, Q_max, L_max (+1 sink)] float32, for ALiBi/sinks


def _row_groups(checked: CheckedMetadata) -> list[list[int]]:
    """Rows batched into one SDPA call each, so padding stays small.

    A batch whose rows share one query length is one group. Otherwise decode
    rows go together and every longer query gets a call of its own: padding a
    2048-token prompt and 64 decode rows to one shape costs far more than the
    extra calls.
    """
    query_lens = checked.query_lens
    real = [r for r in checked.real_rows if query_lens[r] > 0]
    if len({query_lens[r] for r in real}) <= 1:
        return [real] if real else []
    decode = [r for r in real if query_lens[r] == 1]
    return ([decode] if decode else []) + [[r] for r in real if query_lens[r] > 1]


def _build_plan(
    checked: CheckedMetadata,
    geometry: CacheGeometry,
    real: list[int],
    variant: AttentionVariant = PLAIN,
) -> SdpaPlan:
    """The gather indices and mask of one group of rows."""
    query_lens = checked.query_lens
    size, starts = geometry.page_size, checked.query_start
    lens = [checked.seq_lens[r] for r in real]
    qlens = [query_lens[r] for r in real]
    max_len, max_q = max(lens), max(qlens)
    per_seq = pages_needed(max_len, size)
    pages: list[int] = []
    pad_rows: list[int] = []
    for b, r in enumerate(real):
        own = [p - geometry.page_offset for p in checked.pages[r]]
        pages.extend(own + [0] * (per_seq - len(own)))
        pad_rows.extend(range(b * per_seq * size + lens[b], b * per_seq * size + max_len))
    device = geometry.device

    def as_long(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    dense = len(real) == len(query_lens) and all(q == max_q for q in qlens)
    query_rows = out_src = out_dst = None
    if not dense:
        rows: list[int] = []
        src: list[int] = []
        dst: list[int] = []
        for b, r in enumerate(real):
            tokens = list(range(starts[r], starts[r] + qlens[b]))
            rows.extend(tokens + [0] * (max_q - qlens[b]))
            src.extend(b * max_q + j for j in range(qlens[b]))
            dst.extend(tokens)
        query_rows, out_src, out_dst = as_long(rows), as_long(src), as_long(dst)
    mask = None
    ragged = any(length != max_len for length in lens)
    lengths = torch.tensor(lens, device=device)
    key_pos = torch.arange(max_len, device=device)
    first = (lengths - torch.tensor(qlens, device=device))[:, None]
    q_pos = first + torch.arange(max_q, device=device)[None, :]  # [B, Q]
    window = variant.sliding_window
    if ragged or not dense or (checked.causal and max_q > 1) or window is not None:
        mask = (key_pos[None, :] < lengths[:, None])[:, None, :].expand(-1, max_q, -1)
        if checked.causal:
            mask = mask & (key_pos[None, None, :] <= q_pos[:, :, None])
        if window is not None:  # two-sided without causal
            mask = mask & (key_pos[None, None, :] > q_pos[:, :, None] - window)
            if not checked.causal:
                mask = mask & (key_pos[None, None, :] < q_pos[:, :, None] + window)
        mask = mask.unsqueeze(1)
    bias = _additive_mask(variant, mask, key_pos, q_pos, len(real))
    return SdpaPlan(
        batch=len(real),
        max_q=max_q,
        max_len=max_len,
        pages_per_seq=per_seq,
        pages=as_long(pages),
        pad_rows=as_long(pad_rows) if pad_rows else None,
        query_rows=query_rows,
        out_src=out_src,
        out_dst=out_dst,
        mask=None if bias is not None else mask,
        bias=bias,
    )


def _additive_mask(
    variant: AttentionVariant,
    mask: torch.Tensor | None,
    key_pos: torch.Tensor,
    q_pos: torch.Tensor,
    batch: int,
) -> torch.Tensor | None:
    """``[B, H, Q, L (+1)]`` float32: ALiBi bias, -inf where hidden, the sink as a last key."""
    slopes, sinks = variant.alibi_slopes, variant.sinks
    if slopes is None and sinks is None:
        return None
    heads = len(slopes if slopes is not None else sinks or ())
    device = key_pos.device
    shape = (batch, heads, q_pos.shape[1], key_pos.shape[0])
    bias = torch.zeros(shape, dtype=torch.float32, device=device)
    if slopes is not None:
        distance = (key_pos[None, None, :] - q_pos[:, :, None]).float()  # [B, Q, L]
        bias += torch.tensor(slopes, device=device)[None, :, None, None] * distance[:, None]
    if mask is not None:
        bias.masked_fill_(~mask, float("-inf"))
    if sinks is not None:
        sink = torch.tensor(sinks, dtype=torch.float32, device=device)[None, :, None, None]
        bias = torch.cat([bias, sink.expand(batch, -1, shape[2], 1)], dim=-1)
    return bias


class SdpaBackend(PagedBackendBase):
    """Batched paged attention through torch SDPA; DP-aware, the fast CPU path."""

    per_sequence_rows = False

    @classmethod
    def capabilities(cls) -> Capabilities:
        return dataclasses.replace(
            super().capabilities(),
            sliding_window=True,
            sinks=True,
            alibi=True,
            kv_cache_dtypes=tuple(KV_CACHE_DTYPES),
            cache_layouts=CACHE_LAYOUTS,
            padding_rows="zero",  # the output starts zeroed; padding rows join no group
        )

    def plan_step(self, checked: CheckedMetadata, geometry: CacheGeometry) -> list[SdpaPlan]:
        plans = [
            _build_plan(checked, geometry, rows, self.variant) for rows in _row_groups(checked)
        ]
        for plan in plans:  # size the gather buffers here, on the host, not in forward
            self._buffer("key", plan, geometry)
            self._buffer("value", plan, geometry)
        return plans

    def _buffer(self, which: str, plan: SdpaPlan, geometry: CacheGeometry) -> torch.Tensor:
        """A reusable ``[B * pages, page_size, KV, D]`` gather target."""
        shape = (
            plan.batch * plan.pages_per_seq,
            geometry.page_size,
            self.num_kv_heads,
            self.head_dim,
        )
        buffers: dict[str, torch.Tensor] = self.__dict__.setdefault("_gather_buffers", {})
        needed = shape[0] * shape[1] * shape[2] * shape[3]
        current = buffers.get(which)
        if (
            current is None
            or current.numel() < needed
            or current.dtype != geometry.dtype
            or current.device != geometry.device
        ):
            current = torch.empty(needed, dtype=geometry.dtype, device=geometry.device)
            buffers[which] = current
        return current[:needed].view(shape)

    def _gather(
        self,
        tensor: torch.Tensor,
        which: str,
        plan: SdpaPlan,
        geometry: CacheGeometry,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """``[B, KV, L (+1 sink key), D]`` in ``dtype``, FP8 dequantized, padding zeroed."""
        # index_select on dim 0 follows the cache's strides, so a half of an
        # engine's combined [pages, 2, ...] tensor (or an HND cache seen as NHD)
        # is read in place, never copied whole
        gathered = torch.index_select(
            tensor, 0, plan.pages, out=self._buffer(which, plan, geometry)
        )
        tokens = gathered.view(-1, self.num_kv_heads, self.head_dim)
        if self.variant.quantized:
            scale = self.variant.k_scale if which == "key" else self.variant.v_scale
            tokens = tokens.to(dtype) * scale
        elif tokens.dtype != dtype:
            tokens = tokens.to(dtype)
        if plan.pad_rows is not None:  # past a sequence's end: garbage, maybe NaN
            tokens.index_fill_(0, plan.pad_rows, 0)
        batch = tokens.view(plan.batch, -1, self.num_kv_heads, self.head_dim)[:, : plan.max_len]
        if self.variant.sinks is not None:  # the sink's key and value: zeros, logit from the mask
            batch = torch.cat([batch, batch.new_zeros(plan.batch, 1, *batch.shape[2:])], dim=1)
        return batch.transpose(1, 2)

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        plans: list[SdpaPlan] = step.plan
        if len(plans) == 1 and plans[0].out_dst is None:  # dense: the result is the output
            return self._attend_group(query, cache, plans[0]).contiguous()
        out = torch.zeros_like(query)
        for plan in plans:
            result = self._attend_group(query, cache, plan)
            assert plan.out_src is not None
            assert plan.out_dst is not None
            out.index_copy_(0, plan.out_dst, result.index_select(0, plan.out_src))
        return out

    def _attend_group(self, query: torch.Tensor, cache: LayerCache, plan: SdpaPlan) -> torch.Tensor:
        """One SDPA call over a group; rows ``[B * Q_max, H, D]`` of the padded result."""
        geometry = self._require_bound()
        q = query if plan.query_rows is None else query.index_select(0, plan.query_rows)
        q = q.reshape(plan.batch, plan.max_q, self.num_heads, self.head_dim).transpose(1, 2)
        dtype = torch.float32 if plan.bias is not None else query.dtype
        result = F.scaled_dot_product_attention(
            q.to(dtype),
            self._gather(cache.key_nhd, "key", plan, geometry, dtype),
            self._gather(cache.value_nhd, "value", plan, geometry, dtype),
            attn_mask=plan.bias if plan.bias is not None else plan.mask,
            scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        return result.to(query.dtype).transpose(1, 2).reshape(-1, self.num_heads, self.head_dim)
