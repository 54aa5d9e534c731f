"""The float64 oracle: ground truth for every numeric check.

It computes attention from contiguous per-sequence K/V, on the CPU, in
float64, from the exact tensors (in their dtype) the backend received, for
the new query rows only (a decode step over 32k keys costs one row). It also
returns the magnitudes the tolerance needs (see ``harness.numerics.tolerance``).

GQA is computed by folding each KV head's query heads into one matrix
(``[KV, group * q, D]``) instead of copying K and V out to every query head,
so memory stays at the size of the sequence's own K/V.

Variants (``harness.core.variants.AttentionVariant``) follow the contract's
definitions, in this order: logits ``scale * q.k``; soft-cap
``cap * tanh(logits / cap)``; ALiBi bias ``slope_h * (key_pos - query_pos)``;
the mask (causal, and a sliding window: key positions ``> query_pos - W``, and
``< query_pos + W`` without causal);
a sink's logit joins the softmax's denominator with no value. For an FP8
cache the ``SequenceKV`` hold the dequantized values the backend reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from harness.core.variants import PLAIN, AttentionVariant


@dataclass(frozen=True)
class SequenceKV:
    """All ``L`` cached tokens of one sequence, contiguous ``[L, num_kv_heads, head_dim]``.

    For MLA the key is the latent rows ``[L, 1, kv_lora_rank + rope_dim]`` and the
    value their first ``kv_lora_rank`` entries: the same formula, values narrower.
    """

    key: torch.Tensor
    value: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.key.shape[0])


@dataclass(frozen=True)
class OracleOutput:
    """Exact outputs ``[T, H, D]`` and, per (token, head), the error scales.

    * ``value_scale``: the largest ``||v_j||`` the token attends to (its
      output lies in their convex hull);
    * ``logit_scale``: the largest ``scale * sum_i |q_i k_ji|``, the
      condition number of its logits;
    * ``rounding_scale``: ``sqrt(sum_j p_j^2 ||v_j||^2)``, the typical size
      of the output error when every probability ``p_j`` is rounded on its
      own (small when attention is spread over many keys, ``~||v||`` when it
      falls on one);
    * ``visible_keys``: how many keys the token attends to, the length of
      the sums (P.V and the softmax's denominator) a kernel accumulates;
    * ``checked`` marks tokens of real (non-padding) rows.
    """

    output: torch.Tensor
    value_scale: torch.Tensor
    logit_scale: torch.Tensor
    rounding_scale: torch.Tensor
    checked: torch.Tensor
    lse: torch.Tensor | None = None  # [T, H]: ln of the softmax's denominator (sink included)
    visible_keys: torch.Tensor | None = None  # [T, H] float64; None: counted as one key
    logit_terms: int | None = None  # products in one logit (the key's width); None: output's

    @property
    def dot_length(self) -> int:
        """How many products a logit sums: the key's width (MLA: wider than the output)."""
        return self.logit_terms if self.logit_terms is not None else int(self.output.shape[-1])

    @property
    def output_norm(self) -> torch.Tensor:
        """``||o_exact||`` per (token, head)."""
        return self.output.norm(dim=-1)


def visible_mask(
    query_len: int, seq_len: int, causal: bool, window: int | None = None
) -> torch.Tensor:
    """``[q, L]`` mask: query j sits at position ``L - q + j`` (bottom-right causal).

    A sliding window ``W`` hides keys at positions ``<= query_pos - W``; without
    causal it is two-sided and also hides keys ``>= query_pos + W`` (vLLM's
    FlashAttention, Triton and CPU kernels all make a non-causal window symmetric).
    """
    positions = torch.arange(seq_len - query_len, seq_len).unsqueeze(1)
    keys = torch.arange(seq_len).unsqueeze(0)
    visible = keys <= positions if causal else torch.ones(query_len, seq_len, dtype=torch.bool)
    if window is not None:
        visible = visible & (keys > positions - window)
        if not causal:
            visible = visible & (keys < positions + window)
    return visible


def output_dim(
    query: torch.Tensor, sequences: Sequence[SequenceKV | None], value_dim: int | None = None
) -> int:
    """The width of an output row: ``value_dim`` where given (MLA: ``kv_lora_rank``; a step
    of padding rows only has no values to read it from), else the values', else the query's."""
    if value_dim is not None:
        return value_dim
    first = next((seq for seq in sequences if seq is not None), None)
    return int(first.value.shape[-1]) if first is not None else int(query.shape[-1])


def _per_row(values: tuple[float, ...], row: _GroupedRow) -> torch.Tensor:
    """Per-query-head ``values`` laid out as the grouped rows: ``[R*KV, G * q, 1]`` float64."""
    per_head = torch.tensor(values, dtype=torch.float64).reshape(row.kv_heads, -1, 1)
    grouped = per_head.expand(-1, -1, row.q_len).reshape(row.kv_heads, -1, 1)
    return grouped.repeat(row.sequences, 1, 1)


def _alibi_bias(row: _GroupedRow, slopes: tuple[float, ...]) -> torch.Tensor:
    """``[R*KV, G*q, L]``: ``slope_h * (key_pos - query_pos)``."""
    length = row.k.shape[1]
    query_pos = torch.arange(length - row.q_len, length, dtype=torch.float64)
    query_pos = query_pos.repeat(row.q.shape[1] // row.q_len)  # [G*q]
    distance = torch.arange(length, dtype=torch.float64)[None, :] - query_pos[:, None]
    return _per_row(slopes, row) * distance


def variant_logits(
    row: _GroupedRow, scale: float, variant: AttentionVariant, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The masked logits ``[R*KV, G*q, L]`` in ``dtype`` and the sink column ``[R*KV, G*q, 1]``."""
    logits = (row.q.to(dtype) @ row.k.to(dtype).transpose(1, 2)) * scale
    cap = variant.logits_soft_cap
    if cap is not None:
        logits = cap * torch.tanh(logits / cap)
    if variant.alibi_slopes is not None:
        logits = logits + _alibi_bias(row, variant.alibi_slopes).to(dtype)
    logits = logits.masked_fill(row.hidden, float("-inf"))
    sinks = None
    if variant.sinks is not None:
        sinks = _per_row(variant.sinks, row).to(dtype)
    return logits, sinks


def softmax_with_sink(
    logits: torch.Tensor, sinks: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities over the keys and the log-sum-exp; a sink adds to the denominator only."""
    if sinks is None:
        return torch.softmax(logits, dim=-1), torch.logsumexp(logits, dim=-1)
    extended = torch.cat([logits, sinks.expand(*logits.shape[:-1], 1)], dim=-1)
    return torch.softmax(extended, dim=-1)[..., :-1], torch.logsumexp(extended, dim=-1)


def _grouped_queries(query: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """``[q, H, D]`` -> ``[KV, group * q, D]``: query head h reads KV head ``h // group``."""
    q_len, num_heads, head_dim = query.shape
    group = num_heads // num_kv_heads
    return query.reshape(q_len, num_kv_heads, group, head_dim).permute(1, 2, 0, 3).flatten(1, 2)


def _ungrouped(result: torch.Tensor, row: _GroupedRow) -> torch.Tensor:
    """``[R*KV, group * q, ...]`` -> ``[R*q, H, ...]``, the inverse of stacking ``R``
    sequences' ``_grouped_queries``: their tokens in order (``row.tokens``)."""
    width = result.shape[1]
    q_len, kv_heads = row.q_len, row.kv_heads
    grouped = result.reshape(row.sequences, kv_heads, width // q_len, q_len, *result.shape[2:])
    return grouped.movedim(3, 1).flatten(2, 3).flatten(0, 1)


@dataclass(frozen=True)
class _GroupedRow:
    """``sequences`` real rows of a batch with one query length and one context, stacked and
    laid out for GQA: their tokens (in order), ``q [R*KV, G*q, D]``, ``k``/``v [R*KV, L, D]``
    and the ``[G*q, L]`` mask of keys each query may not see (the same for each)."""

    tokens: torch.Tensor
    q_len: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    hidden: torch.Tensor
    sequences: int = 1

    @property
    def kv_heads(self) -> int:
        return int(self.k.shape[0]) // self.sequences


STACKED_ELEMENTS = 2**22
"""At most this many K elements per stack of equal-shape rows (memory stays that of a few rows)."""


def _grouped_rows(
    query: torch.Tensor,
    sequences: Sequence[SequenceKV | None],
    query_lens: Sequence[int],
    causal: bool,
    dtype: torch.dtype,
    window: int | None = None,
) -> Iterator[_GroupedRow]:
    """The real rows of a ragged batch on the CPU in ``dtype``; padding rows are skipped.

    Rows with one query length and one context are stacked (every row's
    arithmetic is its own; only the loop is shared), so a step of tens of
    thousands of decode rows costs a few tensor operations, not one per row.
    """
    start = 0
    shapes: dict[tuple[int, int], list[tuple[int, SequenceKV]]] = {}
    for seq, q_len in zip(sequences, query_lens, strict=True):
        if seq is not None and q_len > 0:
            shapes.setdefault((q_len, seq.length), []).append((start, seq))
        start += q_len
    if start != query.shape[0]:
        raise ValueError(f"query_lens sum to {start} but query has {query.shape[0]} tokens")
    for (q_len, length), rows in shapes.items():
        per_stack = max(1, STACKED_ELEMENTS // max(1, rows[0][1].key[0].numel() * length))
        for first in range(0, len(rows), per_stack):
            yield _stack(query, rows[first : first + per_stack], q_len, causal, dtype, window)


def _stack(
    query: torch.Tensor,
    rows: list[tuple[int, SequenceKV]],
    q_len: int,
    causal: bool,
    dtype: torch.dtype,
    window: int | None,
) -> _GroupedRow:
    keys = torch.stack([seq.key.detach().to("cpu", dtype) for _, seq in rows])  # [R, L, KV, D]
    values = torch.stack([seq.value.detach().to("cpu", dtype) for _, seq in rows])
    tokens = torch.cat([torch.arange(start, start + q_len) for start, _ in rows])
    kv_heads = keys.shape[2]
    q = query.detach()[tokens.to(query.device)].to("cpu", dtype)  # [R*q, H, D]
    q = q.reshape(len(rows), q_len, *q.shape[1:])
    grouped = _grouped_batch(q, kv_heads)
    length = keys.shape[1]
    visible = visible_mask(q_len, length, causal, window)
    hidden = ~visible.repeat(grouped.shape[1] // q_len, 1)
    return _GroupedRow(
        tokens,
        q_len,
        grouped,
        keys.transpose(1, 2).flatten(0, 1),  # [R*KV, L, D]
        values.transpose(1, 2).flatten(0, 1),
        hidden,
        len(rows),
    )


def _grouped_batch(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """``[R, q, H, D]`` -> ``[R*KV, group * q, D]``: ``_grouped_queries`` of each, stacked."""
    rows, q_len, num_heads, head_dim = q.shape
    group = num_heads // num_kv_heads
    grouped = q.reshape(rows, q_len, num_kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
    return grouped.flatten(2, 3).flatten(0, 1)


def oracle_attention(
    query: torch.Tensor,
    sequences: Sequence[SequenceKV | None],
    query_lens: Sequence[int],
    *,
    scale: float,
    causal: bool = True,
    variant: AttentionVariant = PLAIN,
    value_dim: int | None = None,
) -> OracleOutput:
    """Exact attention for a ragged batch; ``None`` marks a padding row (not checked).

    ``logit_scale`` also counts what a variant adds to a logit's size in fp32
    (the soft-cap's ``cap``, the largest ALiBi bias, the sink's ``|s|``).
    """
    num_tokens, num_heads, _ = query.shape
    width = output_dim(query, sequences, value_dim)
    out = torch.zeros(num_tokens, num_heads, width, dtype=torch.float64)
    value_scale = torch.zeros(num_tokens, num_heads, dtype=torch.float64)
    logit_scale = torch.zeros(num_tokens, num_heads, dtype=torch.float64)
    rounding_scale = torch.zeros(num_tokens, num_heads, dtype=torch.float64)
    lse = torch.zeros(num_tokens, num_heads, dtype=torch.float64)
    visible_keys = torch.zeros(num_tokens, num_heads, dtype=torch.float64)
    checked = torch.zeros(num_tokens, dtype=torch.bool)
    rows_of = _grouped_rows(
        query, sequences, query_lens, causal, torch.float64, variant.sliding_window
    )
    for row in rows_of:
        q, k, hidden, rows = row.q, row.k, row.hidden, row.tokens
        logits, sinks = variant_logits(row, scale, variant, torch.float64)  # [R*KV, G*q, L]
        probs, row_lse = softmax_with_sink(logits, sinks)
        out[rows] = _ungrouped(probs @ row.v, row)
        lse[rows] = _ungrouped(row_lse, row)
        # a bound's magnitude, not a result: float32 is ample and three times cheaper
        magnitude = (q.abs().float() @ k.abs().float().transpose(1, 2)).double() * abs(scale)
        if variant.alibi_slopes is not None:
            magnitude = magnitude + _alibi_bias(row, variant.alibi_slopes).abs()
        largest = magnitude.masked_fill(hidden, 0).amax(-1) + (variant.logits_soft_cap or 0.0)
        if sinks is not None:
            largest = largest + sinks[..., 0].abs()
        logit_scale[rows] = _ungrouped(largest, row)
        norms = row.v.norm(dim=-1).unsqueeze(1)  # [R*KV, 1, L]
        value_scale[rows] = _ungrouped(norms.masked_fill(hidden, 0).amax(-1), row)
        rounding_scale[rows] = _ungrouped((probs.square() @ norms.square().mT).sqrt()[..., 0], row)
        visible_keys[rows] = _ungrouped((~hidden).sum(-1).double().expand(k.shape[0], -1), row)
        checked[rows] = True
    return OracleOutput(
        out,
        value_scale,
        logit_scale,
        rounding_scale,
        checked,
        lse,
        visible_keys,
        logit_terms=int(query.shape[-1]),
    )


def naive_attention(
    query: torch.Tensor,
    sequences: Sequence[SequenceKV | None],
    query_lens: Sequence[int],
    *,
    scale: float,
    causal: bool = True,
    variant: AttentionVariant = PLAIN,
    value_dim: int | None = None,
) -> torch.Tensor:
    """Attention as a straightforward same-dtype implementation computes it.

    Logits from the dtype's inputs accumulated and kept in fp32, a stable
    fp32 softmax, probabilities rounded to the dtype, P.V with fp32
    accumulation, the output rounded to the dtype. Its error against the
    oracle is the yardstick of what the dtype's precision allows.
    """
    dtype = query.dtype
    num_tokens, num_heads, _ = query.shape
    out = torch.zeros(num_tokens, num_heads, output_dim(query, sequences, value_dim), dtype=dtype)
    for row in _grouped_rows(query, sequences, query_lens, causal, dtype, variant.sliding_window):
        logits, sinks = variant_logits(row, scale, variant, torch.float32)
        probs, _ = softmax_with_sink(logits, sinks)
        result = probs.to(dtype).float() @ row.v.float()
        out[row.tokens] = _ungrouped(result, row).to(dtype)
    return out


def references(
    query: torch.Tensor,
    sequences: Sequence[SequenceKV | None],
    query_lens: Sequence[int],
    *,
    scale: float,
    causal: bool = True,
    variant: AttentionVariant = PLAIN,
    value_dim: int | None = None,
) -> tuple[OracleOutput, torch.Tensor]:
    """The oracle and the naive same-dtype output: what ``tolerance.compare`` takes."""
    options: dict[str, Any] = {
        "scale": scale,
        "causal": causal,
        "variant": variant,
        "value_dim": value_dim,
    }
    return (
        oracle_attention(query, sequences, query_lens, **options),
        naive_attention(query, sequences, query_lens, **options),
    )
