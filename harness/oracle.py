"""The float64 oracle: ground truth for every numeric check (DESIGN.md §3).

It computes attention from contiguous per-sequence K/V, on the CPU, in
float64, from the exact tensors (in their dtype) the backend received. It
also returns the magnitudes the tolerance needs (see ``harness.tolerance``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SequenceKV:
    """All ``L`` cached tokens of one sequence, contiguous ``[L, num_kv_heads, head_dim]``."""

    key: torch.Tensor
    value: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.key.shape[0])


@dataclass(frozen=True)
class OracleOutput:
    """Exact outputs ``[T, H, D]`` and, per (token, head), the error scales.

    ``value_scale`` is the largest ``||v_j||`` the token attends to (its
    output lies in their convex hull); ``logit_scale`` is the largest
    ``scale * sum_i |q_i k_ji|``, the condition number of its logits.
    ``checked`` marks tokens of real (non-padding) rows.
    """

    output: torch.Tensor
    value_scale: torch.Tensor
    logit_scale: torch.Tensor
    checked: torch.Tensor


def _visible_mask(query_len: int, seq_len: int, causal: bool) -> torch.Tensor:
    """``[q, L]`` mask: query j sits at position ``L - q + j`` (bottom-right causal)."""
    if not causal:
        return torch.ones(query_len, seq_len, dtype=torch.bool)
    positions = torch.arange(seq_len - query_len, seq_len).unsqueeze(1)
    return torch.arange(seq_len).unsqueeze(0) <= positions


def _expand_heads(tensor: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``[L, KV, D]`` -> ``[H, L, D]``: query head h reads KV head ``h // group``."""
    group = num_heads // tensor.shape[1]
    return tensor.transpose(0, 1).repeat_interleave(group, dim=0)


def oracle_attention(
    query: torch.Tensor,
    sequences: Sequence[SequenceKV | None],
    query_lens: Sequence[int],
    *,
    scale: float,
    causal: bool = True,
) -> OracleOutput:
    """Exact attention for a ragged batch; ``None`` marks a padding row (not checked)."""
    num_tokens, num_heads, head_dim = query.shape
    out = torch.zeros(num_tokens, num_heads, head_dim, dtype=torch.float64)
    value_scale = torch.zeros(num_tokens, num_heads, dtype=torch.float64)
    logit_scale = torch.zeros(num_tokens, num_heads, dtype=torch.float64)
    checked = torch.zeros(num_tokens, dtype=torch.bool)
    start = 0
    for seq, q_len in zip(sequences, query_lens, strict=True):
        rows = slice(start, start + q_len)
        start += q_len
        if seq is None or q_len == 0:
            continue
        q = query[rows].detach().to("cpu", torch.float64).transpose(0, 1)  # [H, q, D]
        k = _expand_heads(seq.key.detach().to("cpu", torch.float64), num_heads)
        v = _expand_heads(seq.value.detach().to("cpu", torch.float64), num_heads)
        visible = _visible_mask(q_len, seq.length, causal)
        logits = (q @ k.transpose(1, 2)) * scale
        probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
        out[rows] = (probs @ v).transpose(0, 1)
        magnitude = (q.abs() @ k.abs().transpose(1, 2)) * abs(scale)
        logit_scale[rows] = magnitude.masked_fill(~visible, 0).amax(-1).T
        norms = v.norm(dim=-1).unsqueeze(1).expand(-1, q_len, -1)  # [H, q, L]
        value_scale[rows] = norms.masked_fill(~visible, 0).amax(-1).T
        checked[rows] = True
    if start != num_tokens:
        raise ValueError(f"query_lens sum to {start} but query has {num_tokens} tokens")
    return OracleOutput(out, value_scale, logit_scale, checked)


def naive_attention(
    query: torch.Tensor,
    sequences: Sequence[SequenceKV | None],
    query_lens: Sequence[int],
    *,
    scale: float,
    causal: bool = True,
) -> torch.Tensor:
    """Attention as a straightforward same-dtype implementation computes it.

    Matmuls in the input dtype (fp32 accumulation, rounded to the dtype),
    a stable fp32 softmax rounded to the dtype. Its error against the oracle
    is the yardstick of what the dtype's precision allows.
    """
    dtype = query.dtype
    num_tokens, num_heads, head_dim = query.shape
    out = torch.zeros(num_tokens, num_heads, head_dim, dtype=dtype)
    start = 0
    for seq, q_len in zip(sequences, query_lens, strict=True):
        rows = slice(start, start + q_len)
        start += q_len
        if seq is None or q_len == 0:
            continue
        q = query[rows].detach().cpu().transpose(0, 1)
        k = _expand_heads(seq.key.detach().cpu(), num_heads)
        v = _expand_heads(seq.value.detach().cpu(), num_heads)
        visible = _visible_mask(q_len, seq.length, causal)
        logits = (q @ k.transpose(1, 2)).float() * scale
        probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
        out[rows] = (probs.to(dtype) @ v).transpose(0, 1)
    return out
