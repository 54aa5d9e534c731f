"""How coverage reads a step's sizes: the buckets of lengths, counts and head layouts.

The single-dimension tally (``claim_coverage``) and the pairwise one
(``pair_coverage``) bucket a step the same way, so a pair's cell and its two
dimensions' labels always agree. Bucket edges sit on kernels' thresholds: split
and tile sizes for contexts and queries, engines' token budgets, GPU grid limits.
"""

from __future__ import annotations

from typing import Any

Buckets = tuple[tuple[int, int | None], ...]

DP_BUCKETS: Buckets = ((1, 1), (2, 2), (3, 8), (9, 16), (17, 64))
CONTEXT_BUCKETS: Buckets = (
    (1, 64),
    (65, 256),
    (257, 1024),
    (1025, 4096),
    (4097, 32768),
    (32769, None),
)
QUERY_BUCKETS: Buckets = ((1, 1), (2, 64), (65, 128), (129, None))
TOKEN_BUCKETS: Buckets = ((1, 2**13), (2**13 + 1, 2**14), (2**14 + 1, 2**16), (2**16 + 1, None))
"""New tokens per step, cut at engines' token budgets (8192, 16384) and at 65536."""
SEQUENCE_BUCKETS: Buckets = ((1, 1), (2, 8), (9, 64), (65, 1024), (1025, 65535), (65536, None))
"""Sequences per step: one, a few, a launch grid's 64, thousands of ragged requests, and
more than a CUDA grid's y or z dimension holds (65535)."""
PAGE_BUCKETS: Buckets = ((1, 1), (2, 15), (16, 16), (17, 64), (65, None))
HEAD_DIM_BUCKETS: Buckets = ((1, 63), (64, 64), (65, 127), (128, 128), (129, None))


def bucket_name(low: int, high: int | None) -> str:
    if high is None:
        return f"{low}+"
    return str(low) if low == high else f"{low}-{high}"


def bucket(value: int, buckets: Buckets) -> str:
    """The name of the bucket ``value`` falls in."""
    for low, high in buckets:
        if value >= low and (high is None or value <= high):
            return bucket_name(low, high)
    raise ValueError(f"{value} is in no bucket")


MLA_HEAD_LABELS = ("MLA 1-16", "MLA 17+")
"""An MLA step's heads: up to 16 query heads over the latent row (one tile), or more."""


def heads_label(s: Any) -> str:
    """MHA, MQA, or a GQA group of up to 8 or past it (kernels pack 8 query heads); an MLA
    step's query heads up to 16 or past."""
    if getattr(s, "kv_lora_rank", None) is not None:
        return MLA_HEAD_LABELS[s.num_heads > 16]
    group = s.num_heads // s.num_kv_heads
    if group == 1:
        return "MHA"
    if s.num_kv_heads == 1:
        return "MQA"
    return "GQA 2-8" if group <= 8 else "GQA 9+"
