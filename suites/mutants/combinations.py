"""Combination mutants: wrong only where two dimensions meet, or where a feature meets size.

Each reproduces a reported bug (the thread in its ``Source:`` line) whose
regime is a pair: many sequences and long contexts, a GPU grid's limit in
sequences, the log-sum-exp output over a long context, or together with
graph-mode padding. Each dimension alone is exact; the suite reaches these
only when its properties draw from the whole space and its pairs are
covered. Each overrides one method of ``ReferenceBackend`` and claims what it
claims.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from harness.core.contract import LayerCache
from harness.core.kv_pages import pages_needed, put_rows, take_rows
from harness.core.paged_base import PreparedStep
from reference_backends.reference import ReferenceBackend

SPLIT_KEYS = 256  # keys per split-KV work item
GRID_LIMIT = 65535  # a CUDA grid's y and z dimensions
WORK_ITEMS = 1024  # split-KV work items a fixed-size plan holds
WRITE_CHUNK = 64  # new tokens of a row one cache-write chunk holds


class SequencesPastGridLimitDropped(ReferenceBackend):
    """Sequences past the 65,535th of one step are never computed (their rows stay zero).

    Source: flashinfer-ai/flashinfer#3125 (the batch size goes to ``gridDim.z``; above 65535
    the launch fails with ``CUDA_ERROR_INVALID_VALUE``, which is only printed, and the call
    returns wrong results); ml-explore/mlx#3858 (B=65535 works, B=65536 does not).
    Regime: more than 65,535 sequences in one step (tiny heads, where the count is the
    point). Every smaller batch is exact.
    """

    def attend_with_lse(
        self, query: torch.Tensor, cache: LayerCache, step: PreparedStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        kept = [rows if i < GRID_LIMIT else None for i, rows in enumerate(step.sequence_rows)]
        return super().attend_with_lse(query, cache, replace(step, sequence_rows=kept))


class SplitWorkPastPlanDropped(ReferenceBackend):
    """A split-KV plan holds 1024 work items (one per 256 keys of a sequence): sequences whose
    items start past it are never computed.

    Source: flashinfer-ai/flashinfer#5170 (``MLAPlan`` hard-coded 16384 work items with no
    bounds check: at batch 16385 one row is silently wrong, at 16600 216 rows).
    Regime: many sequences that are all long together (9+ sequences of 32k keys, 65+ of
    4k, 1025+ of 257+): the work items of one step pass the plan's size. Many short
    sequences, or a few long ones, are exact.
    """

    def attend_with_lse(
        self, query: torch.Tensor, cache: LayerCache, step: PreparedStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        kept, items = [], 0
        for rows in step.sequence_rows:
            kept.append(rows if items < WORK_ITEMS else None)
            if rows is not None:
                items += pages_needed(len(rows), SPLIT_KEYS)
        return super().attend_with_lse(query, cache, replace(step, sequence_rows=kept))


class LseOfFirstSplitOnly(ReferenceBackend):
    """``forward_with_lse`` returns the first 256-key split's log-sum-exp; the output is right.

    Source: flashinfer-ai/flashinfer#4051 (``merge_state`` of split-KV states returned the
    wrong state's lse); vllm-project/vllm-xpu-kernels#204 (split-KV decode partials merged
    with the wrong normaliser).
    Regime: the log-sum-exp of rows over more than 256 keys (long decode with
    ``forward_with_lse``, as cascade attention reads it). Outputs, and short rows, are exact.
    """

    def attend_with_lse(
        self, query: torch.Tensor, cache: LayerCache, step: PreparedStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = super().attend_with_lse(query, cache, step)
        if not any(rows is not None and len(rows) > SPLIT_KEYS for rows in step.sequence_rows):
            return out, lse
        first = [None if rows is None else rows[:SPLIT_KEYS] for rows in step.sequence_rows]
        _, first_lse = super().attend_with_lse(query, cache, replace(step, sequence_rows=first))
        starts = step.checked.query_start
        for row, rows in enumerate(step.sequence_rows):
            if rows is not None and len(rows) > SPLIT_KEYS:
                lse[starts[row] : starts[row + 1]] = first_lse[starts[row] : starts[row + 1]]
        return out, lse


class LseRowsShiftedByPadding(ReferenceBackend):
    """With graph-mode padding, the log-sum-exp rows come shifted by the padding tokens.

    Source: vllm-project/vllm#37442 (padded decode rows with ``seq_lens=0`` are skipped and
    leave stale values where the real rows' results are read from); vllm-project/vllm#40047
    (values of the padding region leak into real tokens).
    Regime: ``forward_with_lse`` on a step that ends in graph-mode padding rows: each real
    row's lse is another row's. Outputs, and steps without padding, are exact.
    """

    def attend_with_lse(
        self, query: torch.Tensor, cache: LayerCache, step: PreparedStep
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse = super().attend_with_lse(query, cache, step)
        starts = step.checked.query_start
        padded = sum(
            starts[row + 1] - starts[row]
            for row, rows in enumerate(step.sequence_rows)
            if rows is None
        )
        return out, torch.roll(lse, shifts=padded, dims=0) if padded else lse


class WriteShiftsHeadsPastChunk(ReferenceBackend):
    """The cache write of a row's new tokens past its first 64 puts each KV head's K/V in the
    previous head's place; the step's own output is right (it reads the new tokens as given).

    Source: tenstorrent/tt-metal#54742 (``update_padded_kv_cache`` writes every block past a
    head boundary into the previous head's rows once the write is deeper than one chunk);
    vllm-project/vllm#53681 (a cache-write kernel that misread the cache's dims silently
    corrupted the cache, and only decode outputs showed it).
    Regime: a later step reading what one step of 65+ new tokens of a row wrote, with 2+ KV
    heads, in an unquantized cache: a prefill or chunk past a query tile, then a decode.
    Single steps, writes of 64 tokens or fewer, and FP8 caches (a quantizing write of its
    own) are exact.
    """

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        layer_idx: int,
        *,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        result = super().forward(query, key, value, layer_idx, out=out)
        self._shift_heads(layer_idx)
        return result

    def forward_with_lse(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_idx: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        result = super().forward_with_lse(query, key, value, layer_idx)
        self._shift_heads(layer_idx)
        return result

    def _shift_heads(self, layer_idx: int) -> None:
        step, cache = self._step, self._caches[layer_idx]
        assert step is not None
        starts, slots = step.checked.query_start, step.checked.slots
        deep = [
            token
            for row in range(len(starts) - 1)
            for token in range(starts[row] + WRITE_CHUNK, starts[row + 1])
            if slots[token] != -1
        ]
        if not deep or self.num_kv_heads < 2 or self.variant.cache_dtype is not None:
            return  # an FP8 cache has its own (quantizing) write path
        written = dict(zip(step.write_tokens.tolist(), step.write_rows.tolist(), strict=True))
        rows = torch.tensor([written[t] for t in deep], device=step.write_rows.device)
        for tensor in (cache.key_nhd, cache.value_nhd):
            stored = take_rows(tensor, rows)
            put_rows(tensor, rows, torch.cat([stored[:, 1:], stored[:, -1:]], dim=1))


COMBINATION_MUTANTS: tuple[type, ...] = (
    SequencesPastGridLimitDropped,
    SplitWorkPastPlanDropped,
    LseOfFirstSplitOnly,
    LseRowsShiftedByPadding,
    WriteShiftsHeadsPastChunk,
)
