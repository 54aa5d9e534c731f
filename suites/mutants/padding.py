"""Padding-row mutants: graph-mode padding rows that an engine reads later come out non-finite.

The contract leaves padding rows' outputs unspecified, but an engine that
feeds them to its next layers (a batch-wide FP8 or NVFP4 scale, an RMSNorm,
a MoE router) needs them finite; a backend may promise that with
``Capabilities(padding_rows="finite")`` and the suite then checks every
padded step. Each class below makes that promise and breaks it only on
padding rows, as the reported kernel did (its ``Source:`` line); real rows
are exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch

from harness.core.contract import Capabilities, LayerCache
from harness.core.paged_base import PreparedStep
from reference_backends.reference import ReferenceBackend


def padding_tokens(step: PreparedStep) -> Iterator[slice]:
    """The query rows of each graph-mode padding request of ``step``."""
    starts = step.checked.query_start
    for row, rows in enumerate(step.sequence_rows):
        if rows is None and starts[row + 1] > starts[row]:
            yield slice(starts[row], starts[row + 1])


class _PromisesFinitePadding(ReferenceBackend):
    @classmethod
    def capabilities(cls) -> Capabilities:
        return dataclasses.replace(super().capabilities(), padding_rows="finite")


class PaddingRowsZeroOverZero(_PromisesFinitePadding):
    """A padding request (``seq_len`` 0) computes ``acc / sum = 0 / 0``: NaN rows.

    Source: vllm-project/vllm#57094 (Triton MLA decode: a pad row with ``seq_len=0`` gives
    ``acc/e_sum = 0/0 = NaN``, which a per-tensor FP8 MoE scale then spreads to every
    request once a batch of 3 is padded to 4).
    Regime: graph-mode steps with padding rows: every padding row is NaN.
    """

    def attend_with_lse(
        self, query: torch.Tensor, cache: LayerCache, step: PreparedStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = super().attend_with_lse(query, cache, step)
        for tokens in padding_tokens(step):
            out[tokens] = torch.zeros((), dtype=out.dtype) / 0  # the empty row's 0 / 0
        return out, lse


class PaddingRowsLeftStale(_PromisesFinitePadding):
    """Padding rows are never written: they keep what the output buffer held (NaN here).

    Source: vllm-project/vllm#37442 (with ``seq_lens=0`` the kernel skips the row, so stale
    NaN stays in the output buffer); flashinfer-ai/flashinfer#2883 (the MLA decode writes
    NaN into padded output rows).
    Regime: graph-mode steps with padding rows: their rows hold the buffer's old contents,
    which for a buffer kept across steps (as a captured graph keeps it) start as NaN.
    """

    def attend_with_lse(
        self, query: torch.Tensor, cache: LayerCache, step: PreparedStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = super().attend_with_lse(query, cache, step)
        kept = self.__dict__.setdefault("_static_out", {})
        stale = kept.setdefault(out.shape, torch.full_like(out, float("nan")))
        for tokens in padding_tokens(step):
            out[tokens] = stale[tokens]
        return out, lse


class PaddingRowsReadPageZero(_PromisesFinitePadding):
    """A padding row's block-table entry -1 is clamped to page 0 and one token is read there.

    Source: vllm-project/vllm#57156 (dummy capture batches gather slot 0 for invalid
    indices, and what block 0 holds turns every row NaN); sgl-project/sglang#1779 (padded
    requests moved from ``seq_len`` 0 to 1 because 0 gave NaN).
    Regime: graph-mode steps with padding rows: each reads the first slot of the bound
    pool's first page, whatever it holds (garbage, often NaN, when no token lives there).
    """

    def attend_with_lse(
        self, query: torch.Tensor, cache: LayerCache, step: PreparedStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = super().attend_with_lse(query, cache, step)
        value = cache.value_nhd[0, 0].float()  # [KV, D]: slot 0 of local page 0
        group = self.num_heads // self.num_kv_heads
        for tokens in padding_tokens(step):  # one key: the softmax gives it all the weight
            out[tokens] = value.repeat_interleave(group, dim=0).to(out.dtype)
        return out, lse


PADDING_MUTANTS: tuple[type, ...] = (
    PaddingRowsZeroOverZero,
    PaddingRowsLeftStale,
    PaddingRowsReadPageZero,
)
