"""The no-paging peer: torch SDPA over a case's tokens held contiguously.

Every benchmark times it in the same run as the backends and reports each
backend as a ratio to it: how much the paged layout costs
against the same attention on ``[B, KV, L, D]`` tensors that need no
gather at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from harness.core.variants import dequantize, quantize
from harness.numerics.oracle import visible_mask
from harness.numerics.scenario import StepInputs

PEER_NAME = "contiguous-sdpa"
PEER_CLASS = "torch.nn.functional.scaled_dot_product_attention (contiguous [B, KV, L, D])"


@dataclass
class _PeerGroup:
    query: torch.Tensor  # [B, H, q, D]
    key: torch.Tensor  # [B, KV, L, D]
    value: torch.Tensor
    mask: torch.Tensor | None  # a CausalBias (bottom-right causal, q < L), or None
    is_causal: bool
    tokens: torch.Tensor  # [B * q] query-token ids, in (b, j) order
    starts: tuple[int, ...]  # each member's first query token


class ContiguousPeer:
    """Torch SDPA over the case's tokens held contiguously: the no-paging reference point.

    Sequences of equal (query, context) length share one SDPA call on
    ``[B, KV, L, D]`` tensors (one call for the uniform sweeps), with
    ``enable_gqa``. Where the query is shorter than the context the mask is
    bottom-right causal (SDPA's ``is_causal`` is top-left aligned, which
    matches only a square block), given as torch's ``causal_lower_right``
    bias rather than a boolean tensor: a boolean mask rules out the flash
    and cuDNN kernels, so the peer would fall to the math kernel on a GPU
    and every ratio would flatter the backends; the bias runs the flash
    kernel (which aligns causal masks bottom-right and takes GQA as is)
    where it applies, and materialises the same boolean mask where it does
    not (the CPU). Square causal blocks use ``is_causal``, decode rows no
    mask. The timed call does the attention only; ``assemble`` lays the
    outputs out as ``[T, H, D]`` for the check.

    A sliding window is a boolean ``[q, L]`` mask. An FP8 case's peer holds
    the K/V dequantized in the model dtype (quantized as a correct backend
    stores them), as an engine without an FP8 kernel would: its ratio shows
    what reading FP8 pages saves, or costs.

    MLA: each latent row is both the key and the value, as an MLA kernel reads it,
    and ``assemble`` keeps each output's first ``kv_lora_rank`` entries (exactly the
    attention over the values). Torch's fused CPU SDPA takes only equal key and value
    widths; a value narrower than its key sends it to the math path, about 100 times
    slower, and a ratio to that would say nothing.
    """

    def __init__(self, inputs: StepInputs) -> None:
        s = inputs.scenario
        self.scale = s.softmax_scale
        self.gqa = s.num_heads != s.num_kv_heads
        self.shape = inputs.output_shape(0)
        query = inputs.queries[0]
        by_shape: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (q, L) -> (row, start)
        start = 0
        for index, row in enumerate(inputs.step.rows):
            if row.seq_id is not None and row.query_len:
                by_shape.setdefault((row.query_len, row.seq_len), []).append((index, start))
            start += row.query_len
        self.groups: list[_PeerGroup] = []
        for (q, length), members in by_shape.items():
            seqs = [inputs.sequences[0][index] for index, _ in members]
            assert all(seq is not None for seq in seqs)
            keys = torch.stack([seq.key for seq in seqs if seq is not None])
            values = torch.stack([seq.value for seq in seqs if seq is not None])
            if s.is_mla:  # the latent rows as values too: one width, SDPA's fused CPU path
                values = keys
            variant = s.variant
            if variant.cache_dtype is not None:
                stored = variant.cache_dtype
                keys = dequantize(quantize(keys, variant.k_scale, stored), variant.k_scale)
                values = dequantize(quantize(values, variant.v_scale, stored), variant.v_scale)
                keys, values = keys.to(query.dtype), values.to(query.dtype)
            queries = torch.stack([query[b : b + q] for _, b in members])
            causal = s.causal and q > 1
            # a tensor subclass that SDPA dispatches on; its own (uninitialised) storage is unused
            mask: torch.Tensor | None = (
                causal_lower_right(q, length) if causal and q < length else None
            )
            if variant.sliding_window is not None:
                window = variant.sliding_window
                mask = visible_mask(q, length, s.causal, window).to(query.device)
                causal = False
            tokens = [b + j for _, b in members for j in range(q)]
            self.groups.append(
                _PeerGroup(
                    query=queries.transpose(1, 2).contiguous(),
                    key=keys.transpose(1, 2).contiguous(),
                    value=values.transpose(1, 2).contiguous(),
                    mask=mask,
                    is_causal=causal and q == length,
                    tokens=torch.tensor(tokens, dtype=torch.long, device=query.device),
                    starts=tuple(b for _, b in members),
                )
            )
        self.variant, self.is_mla = s.variant, s.is_mla

    def __call__(self) -> list[torch.Tensor]:
        return [
            F.scaled_dot_product_attention(
                g.query,
                g.key,
                g.value,
                attn_mask=g.mask,
                is_causal=g.is_causal,
                scale=self.scale,
                enable_gqa=self.gqa,
            )
            for g in self.groups
        ]

    def load(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """Another step's query and new tokens' K/V (``[T, H, D]``, ``[T, KV, D]``) in
        place of this one's, over the same cached prefix: a timed call's fresh inputs."""
        variant = self.variant
        if variant.cache_dtype is not None:  # as a correct backend stores them, dequantized
            stored = variant.cache_dtype
            key = dequantize(quantize(key, variant.k_scale, stored), variant.k_scale)
            value = dequantize(quantize(value, variant.v_scale, stored), variant.v_scale)
        if self.is_mla:
            value = key
        for g in self.groups:
            q, length = g.query.shape[2], g.key.shape[2]
            for member, start in enumerate(g.starts):
                new = slice(start, start + q)
                g.query[member].copy_(query[new].transpose(0, 1))
                g.key[member, :, length - q :].copy_(key[new].transpose(0, 1))
                g.value[member, :, length - q :].copy_(value[new].transpose(0, 1))

    def assemble(self, outputs: list[torch.Tensor]) -> torch.Tensor:
        """The ``[T, H, D]`` output in token order."""
        first = outputs[0]
        out = torch.zeros(self.shape, dtype=first.dtype, device=first.device)
        for group, result in zip(self.groups, outputs, strict=True):
            rows = result.transpose(1, 2)[..., : self.shape[-1]]  # MLA: the value part
            out[group.tokens] = rows.reshape(-1, *self.shape[1:])
        return out
