"""Reading a step's K/V back from the cache: what an FP8 backend stored, and whether it is right.

With an FP8 KV cache the oracle must see the values the backend reads,
which are the ones it stored; a backend may round ``k / k_scale`` in its
own arithmetic (a product with ``1 / k_scale``, another precision), so the
harness does not assume its own rounding. Instead every stored new value is
checked to be within one FP8 spacing of the exact ``k / k_scale`` (round
to nearest, with room for double rounding), and the oracle then reads the
cache. A scale inverted or forgotten on the write fails here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.core.batches import StepRow
from harness.core.contract import LayerCache
from harness.core.kv_pages import local_slots, read_tokens, take_rows
from harness.core.variants import AttentionVariant, dequantize, fp8_ulp
from harness.numerics.canary import bits
from harness.numerics.oracle import SequenceKV


def stored_sequence(
    cache: LayerCache, pages: Sequence[int], length: int, variant: AttentionVariant
) -> SequenceKV:
    """A sequence's ``length`` tokens as the backend reads them (dequantized, float32, for FP8)."""
    key, value = read_tokens(cache, pages, length)
    if variant.quantized:
        key, value = dequantize(key, variant.k_scale), dequantize(value, variant.v_scale)
    return SequenceKV(key, value)


def stored_sequences(
    cache: LayerCache,
    rows: Sequence[StepRow],
    sequences: Sequence[SequenceKV | None],
    variant: AttentionVariant,
) -> list[SequenceKV | None]:
    """``sequences`` with each real row's K/V replaced by what the cache holds for it."""
    return [
        None if seq is None else stored_sequence(cache, row.pages, row.seq_len, variant)
        for seq, row in zip(sequences, rows, strict=True)
    ]


def write_problem(
    cache: LayerCache,
    slots: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    variant: AttentionVariant,
) -> str | None:
    """Why what the cache holds at ``slots`` is not what the step gave (``None``: it is).

    ``slots`` are global, ``-1`` for tokens that are not written. An FP8
    cache holds each value within one FP8 step of ``value / scale``; any
    other holds it bit for bit. Read through ``cache.key_nhd``/``value_nhd``:
    for a backend-owned page format, its views, so a format whose views
    disagree with its own write op fails.
    """
    written = (slots != -1).nonzero().flatten()
    if written.numel() == 0:
        return None
    rows = local_slots(cache, slots[written].to(torch.long)).to(cache.key.device)
    for name, tensor, new, scale in (
        ("key", cache.key_nhd, key, variant.k_scale),
        ("value", cache.value_nhd, value, variant.v_scale),
    ):
        stored = take_rows(tensor, rows).cpu()
        given = new.detach().cpu().index_select(0, written.cpu())
        if variant.quantized:
            problem = _quantized_mismatch(stored, given, written, name, scale, variant)
        else:
            problem = _exact_mismatch(stored, given.to(stored.dtype), written, name, cache.layout)
        if problem is not None:
            return problem
    return None


def _exact_mismatch(
    stored: torch.Tensor, given: torch.Tensor, tokens: torch.Tensor, name: str, layout: str
) -> str | None:
    """Where the first written row's bits differ (``tokens``: each row's token id)."""
    off = bits(stored) != bits(given)
    if not off.any():
        return None
    token, head, dim = off.nonzero()[0].tolist()
    return (
        f"{layout} cache: stored {name} of token {int(tokens[token])} "
        f"(head {head}, dim {dim}) reads back as {float(stored[token, head, dim]):.6g}, "
        f"but the step gave {float(given[token, head, dim]):.6g}; "
        f"{int(off.any(-1).sum())} (token, head) rows differ"
    )


def _quantized_mismatch(
    stored: torch.Tensor,
    given: torch.Tensor,
    tokens: torch.Tensor,
    name: str,
    scale: float,
    variant: AttentionVariant,
) -> str | None:
    """Where the first value lies more than one FP8 step from ``given / scale``."""
    assert variant.cache_dtype is not None
    stored, exact = stored.double(), given.double() / scale
    off = (stored - exact).abs() > fp8_ulp(exact, variant.cache_dtype)
    off |= ~torch.isfinite(stored)
    if not off.any():
        return None
    token, head, dim = off.nonzero()[0].tolist()
    return (
        f"{variant.kv_cache_dtype} cache: stored {name} of token {int(tokens[token])} "
        f"(head {head}, dim {dim}) is {float(stored[token, head, dim]):.6g}, but "
        f"{name} / {name[0]}_scale = {float(exact[token, head, dim]):.6g} "
        f"(scale {scale:g}); {int(off.sum())} values off by more than one FP8 step"
    )
