"""The engine metadata views of the backend kit, against tables built by hand.

Each case is a step an engine runs (a ragged batch on a DP rank's own pool, a
shared prefix, graph-mode padding) with its vLLM, FlashInfer and SGLang tables
written out by reading the step, not by running the views' code.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch

from harness.backend_kit import (
    PagedBackendBase,
    PreparedStep,
    flashinfer_metadata,
    sglang_metadata,
    take_rows,
    vllm_metadata,
)
from harness.conformance.check_matrix import run_quick_check
from harness.core.contract import AttentionMetadata, LayerCache
from harness.core.registry import BackendEntry

HEADS, KV_HEADS, HEAD_DIM = 2, 1, 4


class KeepsStep(PagedBackendBase):
    """Returns its query and keeps the step ``attend`` saw (the views' input)."""

    def attend(self, query: torch.Tensor, cache: LayerCache, step: PreparedStep) -> torch.Tensor:
        self.seen = step
        return query.clone()


def _step(
    *,
    total_pages: int,
    page_size: int,
    dp_size: int,
    dp_rank: int,
    per_rank: bool,
    query_start: list[int],
    seq_lens: list[int],
    block_table: list[list[int]],
    slots: list[int],
) -> PreparedStep:
    backend = KeepsStep(
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        scale=0.5,
        dp_size=dp_size,
        dp_rank=dp_rank,
    )
    first, pages = (
        (total_pages // dp_size * dp_rank, total_pages // dp_size)
        if per_rank
        else (
            0,
            total_pages,
        )
    )
    gen = torch.Generator().manual_seed(0)
    shape = (pages, page_size, KV_HEADS, HEAD_DIM)
    cache = LayerCache(
        key=torch.randn(shape, generator=gen),
        value=torch.randn(shape, generator=gen),
        page_offset=first,
        total_pages=total_pages,
    )
    backend.bind_kv_caches([cache])
    metadata = AttentionMetadata(
        query_start_loc=torch.tensor(query_start, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_table=torch.tensor(block_table, dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        max_query_len=max(b - a for a, b in itertools.pairwise(query_start)),
        max_seq_len=max(seq_lens),
    )
    backend.prepare(metadata, graph_mode=True)
    tokens = query_start[-1]
    query = torch.randn(tokens, HEADS, HEAD_DIM, generator=gen)
    new = torch.randn(tokens, KV_HEADS, HEAD_DIM, generator=gen)
    backend.forward(query, new, new.clone(), 0)
    return backend.seen


@pytest.fixture
def ragged_rank_step() -> PreparedStep:
    """Rank 1 of 2 on its own pool (global pages 4-7, page size 4): an extend row of 6
    tokens (2 new) on pages 5 then 4, a decode row of 1 token on page 7, and a graph-mode
    padding row with one query token."""
    return _step(
        total_pages=8,
        page_size=4,
        dp_size=2,
        dp_rank=1,
        per_rank=True,
        query_start=[0, 2, 3, 4],
        seq_lens=[6, 1, 0],
        block_table=[[5, 4], [7, -1], [-1, -1]],
        slots=[4 * 4 + 0, 4 * 4 + 1, 7 * 4 + 0, -1],
    )


def _ints(t: torch.Tensor) -> list:
    return t.tolist()


def test_vllm_view_of_a_ragged_batch_on_a_dp_rank(ragged_rank_step):
    view = vllm_metadata(ragged_rank_step, pages_per_tile=4)
    assert _ints(view.cu_seqlens_q) == [0, 2, 3, 4]
    assert _ints(view.seqused_k) == [6, 1, 0]
    assert (view.max_seqlen_q, view.max_seqlen_k) == (2, 6)
    # local ids (global 5, 4 -> 1, 0; 7 -> 3), padded with the safe page 0 to a tile of 4
    assert _ints(view.block_table) == [[1, 0, 0, 0], [3, 0, 0, 0], [0, 0, 0, 0]]
    assert view.block_table.dtype == torch.int32
    assert view.cu_seqlens_q.dtype == view.seqused_k.dtype == torch.int32


def test_vllm_view_pads_with_the_page_asked_to_any_tile(ragged_rank_step):
    view = vllm_metadata(ragged_rank_step, pages_per_tile=3, pad_page=2)
    assert _ints(view.block_table) == [[1, 0, 2], [3, 2, 2], [2, 2, 2]]


def test_flashinfer_view_of_a_ragged_batch_on_a_dp_rank(ragged_rank_step):
    view = flashinfer_metadata(ragged_rank_step)
    assert _ints(view.qo_indptr) == [0, 2, 3, 4]
    assert _ints(view.paged_kv_indptr) == [0, 2, 3, 3]
    assert _ints(view.paged_kv_indices) == [1, 0, 3]
    assert _ints(view.paged_kv_last_page_len) == [2, 1, 0]  # 6 = 4 + 2; the padding row: 0


def test_sglang_view_of_a_ragged_batch_on_a_dp_rank(ragged_rank_step):
    view = sglang_metadata(ragged_rank_step)
    row_a = [4, 5, 6, 7, 0, 1]  # local page 1's four slots, then page 0's first two
    assert _ints(view.qo_indptr) == [0, 2, 3, 4]
    assert _ints(view.kv_indptr) == [0, 6, 7, 7]
    assert _ints(view.kv_indices) == [*row_a, 12]
    assert _ints(view.prefix_lens) == [4, 0, 0]
    assert _ints(view.prefix_kv_indptr) == [0, 4, 4, 4]
    assert _ints(view.prefix_kv_indices) == row_a[:4]
    assert _ints(view.seq_lens) == [6, 1, 0]
    assert _ints(view.req_to_token) == [row_a, [12, 0, 0, 0, 0, 0], [0] * 6]
    assert view.max_len_extend == 2
    assert view.kv_indices.dtype == torch.int64
    assert view.kv_indptr.dtype == view.req_to_token.dtype == torch.int32


def test_sglang_window_tables_keep_each_rows_last_keys(ragged_rank_step):
    view = sglang_metadata(ragged_rank_step)
    indptr, indices = view.last_keys(3)
    assert _ints(indptr) == [0, 3, 4, 4]  # min(6, 3), min(1, 3), the padding row's 0
    assert _ints(indices) == [7, 0, 1, 12]
    assert indptr.dtype == torch.int32
    assert indices.dtype == torch.int64
    empty_indptr, empty = view.last_keys(0)
    assert _ints(empty_indptr) == [0, 0, 0, 0]
    assert empty.numel() == 0


def test_shared_prefix_pages_appear_in_both_rows():
    """Two sequences share page 2 (a common prefix) on one pool; both decode."""
    step = _step(
        total_pages=6,
        page_size=2,
        dp_size=1,
        dp_rank=0,
        per_rank=False,
        query_start=[0, 1, 2],
        seq_lens=[4, 3],
        block_table=[[2, 3], [2, 5]],
        slots=[3 * 2 + 1, 5 * 2 + 0],
    )
    assert _ints(vllm_metadata(step).block_table) == [[2, 3], [2, 5]]
    fi = flashinfer_metadata(step)
    assert _ints(fi.paged_kv_indices) == [2, 3, 2, 5]
    assert _ints(fi.paged_kv_last_page_len) == [2, 1]
    sg = sglang_metadata(step)
    assert _ints(sg.kv_indices) == [4, 5, 6, 7, 4, 5, 10]
    assert _ints(sg.prefix_kv_indices) == [4, 5, 6, 4, 5]


def test_views_are_built_once_per_step(ragged_rank_step):
    assert vllm_metadata(ragged_rank_step) is vllm_metadata(ragged_rank_step)
    assert sglang_metadata(ragged_rank_step) is sglang_metadata(ragged_rank_step)
    assert vllm_metadata(ragged_rank_step, pages_per_tile=2) is not vllm_metadata(ragged_rank_step)


def test_views_name_bad_arguments(ragged_rank_step):
    with pytest.raises(ValueError, match="pages_per_tile=0"):
        vllm_metadata(ragged_rank_step, pages_per_tile=0)
    with pytest.raises(ValueError, match=r"pad_page=4 is not a row of the bound cache \(0 .. 3\)"):
        vllm_metadata(ragged_rank_step, pad_page=4)  # the rank's pool holds 4 pages
    with pytest.raises(ValueError, match="pad_slot=-1"):
        sglang_metadata(ragged_rank_step, pad_slot=-1)
    bare = PreparedStep(
        ragged_rank_step.checked,
        ragged_rank_step.write_tokens,
        ragged_rank_step.write_rows,
        [],
        None,
    )
    with pytest.raises(ValueError, match="no cache geometry"):
        flashinfer_metadata(bare)


def _attend_over(
    backend: PagedBackendBase,
    query: torch.Tensor,
    cache: LayerCache,
    step: PreparedStep,
    rows_of: Callable[[int], torch.Tensor],
) -> torch.Tensor:
    """Attention of each real row over the cache rows ``rows_of(row)`` names, in float32."""
    out = torch.zeros_like(query)
    starts, lengths = step.checked.query_start, step.checked.seq_lens
    group = backend.num_heads // backend.num_kv_heads
    for row, length in enumerate(lengths):
        a, b = starts[row], starts[row + 1]
        if not length or a == b:
            continue
        rows = rows_of(row)
        assert rows.numel() == length, "a view gave the wrong number of slots"
        k = take_rows(cache.key_nhd, rows).float().repeat_interleave(group, 1).transpose(0, 1)
        v = take_rows(cache.value_nhd, rows).float().repeat_interleave(group, 1).transpose(0, 1)
        q = query[a:b].float().transpose(0, 1)
        logits = q @ k.transpose(1, 2) * backend.scale
        if step.checked.causal:
            position = torch.arange(length - (b - a), length)[:, None]
            logits = logits.masked_fill(torch.arange(length)[None, :] > position, float("-inf"))
        out[a:b] = (logits.softmax(-1) @ v).transpose(0, 1).to(query.dtype)
    return out


def _page_rows(pages: torch.Tensor, length: int, page_size: int) -> torch.Tensor:
    rows = pages.long()[:, None] * page_size + torch.arange(page_size)[None, :]
    return rows.reshape(-1)[:length]


class ThroughVllmView(PagedBackendBase):
    def attend(self, query, cache, step):
        view = vllm_metadata(step, pages_per_tile=4)
        size = cache.page_size
        return _attend_over(
            self,
            query,
            cache,
            step,
            lambda i: _page_rows(view.block_table[i], int(view.seqused_k[i]), size),
        )


class ThroughFlashInferView(PagedBackendBase):
    def attend(self, query, cache, step):
        view = flashinfer_metadata(step)
        size = cache.page_size

        def rows_of(i: int) -> torch.Tensor:
            a, b = int(view.paged_kv_indptr[i]), int(view.paged_kv_indptr[i + 1])
            length = (b - a - 1) * size + int(view.paged_kv_last_page_len[i])
            return _page_rows(view.paged_kv_indices[a:b], length, size)

        return _attend_over(self, query, cache, step, rows_of)


class ThroughSglangView(PagedBackendBase):
    def attend(self, query, cache, step):
        view = sglang_metadata(step)

        def rows_of(i: int) -> torch.Tensor:
            prefix = view.prefix_kv_indices[view.prefix_kv_indptr[i] : view.prefix_kv_indptr[i + 1]]
            whole = view.kv_indices[view.kv_indptr[i] : view.kv_indptr[i + 1]]
            assert torch.equal(whole[: prefix.numel()], prefix)  # the prefix view is its start
            assert torch.equal(view.req_to_token[i, : whole.numel()].long(), whole)
            return whole

        return _attend_over(self, query, cache, step, rows_of)


@pytest.mark.parametrize("backend", [ThroughVllmView, ThroughFlashInferView, ThroughSglangView])
def test_a_backend_reading_only_a_view_passes_the_quick_check(backend):
    """The quick check's steps (DP ranks on shared and per-rank pools, ragged batches,
    graph padding, page sizes, every dtype) read through each view match the oracle."""
    results = run_quick_check(BackendEntry(backend.__name__, backend, "test"))
    assert len(results) >= 10
    failed = [r for r in results if r.status != "PASSED"]
    assert not failed, failed[:3]


class KeepsNewKv(PagedBackendBase):
    """An extend kernel's adapter: ``attend`` declares the step's new keys and values."""

    def attend(self, query, cache, step, *, key, value):
        self.new = (key, value)
        return query.clone()

    def attend_with_lse(self, query, cache, step, *, key, value):
        self.new = (key, value)
        return query.clone(), torch.zeros(query.shape[:2])


def test_an_attend_that_declares_key_and_value_gets_the_steps_new_kv():
    backend = KeepsNewKv(num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, scale=0.5)
    shape = (4, 2, KV_HEADS, HEAD_DIM)
    gen = torch.Generator().manual_seed(1)
    cache = LayerCache(
        key=torch.randn(shape, generator=gen), value=torch.randn(shape, generator=gen)
    )
    backend.bind_kv_caches([cache])
    backend.prepare(
        AttentionMetadata(
            query_start_loc=torch.tensor([0, 3], dtype=torch.int32),
            seq_lens=torch.tensor([3], dtype=torch.int32),
            block_table=torch.tensor([[1, 2]], dtype=torch.int32),
            slot_mapping=torch.tensor([2, 3, 4]),
            max_query_len=3,
            max_seq_len=3,
        )
    )
    query = torch.randn(3, HEADS, HEAD_DIM, generator=gen)
    key = torch.randn(3, KV_HEADS, HEAD_DIM, generator=gen)
    value = torch.randn(3, KV_HEADS, HEAD_DIM, generator=gen)
    for call in (backend.forward, backend.forward_with_lse):
        backend.new = None
        call(query, key, value, 0)
        assert backend.new[0] is key
        assert backend.new[1] is value
    assert torch.equal(cache.key[1], key[:2])  # written before attend: slots 2, 3 on page 1
    assert torch.equal(cache.key[2][0], key[2])


def test_an_attend_without_them_is_called_as_before(ragged_rank_step):
    assert KeepsStep._new_kv_takers == frozenset()
    assert KeepsNewKv._new_kv_takers == {"attend", "attend_with_lse"}
