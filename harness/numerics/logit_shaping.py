"""Inputs shaped so that a kernel's handling of logits shows: planted keys, offset rows.

A step's drawn K/V give logits of a few units, where dropping one key or
starting a running maximum at a finite sentinel changes an output by the
size of rounding. ``_plant`` gives boundary keys a logit far above the
others, ``offset_queries`` moves whole rows of logits far from zero, and
``logit_reach`` bounds what a scenario's logits can reach (what a claim on
the logits, a soft-cap bound, is compared with).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from harness.core.batches import Step
from harness.core.variants import AttentionVariant
from harness.numerics.value_regimes import regime_logit_reach

if TYPE_CHECKING:
    from harness.numerics.scenario import Scenario

FP8_HEADROOM = 0.9
"""K/V of an FP8 scenario stay within this fraction of the FP8 range times the scale."""


def fp8_limit(variant: AttentionVariant, scale: float) -> float:
    """The largest magnitude an FP8 cache holds for values stored as ``value / scale``."""
    assert variant.cache_dtype is not None
    return FP8_HEADROOM * torch.finfo(variant.cache_dtype).max * scale


PLANTED_LOGIT = 8.0
"""How far above the others a planted key's logit sits: at 4096 keys it holds ~40% of the weight."""


def plant_positions(length: int, page_size: int, candidates: range) -> list[int]:
    """Where kernels' indexing goes wrong: first and last key, page and split boundaries."""
    marks = {0, length - 1}
    for block in (page_size, 64, 128, 256):
        marks |= {m + d for m in range(block, length, block) for d in (-1, 0)}
    return sorted(p for p in marks if p in candidates)


def query_lean(s: Scenario) -> float:
    return math.sqrt(s.head_dim) * s.magnitude


def plant_keys(
    key: torch.Tensor, s: Scenario, candidates: range, gen: torch.Generator
) -> torch.Tensor | None:
    """Give ``s.planted_keys`` boundary keys of one sequence a logit ``PLANTED_LOGIT`` higher.

    Those keys and every query of the sequence share a unit direction ``u``:
    ``q += |q| u`` and ``k += a u`` with ``scale * |q| * a = PLANTED_LOGIT``,
    so dropping, masking or misplacing a planted key is a large error in any
    dtype instead of one the size of rounding. Returns ``u`` (``None``: none planted).
    """
    if not s.planted_keys:
        return None
    positions = plant_positions(key.shape[0], s.page_size, candidates)
    if not positions:
        return None
    chosen = torch.randperm(len(positions), generator=gen)[: s.planted_keys]
    direction = torch.randn(s.head_dim, generator=gen)
    direction /= direction.norm()
    lift = PLANTED_LOGIT / (s.softmax_scale * query_lean(s))
    for index in chosen.tolist():
        key[positions[index]] += (direction * lift).to(key.dtype)
    return direction


def logit_reach(s: Scenario) -> float:
    """A bound on ``|scale * q.k|`` over ``s``'s inputs: what a claim on the logits compares.

    ``|q.k| <= |q| |k|``, each about ``magnitude * sqrt(head_dim)`` for normal
    draws (1.5x of it for the tails), plus a planted key's lift, the largest
    logit offset and the massive channels of a value regime.
    """
    raw = (1.5 * s.magnitude) ** 2 * s.head_dim * s.softmax_scale
    planted = PLANTED_LOGIT if s.planted_keys else 0.0
    offset = max((abs(o) for o in s.logit_offsets), default=0.0)
    return raw + planted + offset + regime_logit_reach(s.values, s.softmax_scale)


MAX_LOGIT_OFFSET = 1e5


def logit_offset_limit(s: Scenario) -> float:
    """The largest ``|offset|`` ``s`` can hold without overflowing its dtype.

    In fp16 the raw ``q.k`` (``offset / scale``) and the query component stay
    within half of its range, since a kernel may form ``q.k`` in the dtype;
    bf16 and fp32 reach ``MAX_LOGIT_OFFSET``. An FP8 cache caps the key
    component, so the query's must make up the rest.
    """
    room = torch.finfo(s.dtype).max / 2
    raw = min(room, 1e30)
    if s.variant.cache_dtype is not None:
        raw = min(raw, room * fp8_limit(s.variant, s.variant.k_scale))
    return min(MAX_LOGIT_OFFSET, raw * s.softmax_scale)


def offset_key_component(s: Scenario) -> float:
    """The last head-dim component every key of an offset scenario holds (see ``_offset_queries``).

    ``sqrt`` of the largest raw offset, so query and key share the magnitude;
    an FP8 cache caps it at its range times ``k_scale``.
    """
    raw = max(abs(o) for o in s.logit_offsets) / s.softmax_scale
    component = math.sqrt(raw)
    if s.variant.cache_dtype is not None:
        component = min(component, fp8_limit(s.variant, s.variant.k_scale))
    return component


def offset_queries(s: Scenario, step: Step, query: torch.Tensor) -> None:
    """Move every logit of sequence ``i`` by ``s.logit_offsets[i]``, exactly.

    Every key's last component is one common value ``a``
    (``offset_key_component``) and every query of row ``i`` gets ``b_i``
    there, with ``scale * a * b_i`` the offset: the logits' differences
    within a row (all that softmax sees) are the drawn ones, while the row's
    maximum sits near the offset, where kernels that start their running
    maximum at a finite sentinel, keep it in a narrow type or overflow an
    ``exp2`` domain go wrong. The oracle is exact and shift-invariant, and
    the bound's ``logit_scale`` counts ``|a b_i|``.
    """
    a = offset_key_component(s)
    start = 0
    for index, row in enumerate(step.rows):
        offset = s.logit_offsets[index] if index < len(s.logit_offsets) else 0.0
        if row.seq_id is not None:  # a row without an offset gets 0: its logits stay put
            query[start : start + row.query_len, :, -1] = offset / (s.softmax_scale * a)
        start += row.query_len
