"""Unit tests for harness.core.batches: BatchBuilder over a PagePool."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from harness.core.batches import BatchBuilder, StepRow, build_metadata
from harness.core.errors import MetadataError, OutOfPages
from harness.core.kv_pages import PagePool, dp_page_range
from harness.core.validate import check_rank_ownership, validate_metadata


def check_step(step, builder, *, graph_mode=False):
    """Validate a built step as a backend of the builder's rank would."""
    pool = builder.pool
    checked = validate_metadata(
        step.metadata,
        page_size=builder.page_size,
        total_pages=pool.total_pages,
        graph_mode=graph_mode,
    )
    check_rank_ownership(
        checked, page_size=builder.page_size, page_range=pool.rank_range(builder.rank)
    )
    return checked


def builder_state(builder):
    return {
        sid: (list(s.pages), s.cached_len) for sid, s in builder.sequences.items()
    }, builder._next_id


def pool_state(pool):
    return (
        [pool.num_free(r) for r in range(pool.dp_size)],
        {p: pool.refcount(p) for p in range(pool.total_pages)},
    )


def as_lists(md):
    return (
        md.query_start_loc.tolist(),
        md.seq_lens.tolist(),
        md.block_table.tolist(),
        md.slot_mapping.tolist(),
        md.max_query_len,
        md.max_seq_len,
    )


# --------------------------------------------------------------------------- #
# A hand-worked example
# --------------------------------------------------------------------------- #


def test_hand_worked_steps_page_size_3():
    pool = PagePool(12)
    b = BatchBuilder(pool, 0, page_size=3)
    a, c = b.admit(), b.admit()
    assert (a, c) == (0, 1)

    # Step 1: prefill a with 4 tokens (ends mid-page), c with 3 (ends on a boundary).
    s1 = b.step([(a, 4), (c, 3)])
    check_step(s1, b)
    assert as_lists(s1.metadata) == (
        [0, 4, 7],
        [4, 3],
        [[0, 1], [2, -1]],
        [0, 1, 2, 3, 6, 7, 8],
        4,
        4,
    )
    assert s1.num_tokens == 7
    assert s1.rows == (StepRow(a, 4, 4, (0, 1)), StepRow(c, 3, 3, (2,)))
    assert s1.metadata.causal is True

    # Step 2: decode a (stays inside page 1), extend c by 2 (needs a new page).
    s2 = b.step([(a, 1), (c, 2)])
    check_step(s2, b)
    assert as_lists(s2.metadata) == (
        [0, 1, 3],
        [5, 5],
        [[0, 1], [2, 3]],
        [4, 9, 10],
        2,
        5,
    )

    # Step 3: mixed: decode a and c, prefill a new sequence d with 7 tokens.
    d = b.admit()
    s3 = b.step([(a, 1), (c, 1), (d, 7)])
    check_step(s3, b)
    assert as_lists(s3.metadata) == (
        [0, 1, 2, 9],
        [6, 6, 7],
        [[0, 1, -1], [2, 3, -1], [4, 5, 6]],
        [5, 11, 12, 13, 14, 15, 16, 17, 18],
        7,
        7,
    )

    # Step 4: a crosses a page boundary on decode and takes the next free page.
    s4 = b.step([(a, 1)])
    check_step(s4, b)
    assert as_lists(s4.metadata) == ([0, 1], [7], [[0, 1, 7]], [21], 1, 7)
    assert pool.num_free(0) == 12 - 8


def test_metadata_dtypes_and_shapes():
    b = BatchBuilder(PagePool(8), 0, page_size=2)
    s = b.admit()
    md = b.step([(s, 3)], causal=False).metadata
    assert md.query_start_loc.dtype == torch.int32
    assert md.seq_lens.dtype == torch.int32
    assert md.block_table.dtype == torch.int32
    assert md.slot_mapping.dtype == torch.int64
    assert md.block_table.shape == (1, 2)
    assert md.causal is False
    assert isinstance(md.max_query_len, int)
    assert isinstance(md.max_seq_len, int)
    assert md.num_seqs == 1
    assert md.num_tokens == 3
    assert md.query_lens.tolist() == [3]


