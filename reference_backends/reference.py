"""``reference``: the readable baseline, one sequence at a time.

Gathers each sequence's tokens from its pages, computes attention in fp32
with an explicit stable softmax, and casts back. Slow on purpose: every step
of the contract's formula is its own small method, attention variants
included (it supports every one: it is their readable definition).
"""

from __future__ import annotations

import dataclasses

import torch

from harness.core.contract import Capabilities, LayerCache
from harness.core.paged_base import PagedBackendBase, PreparedStep
from harness.core.variants import CACHE_LAYOUTS, KV_CACHE_DTYPES


class ReferenceBackend(PagedBackendBase):
    """Per-sequence paged attention in fp32; DP-aware, any dtype, page size and head dim.

    Every variant: sliding window, soft-cap, sinks, ALiBi, FP8 caches, the
    HND layout, ``out=`` and ``forward_with_lse``.
    """

    @classmethod
    def capabilities(cls) -> Capabilities:
        return dataclasses.replace(
            super().capabilities(),
            sliding_window=True,
            soft_cap=True,
            sinks=True,
            alibi=True,
            kv_cache_dtypes=tuple(KV_CACHE_DTYPES),
            cache_layouts=CACHE_LAYOUTS,
            lse=True,
            padding_rows="zero",  # padding rows are never written into the zeroed output
        )

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        return self.attend_with_lse(query, cache, step)[0]

    def attend_with_lse(
        self, query: torch.Tensor, cache: LayerCache, step: PreparedStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = query.new_zeros(*query.shape[:2], self.value_dim)
        lse = torch.zeros(query.shape[:2], dtype=torch.float32, device=query.device)
        for tokens, key, value in self.sequences(cache, step):
            q = query[tokens].float().transpose(0, 1)  # [H, q, D]
            k = self.expand_kv_heads(key.float())  # [H, L, D]
            v = self.expand_kv_heads(value.float())
            logits = self.logits(q, k)  # [H, q, L]
            visible = self.visible(q.shape[1], k.shape[1], step.checked.causal, q.device)
            logits = logits.masked_fill(~visible, float("-inf"))
            logits = self.with_sinks(logits)
            probs = self.softmax(logits)
            if self.variant.sinks is not None:
                probs = probs[..., :-1]  # the sink's weight has no value to add
            out[tokens] = self.weighted_values(probs, v).transpose(0, 1).to(query.dtype)
            lse[tokens] = torch.logsumexp(logits, dim=-1).transpose(0, 1)
        return out, lse

    @staticmethod
    def weighted_values(probs: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``P.V``: ``[H, q, L] @ [H, L, D]`` in fp32, the probabilities already normalised."""
        return probs @ v

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """``scale * q.k``, then the soft-cap, then the ALiBi bias: ``[H, q, L]``."""
        logits = (q @ k.transpose(1, 2)) * self.scale
        cap = self.variant.logits_soft_cap
        if cap is not None:
            logits = cap * torch.tanh(logits / cap)
        if self.variant.alibi_slopes is not None:
            logits = logits + self.alibi_bias(q.shape[1], k.shape[1], q.device)
        return logits

    def alibi_bias(self, query_len: int, length: int, device: torch.device) -> torch.Tensor:
        """``slope_h * (key_pos - query_pos)``, ``[H, q, L]``."""
        assert self.variant.alibi_slopes is not None
        slopes = torch.tensor(self.variant.alibi_slopes, device=device)[:, None, None]
        query_pos = torch.arange(length - query_len, length, device=device)
        distance = torch.arange(length, device=device)[None, :] - query_pos[:, None]
        return slopes * distance.float()

    def visible(
        self, query_len: int, length: int, causal: bool, device: torch.device
    ) -> torch.Tensor:
        """``[q, L]``, True where query j (at position ``L - q + j``) may see a key."""
        query_pos = torch.arange(length - query_len, length, device=device)[:, None]
        key_pos = torch.arange(length, device=device)[None, :]
        if causal:
            visible = self.causal_mask(query_len, length, device)
        else:
            visible = torch.ones(query_len, length, dtype=torch.bool, device=device)
        window = self.variant.sliding_window
        if window is not None:  # two-sided without causal
            visible = visible & (key_pos > query_pos - window)
            if not causal:
                visible = visible & (key_pos < query_pos + window)
        return visible

    def expand_kv_heads(self, kv: torch.Tensor) -> torch.Tensor:
        """``[KV, L, D]`` -> ``[H, L, D]``: query head h reads KV head ``h // group``."""
        return kv.repeat_interleave(self.num_heads // self.num_kv_heads, dim=0)

    @staticmethod
    def causal_mask(query_len: int, length: int, device: torch.device) -> torch.Tensor:
        """``[q, L]``, True where visible: query j sits at position ``L - q + j``."""
        positions = torch.arange(length - query_len, length, device=device)
        return torch.arange(length, device=device)[None, :] <= positions[:, None]

    def with_sinks(self, logits: torch.Tensor) -> torch.Tensor:
        """``[H, q, L]`` -> ``[H, q, L + 1]``: each head's sink logit as one more column."""
        if self.variant.sinks is None:
            return logits
        sinks = torch.tensor(self.variant.sinks, device=logits.device)[:, None, None]
        return torch.cat([logits, sinks.expand(-1, logits.shape[1], 1)], dim=-1)

    @staticmethod
    def softmax(logits: torch.Tensor) -> torch.Tensor:
        """Stable softmax: subtract the row maximum before exponentiating."""
        weights = (logits - logits.amax(dim=-1, keepdim=True)).exp()
        return weights / weights.sum(dim=-1, keepdim=True)


class ReferenceMlaBackend(ReferenceBackend):
    """MLA (kind ``mla``): the same per-sequence computation over a latent cache.

    The latent rows are the key (one head, shared by every query head) and
    their first ``kv_lora_rank`` entries the value, so attention is the
    formula above with one KV head: the readable definition of MLA decode,
    prefill and extend over absorbed queries. FP8 latent caches, ``out=`` and
    ``forward_with_lse``; no window, soft-cap, sinks or ALiBi (MLA models use none).
    """

    @classmethod
    def capabilities(cls) -> Capabilities:
        return dataclasses.replace(
            super().capabilities(),
            kind="mla",
            sliding_window=False,
            soft_cap=False,
            sinks=False,
            alibi=False,
            cache_layouts=("NHD",),
        )
