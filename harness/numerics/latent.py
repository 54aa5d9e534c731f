"""MLA geometries: which latent widths a step takes, for a backend of kind ``mla``.

An MLA step is the MHA step with one KV head whose value row is the first
``kv_lora_rank`` entries of its latent row (``Scenario.kv_lora_rank``). Served
models' geometries and small ones for fast draws are data here;
``for_kind`` turns any drawn or named step into one a backend's kind serves,
so every check and benchmark builds its steps one way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.core.contract import Capabilities
from harness.numerics.scenario import Scenario


@dataclass(frozen=True)
class LatentGeometry:
    """An MLA model's attention: query heads over one latent row of ``kv_lora_rank + rope_dim``."""

    model: str
    num_heads: int
    kv_lora_rank: int
    rope_dim: int

    @property
    def head_dim(self) -> int:
        """The latent row's width: what an absorbed query and the cache's rows hold."""
        return self.kv_lora_rank + self.rope_dim


MLA_MODEL_GEOMETRIES = (
    LatentGeometry("DeepSeek-V3 / R1", 128, 512, 64),
    LatentGeometry("DeepSeek-V3, TP 8 in the DP group", 16, 512, 64),
    LatentGeometry("DeepSeek-V2-Lite", 16, 512, 64),
    LatentGeometry("Kimi K2", 64, 512, 64),
    LatentGeometry("MiniCPM3-4B", 40, 256, 32),
)
SMALL_LATENT_DIMS = ((16, 8), (32, 16), (8, 5), (24, 8), (64, 32))
"""``(kv_lora_rank, rope_dim)`` of small MLA draws, odd widths included; shrinks to the first."""
MODEL_LATENT_DIMS = tuple(dict.fromkeys((m.kv_lora_rank, m.rope_dim) for m in MLA_MODEL_GEOMETRIES))


def claimed_latents(
    caps: Capabilities, wanted: tuple[tuple[int, int], ...]
) -> tuple[tuple[int, int], ...]:
    """``(kv_lora_rank, rope_dim)`` pairs for an MLA backend: those of ``wanted`` its claim
    allows, else (a claim that lists its head dims) the pairs its lists make."""
    kept = tuple((r, rope) for r, rope in wanted if caps.allows_latent(r + rope, r))
    if kept or caps.head_dims is None:
        return kept
    ranks = caps.kv_lora_ranks or tuple(range(1, max(caps.head_dims)))
    pairs = ((r, d - r) for d in caps.head_dims for r in ranks if caps.allows_latent(d, r))
    return tuple(pairs)[:8]


def latent_pairs(caps: Capabilities, production: bool = False) -> tuple[tuple[int, int], ...]:
    """The pairs to draw: small ones (served models' in ``production``), else any claimed."""
    first, second = (
        (MODEL_LATENT_DIMS, SMALL_LATENT_DIMS)
        if production
        else (SMALL_LATENT_DIMS, MODEL_LATENT_DIMS)
    )
    pairs = claimed_latents(caps, first) or claimed_latents(caps, second)
    if not pairs:
        raise ValueError(f"{caps} claims MLA but no latent geometry: list head_dims")
    return pairs


def as_latent(scenario: Scenario, kv_lora_rank: int, rope_dim: int) -> Scenario:
    """``scenario`` as an MLA step: one latent head of ``kv_lora_rank + rope_dim``, one cache
    tensor per layer (no combined K/V halves)."""
    return replace(
        scenario,
        num_kv_heads=1,
        head_dim=kv_lora_rank + rope_dim,
        kv_lora_rank=kv_lora_rank,
        combined_kv=False,
    )


def for_kind(caps: Capabilities, scenario: Scenario, production: bool = False) -> Scenario:
    """``scenario`` as the attention ``caps`` serves: unchanged for MHA; for MLA, the first
    claimed latent geometry (a served model's in ``production``), its heads kept."""
    if caps.kind != "mla" or scenario.is_mla:
        return scenario
    return as_latent(scenario, *latent_pairs(caps, production)[0])
