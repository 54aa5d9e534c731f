"""The production shapes conformance must reach, and what one example may cost.

Real kernels tile queries (64/128 rows), split long contexts into 256+-key
chunks, hard-code block sizes, cap launch grids and keep lengths and ids in
narrow integers: their bugs live just past those thresholds. Each *regime*
below aims the draws at one family of thresholds, on both sides of each.
The sizes are data here; ``harness.conformance.strategies`` draws from them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

THRESHOLDS = (64, 128, 256, 512, 1024, 2048, 4096)
LONG_CONTEXT = 32768  # past int16 lengths


def both_sides(values: tuple[int, ...]) -> tuple[int, ...]:
    """Each threshold, one below and one above it."""
    return tuple(sorted({v + d for v in values for d in (-1, 0, 1)}))


SPLIT_CONTEXTS = both_sides(THRESHOLDS)
LONG_CONTEXTS = (4097, 8193, 16385, 32767, 32768, 32769, 33000)
QUERY_TILES = (63, 64, 65, 127, 128, 129, 200, 256, 257)
MANY_SEQUENCES = (64, 65, 96, 128)
PRODUCTION_PAGE_SIZES = (32, 64, 128, 256)
PRODUCTION_HEAD_DIMS = (64, 80, 96, 128, 192, 256)
PRODUCTION_GROUPS = (1, 2, 4, 7, 8, 9, 12, 16)
WIDE_GROUPS = (16, 12, 9)  # GQA past 8 query heads per KV head (Llama-3 405B, Qwen3: 16)
MQA_HEADS = (32, 64, 71)
LARGE_DP_SIZES = (9, 12, 16, 33, 64)
SPEC_QUERY_LENS = (2, 3, 4, 5, 6, 7, 8)  # draft tokens + 1 per request (EAGLE, MTP, n-gram)
SPEC_COMMON_QUERY_LENS = (3, 4, 5, 6, 7)  # the usual 2-6 drafts: drawn twice as often
SPEC_GROUPS = (1, 2, 4, 5, 6, 7, 8, 16)  # GQA groups of served models (Qwen 7, Phi-3 4, ...)
TOKEN_BUDGETS = (8193, 16385, 65537)  # just past engines' max_num_batched_tokens defaults
TOKEN_BUDGET_QUERY_HEADS = (1, 2, 4)  # over one KV head: tens of thousands of tokens fit
BUDGET_QUERY_LENS = (64, 65, 96, 127, 128, 129)  # chunked-prefill chunks per request
BUDGET_LONG_CHUNKS = (200, 256, 600)  # one chunk in eight


@dataclass(frozen=True)
class HeadGeometry:
    """Attention heads of a served model (whole model, or one tensor-parallel shard)."""

    model: str
    num_heads: int
    num_kv_heads: int
    head_dim: int


MODEL_GEOMETRIES = (
    HeadGeometry("Llama-3 8B", 32, 8, 128),
    HeadGeometry("Llama-3 70B", 64, 8, 128),
    HeadGeometry("Llama-3 70B, TP 8", 8, 1, 128),
    HeadGeometry("Llama-3 405B", 128, 8, 128),
    HeadGeometry("Mistral-7B", 32, 8, 128),
    HeadGeometry("Qwen2.5-7B", 28, 4, 128),
    HeadGeometry("Qwen2.5-72B", 64, 8, 128),
    HeadGeometry("Qwen2.5-0.5B", 14, 2, 64),
    HeadGeometry("Qwen3-235B-A22B", 64, 4, 128),
    HeadGeometry("Gemma-2 2B", 8, 4, 256),
    HeadGeometry("Gemma-2 9B", 16, 8, 256),
    HeadGeometry("Gemma-2 27B", 32, 16, 128),
    HeadGeometry("Gemma-3 1B", 4, 1, 256),
    HeadGeometry("Phi-3 mini", 32, 32, 96),
    HeadGeometry("Phi-3 medium", 40, 10, 128),
    HeadGeometry("gpt-oss-120b", 64, 8, 64),
    HeadGeometry("Falcon-7B", 71, 1, 64),
    HeadGeometry("StarCoder2-15B", 48, 4, 128),
    HeadGeometry("GPT-NeoX-20B", 64, 64, 96),
    HeadGeometry("Phi-2", 32, 32, 80),
)


MODEL_SCALES = (
    None,  # 1/sqrt(head_dim), most models
    None,
    None,
    0.0078125,  # Granite-3: attention_multiplier 1/128 at head_dim 128 (1/head_dim, muP)
    144.0**-0.5,  # Gemma-2 27B: query_pre_attn_scalar 144 at head_dim 128
    (0.1 * math.log(40.0) + 1.0) ** 2 / math.sqrt(192.0),  # DeepSeek-V3: YaRN x40 mscale^2
)
"""Softmax scales of served models; ``None`` is the default, drawn half the time."""

REGIMES = (
    "split-kv",  # contexts on both sides of 64 ... 4096 (split-KV chunks, key tiles)
    "long-context",  # decode past 4096 and past 32768 keys
    "query-tiles",  # prefill / extend with query lengths past 64 and 128
    "many-sequences",  # 64+ sequences in one step (launch grids)
    "head-geometry",  # real models' heads: GQA past 8, MQA at 32+ heads, head_dim to 256
    "page-sizes",  # pages of 32 .. 256 tokens
    "dp-groups",  # dp_size past 8, every rank, pools that do not divide, page ids past 32767
    "spec-decode",  # every request the same 2-8 new tokens over long contexts, real GQA groups
    "token-budget",  # steps of 8193-70000 new tokens: 128+ short prefills and decodes
)


@dataclass(frozen=True)
class CostLimit:
    """What one production example may allocate and compute, so CI stays bounded.

    ``cache_elements``: pool slots held x KV heads x head_dim, per K (or V)
    tensor of one layer; ``work``: multiply-adds of one attention pass,
    sum over sequences of ``H * q * L * D`` (the oracle computes only new rows).
    """

    cache_elements: int = 2**23
    work: int = 2**27

    def max_tokens(self, num_kv_heads: int, head_dim: int) -> int:
        return self.cache_elements // (num_kv_heads * head_dim)

    def max_query_context(self, num_heads: int, head_dim: int) -> int:
        """The largest ``q * L`` summed over sequences."""
        return self.work // (num_heads * head_dim)