@pytest.mark.parametrize("page_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("length", [1, 2, 3, 4, 7, 8, 9, 16, 17])
def test_prefill_allocates_ceil_pages(page_size, length):
    pool = PagePool(64)
    b = BatchBuilder(pool, 0, page_size)
    s = b.admit()
    step = b.step([(s, length)])
    check_step(step, b)
    want = math.ceil(length / page_size)
    assert len(b.sequences[s].pages) == want
    assert pool.num_free(0) == 64 - want
    assert step.metadata.block_table.shape == (1, want)
    assert step.metadata.slot_mapping.tolist() == list(range(length))


@pytest.mark.parametrize("page_size", [1, 2, 3, 4])
def test_decode_one_token_at_a_time_allocates_on_boundaries(page_size):
    pool = PagePool(32)
    b = BatchBuilder(pool, 0, page_size)
    s = b.admit()
    for length in range(1, 13):
        step = b.step([(s, 1)])
        check_step(step, b)
        assert step.metadata.seq_lens.tolist() == [length]
        assert len(b.sequences[s].pages) == math.ceil(length / page_size)
        pages = b.sequences[s].pages
        pos = length - 1
        assert step.metadata.slot_mapping.tolist() == [
            pages[pos // page_size] * page_size + pos % page_size
        ]


@pytest.mark.parametrize("chunks", [[5, 5, 5], [1, 4, 2, 8], [3, 3, 3, 3], [7, 1, 1]])
def test_chunked_prefill_slots_follow_positions(chunks):
    page_size = 3
    pool = PagePool(16, shuffle_seed=5)  # non-monotone pages
    b = BatchBuilder(pool, 0, page_size)
    s = b.admit()
    length = 0
    for q in chunks:
        step = b.step([(s, q)])
        checked = check_step(step, b)
        length += q
        pages = b.sequences[s].pages
        assert checked.seq_lens == [length]
        assert checked.query_lens == [q]
        assert step.metadata.slot_mapping.tolist() == [
            pages[p // page_size] * page_size + p % page_size for p in range(length - q, length)
        ]
        assert checked.pages == [pages]


@pytest.mark.parametrize("dp_size", [1, 2, 3, 4])
def test_every_rank_uses_only_its_own_pages(dp_size):
    total = 4 * 10 + 1
    page_size = 2
    pool = PagePool(total, dp_size, shuffle_seed=3)
    builders = [BatchBuilder(pool, r, page_size) for r in range(dp_size)]
    for rank, b in enumerate(builders):
        own = dp_page_range(total, dp_size, rank)
        x, y = b.admit(), b.admit()
        for requests in ([(x, 3), (y, 1)], [(x, 1), (y, 4)], [(x, 2)], [(y, 1), (x, 1)]):
            step = b.step(requests)
            check_step(step, b)
            used = [p for row in step.metadata.block_table.tolist() for p in row if p != -1]
            assert used
            assert all(p in own for p in used)
            assert all(s // page_size in own for s in step.metadata.slot_mapping.tolist())
    # Each rank's pages went to its own builder; ranks are independent.
    for rank, b in enumerate(builders):
        held = {p for s in b.sequences.values() for p in s.pages}
        own = dp_page_range(total, dp_size, rank)
        assert held <= set(own)
        assert pool.num_free(rank) + len(held) == len(own)


def test_builder_of_one_rank_fails_ownership_check_of_another():
    pool = PagePool(8, 2)
    b = BatchBuilder(pool, 1, 2)
    s = b.admit()
    checked = validate_metadata(b.step([(s, 3)]).metadata, page_size=2, total_pages=8)
    check_rank_ownership(checked, page_size=2, page_range=pool.rank_range(1))
    with pytest.raises(ValueError, match="outside this rank"):
        check_rank_ownership(checked, page_size=2, page_range=pool.rank_range(0))


def test_release_frees_pages():
    pool = PagePool(10)
    b = BatchBuilder(pool, 0, 2)
    x, y = b.admit(), b.admit()
    b.step([(x, 5), (y, 2)])
    assert pool.num_free(0) == 10 - 3 - 1
    pages_x = list(b.sequences[x].pages)
    b.release(x)
    assert x not in b.sequences
    assert pool.num_free(0) == 10 - 1
    assert all(pool.refcount(p) == 0 for p in pages_x)
    b.release(y)
    assert pool.num_free(0) == 10
    with pytest.raises(KeyError):
        b.release(y)
    # Released sequences cannot step; their ids are never reused.
    with pytest.raises(KeyError):
        b.step([(x, 1)])
    assert b.admit() == 2


@pytest.mark.parametrize(
    ("parent_len", "prefix_len", "shared"),
    [(7, 7, 2), (7, 6, 2), (7, 5, 1), (7, 2, 0), (7, 0, 0), (6, 6, 2), (9, 9, 3)],
)
def test_fork_shares_only_full_prefix_pages(parent_len, prefix_len, shared):
    page_size = 3
    pool = PagePool(20)
    b = BatchBuilder(pool, 0, page_size)
    parent = b.admit()
    b.step([(parent, parent_len)])
    parent_pages = list(b.sequences[parent].pages)
    free_before = pool.num_free(0)

    child = b.fork(parent, prefix_len)
    state = b.sequences[child]
    assert state.pages == parent_pages[:shared]
    assert state.cached_len == shared * page_size
    assert pool.num_free(0) == free_before  # sharing allocates nothing
    for i, page in enumerate(parent_pages):
        assert pool.refcount(page) == (2 if i < shared else 1)

    # The child's new tokens go to fresh pages only.
    step = b.step([(child, 4), (parent, 1)])
    check_step(step, b)
    child_slots = step.metadata.slot_mapping.tolist()[:4]
    child_new_pages = {s // page_size for s in child_slots}
    assert child_new_pages.isdisjoint(parent_pages)
    assert b.sequences[child].pages[:shared] == parent_pages[:shared]
    # Parent's decode never lands on a shared page either (they are full).
    parent_slot = step.metadata.slot_mapping.tolist()[4]
    assert parent_slot // page_size not in parent_pages[:shared]
    assert set(b.sequences[child].pages[shared:]).isdisjoint(b.sequences[parent].pages)

    # Release both: every page returns to the pool exactly once.
    b.release(parent)
    for page in parent_pages[:shared]:
        assert pool.refcount(page) == 1
    b.release(child)
    assert pool.num_free(0) == 20
    assert all(pool.refcount(p) == 0 for p in range(20))


@pytest.mark.parametrize("prefix_len", [-1, 8, 100])
def test_fork_rejects_prefix_outside_cached(prefix_len):
    pool = PagePool(8)
    b = BatchBuilder(pool, 0, 2)
    s = b.admit()
    b.step([(s, 7)])
    before = builder_state(b), pool_state(pool)
    with pytest.raises(ValueError, match="prefix_len"):
        b.fork(s, prefix_len)
    assert (builder_state(b), pool_state(pool)) == before


@pytest.mark.parametrize("pad_query_len", [0, 1, 3])
def test_pad_to_appends_graph_mode_rows(pad_query_len):
    pool = PagePool(10)
    b = BatchBuilder(pool, 0, 2)
    x, y = b.admit(), b.admit()
    step = b.step([(x, 3), (y, 1)], pad_to=4, pad_query_len=pad_query_len)
    md = step.metadata
    assert md.seq_lens.tolist() == [3, 1, 0, 0]
    assert md.block_table.tolist() == [[0, 1], [2, -1], [-1, -1], [-1, -1]]
    assert md.query_start_loc.tolist() == [0, 3, 4, 4 + pad_query_len, 4 + 2 * pad_query_len]
    assert md.slot_mapping.tolist() == [0, 1, 2, 4] + [-1] * (2 * pad_query_len)
    assert md.max_query_len == 3
    assert md.max_seq_len == 3
    assert [row.seq_id for row in step.rows] == [x, y, None, None]
    assert step.num_tokens == 4 + 2 * pad_query_len
    checked = check_step(step, b, graph_mode=True)
    assert checked.real_rows == [0, 1]
    assert checked.pages == [[0, 1], [2], [], []]
    # Padding allocates nothing.
    assert pool.num_free(0) == 10 - 3
    if pad_query_len:
        with pytest.raises(MetadataError) as info:
            validate_metadata(md, page_size=2, total_pages=10, graph_mode=False)
        assert info.value.field == "seq_lens"
        assert "graph_mode" in str(info.value)


def test_pad_to_equal_to_batch_adds_nothing():
    b = BatchBuilder(PagePool(4), 0, 2)
    s = b.admit()
    step = b.step([(s, 2)], pad_to=1)
    assert step.metadata.seq_lens.tolist() == [2]
    check_step(step, b)


def test_pad_query_len_can_exceed_real_rows():
    b = BatchBuilder(PagePool(4), 0, 2)
    s = b.admit()
    step = b.step([(s, 1)], pad_to=2, pad_query_len=5)
    assert step.metadata.max_query_len == 5
    assert step.metadata.max_seq_len == 1
    check_step(step, b, graph_mode=True)


def test_only_padding_rows():
    b = BatchBuilder(PagePool(4), 0, 2)
    step = b.step([], pad_to=3)
    md = step.metadata
    assert md.seq_lens.tolist() == [0, 0, 0]
    assert md.block_table.shape == (3, 0)
    assert md.slot_mapping.tolist() == [-1, -1, -1]
    check_step(step, b, graph_mode=True)


def test_empty_step():
    b = BatchBuilder(PagePool(4), 0, 2)
    md = b.step([]).metadata
    assert md.seq_lens.shape == (0,)
    assert md.query_start_loc.tolist() == [0]
    assert md.block_table.shape == (0, 0)
    assert md.max_query_len == md.max_seq_len == 0
    check_step(b.step([]), b)


@pytest.mark.parametrize(
    "requests",
    [
        [("x", 5)],  # the lone request does not fit
        [("y", 1), ("x", 5)],  # the first fits, the second does not
        [("x", 2), ("y", 3), ("new", 1)],  # together they do not fit
    ],
)
def test_out_of_pages_leaves_builder_and_pool_unchanged(requests):
    pool = PagePool(6, 2)  # 3 pages per rank
    b = BatchBuilder(pool, 1, 2)
    ids = {"x": b.admit(), "y": b.admit(), "new": b.admit()}
    b.step([(ids["x"], 1), (ids["y"], 2)])  # 2 pages in use, 1 free
    before = builder_state(b), pool_state(pool)
    with pytest.raises(OutOfPages):
        b.step([(ids[name], q) for name, q in requests])
    assert (builder_state(b), pool_state(pool)) == before
    # The builder still works afterwards.
    check_step(b.step([(ids["x"], 1)]), b)


@pytest.mark.parametrize("query_len", [0, -1, -5])
def test_step_rejects_non_positive_query_len(query_len):
    pool = PagePool(8)
    b = BatchBuilder(pool, 0, 2)
    x, y = b.admit(), b.admit()
    before = builder_state(b), pool_state(pool)
    with pytest.raises(ValueError, match="query_len"):
        b.step([(x, 2), (y, query_len)])
    assert (builder_state(b), pool_state(pool)) == before


def test_step_rejects_duplicate_sequence():
    pool = PagePool(8)
    b = BatchBuilder(pool, 0, 2)
    x = b.admit()
    before = builder_state(b), pool_state(pool)
    with pytest.raises(ValueError, match="twice"):
        b.step([(x, 1), (x, 2)])
    assert (builder_state(b), pool_state(pool)) == before


@pytest.mark.parametrize("pad_to", [0, 1])
def test_step_rejects_pad_to_smaller_than_batch(pad_to):
    b = BatchBuilder(PagePool(8), 0, 2)
    x, y = b.admit(), b.admit()
    with pytest.raises(ValueError, match="pad_to"):
        b.step([(x, 1), (y, 1)], pad_to=pad_to)


def test_rejected_pad_to_leaves_builder_and_pool_unchanged():
    pool = PagePool(8)
    b = BatchBuilder(pool, 0, 2)
    x, y = b.admit(), b.admit()
    before = builder_state(b), pool_state(pool)
    with pytest.raises(ValueError, match="pad_to"):
        b.step([(x, 3), (y, 1)], pad_to=1)
    assert (builder_state(b), pool_state(pool)) == before


@pytest.mark.parametrize("page_size", [0, -1])
def test_builder_rejects_bad_page_size(page_size):
    with pytest.raises(ValueError, match="page_size"):
        BatchBuilder(PagePool(4), 0, page_size)


@pytest.mark.parametrize("rank", [-1, 2])
def test_builder_rejects_bad_rank(rank):
    with pytest.raises(ValueError, match="rank"):
        BatchBuilder(PagePool(4, 2), rank, 2)


def test_build_metadata_device_argument():
    rows = [StepRow(0, 3, 2, (5, 1))]
    md = build_metadata(rows, 2, device="cpu")
    assert md.slot_mapping.tolist() == [11, 2]
    assert all(
        t.device == torch.device("cpu")
        for t in (md.query_start_loc, md.seq_lens, md.block_table, md.slot_mapping)
    )


# --------------------------------------------------------------------------- #
# Random admit / step / fork / release
# --------------------------------------------------------------------------- #


class BuilderMachine(RuleBasedStateMachine):
    """Drive one rank's builder at random; check every step and the page books."""

    @initialize(
        dp_size=st.integers(1, 4),
        rank_seed=st.integers(0, 3),
        page_size=st.integers(1, 4),
        shuffle=st.none() | st.integers(0, 100),
        pages_per_rank=st.integers(2, 12),
    )
    def setup(self, dp_size, rank_seed, page_size, shuffle, pages_per_rank):
        total = dp_size * pages_per_rank + rank_seed % dp_size
        self.pool = PagePool(total, dp_size, shuffle_seed=shuffle)
        self.rank = rank_seed % dp_size
        self.builder = BatchBuilder(self.pool, self.rank, page_size)
        self.own = dp_page_range(total, dp_size, self.rank)
        self.lengths: dict[int, int] = {}  # the model: cached length per sequence

    @rule()
    def admit(self):
        self.lengths[self.builder.admit()] = 0

    @precondition(lambda self: self.lengths)
    @rule(data=st.data(), pad=st.integers(0, 2), pad_q=st.integers(0, 2))
    def step(self, data, pad, pad_q):
        ids = sorted(self.lengths)
        chosen = data.draw(st.lists(st.sampled_from(ids), unique=True, min_size=1))
        requests = [(sid, data.draw(st.integers(1, 6))) for sid in chosen]
        pad_to = len(requests) + pad if pad else None
        before = builder_state(self.builder), pool_state(self.pool)
        try:
            step = self.builder.step(requests, pad_to=pad_to, pad_query_len=pad_q)
        except OutOfPages:
            assert (builder_state(self.builder), pool_state(self.pool)) == before
            return
        for sid, q in requests:
            self.lengths[sid] += q
        checked = check_step(step, self.builder, graph_mode=pad_to is not None)
        expected_lens = [self.lengths[sid] for sid, _ in requests] + [0] * (pad or 0)
        assert checked.seq_lens == expected_lens
        assert checked.query_lens == [q for _, q in requests] + [pad_q] * (pad or 0)
        for row, (sid, _) in enumerate(requests):
            assert checked.pages[row] == self.builder.sequences[sid].pages

    @precondition(lambda self: any(n > 0 for n in self.lengths.values()))
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(sorted(s for s, n in self.lengths.items() if n)))
        prefix = data.draw(st.integers(0, self.lengths[parent]))
        child = self.builder.fork(parent, prefix)
        ps = self.builder.page_size
        self.lengths[child] = prefix // ps * ps
        assert (
            self.builder.sequences[child].pages
            == (self.builder.sequences[parent].pages[: prefix // ps])
        )

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def release(self, data):
        sid = data.draw(st.sampled_from(sorted(self.lengths)))
        self.builder.release(sid)
        del self.lengths[sid]

    @invariant()
    def books_balance(self):
        if not hasattr(self, "builder"):
            return
        holders: dict[int, int] = {}
        for sid, state in self.builder.sequences.items():
            assert state.cached_len == self.lengths[sid]
            ps = self.builder.page_size
            assert len(state.pages) == -(-state.cached_len // ps)
            assert len(set(state.pages)) == len(state.pages)
            for page in state.pages:
                assert page in self.own
                holders[page] = holders.get(page, 0) + 1
        assert self.pool.num_free(self.rank) + len(holders) == len(self.own)
        for page in self.own:
            assert self.pool.refcount(page) == holders.get(page, 0)
        for other in range(self.pool.dp_size):
            if other != self.rank:
                assert self.pool.num_free(other) == len(self.pool.rank_range(other))


BuilderMachine.TestCase.settings = settings(
    max_examples=120,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_builder_state_machine = BuilderMachine.TestCase


def test_builder_state_helper_snapshots():
    # Guard for the helper the tests rely on: it must snapshot, not alias.
    b = BatchBuilder(PagePool(4), 0, 2)
    s = b.admit()
    snap = builder_state(b)
    b.step([(s, 3)])
    assert builder_state(b) != snap
