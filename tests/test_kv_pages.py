"""Unit tests for harness.core.kv_pages: DP partition, page allocator, cache helpers."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.conformance.properties import bits
from harness.core.errors import OutOfPages
from harness.core.kv_pages import (
    PagePool,
    PoolLayout,
    dp_page_range,
    flat_tokens,
    local_slots,
    make_layer_caches,
    put_rows,
    read_tokens,
    take_rows,
    token_slots,
    write_tokens,
)

# --------------------------------------------------------------------------- #
# dp_page_range
# --------------------------------------------------------------------------- #


def brute_force_partition(total: int, dp_size: int) -> list[range]:
    """Deal pages one at a time round-robin, then lay ranks out contiguously.

    Independent of the divmod formula: the first ``total % dp_size`` ranks get
    one more page because the deal wraps around onto them first.
    """
    counts = [0] * dp_size
    for i in range(total):
        counts[i % dp_size] += 1
    ranges, start = [], 0
    for count in counts:
        ranges.append(range(start, start + count))
        start += count
    return ranges


@pytest.mark.parametrize("dp_size", range(1, 9))
def test_dp_page_range_matches_brute_force(dp_size):
    for total in range(1, 65):
        if total < dp_size:
            with pytest.raises(ValueError, match="total_pages"):
                dp_page_range(total, dp_size, 0)
            continue
        expected = brute_force_partition(total, dp_size)
        got = [dp_page_range(total, dp_size, r) for r in range(dp_size)]
        assert got == expected, (total, dp_size)


@pytest.mark.parametrize("dp_size", range(1, 9))
def test_dp_page_range_partition_invariants(dp_size):
    for total in range(dp_size, 65):
        ranges = [dp_page_range(total, dp_size, r) for r in range(dp_size)]
        assert all(r.step == 1 for r in ranges)
        # Disjoint and covering [0, total), in rank order, contiguous.
        flat = [p for r in ranges for p in r]
        assert flat == list(range(total))
        for a, b in itertools.pairwise(ranges):
            assert a.stop == b.start
        sizes = [len(r) for r in ranges]
        assert min(sizes) >= 1
        assert max(sizes) - min(sizes) <= 1
        # Larger ranks first: sizes never increase with the rank.
        assert sizes == sorted(sizes, reverse=True)
        base, extra = divmod(total, dp_size)
        assert sizes == [base + (r < extra) for r in range(dp_size)]


@pytest.mark.parametrize("total", [1, 2, 7, 64, 1000])
def test_dp_page_range_single_rank_is_whole_pool(total):
    assert dp_page_range(total, 1, 0) == range(total)


def test_dp_page_range_known_example():
    # 10 pages over 4 ranks: 3, 3, 2, 2.
    assert [dp_page_range(10, 4, r) for r in range(4)] == [
        range(0, 3),
        range(3, 6),
        range(6, 8),
        range(8, 10),
    ]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((8, 0, 0), "dp_size"),
        ((8, -1, 0), "dp_size"),
        ((8, 2, -1), "dp_rank"),
        ((8, 2, 2), "dp_rank"),
        ((8, 2, 5), "dp_rank"),
        ((3, 4, 0), "total_pages"),
        ((0, 1, 0), "total_pages"),
        ((8.0, 2, 0), "total_pages"),
        ((True, 1, 0), "total_pages"),
        ((8, 2.0, 0), "dp_size"),
        ((8, True, 0), "dp_size"),
        ((8, 2, 0.0), "dp_rank"),
        ((8, 2, False), "dp_rank"),
        (("8", 2, 0), "total_pages"),
        ((8, None, 0), "dp_size"),
    ],
)
def test_dp_page_range_rejects_bad_args_naming_field(args, field):
    with pytest.raises(ValueError, match=field):
        dp_page_range(*args)


# --------------------------------------------------------------------------- #
# PagePool
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("dp_size", [1, 2, 3, 4])
def test_pool_allocates_only_from_rank_range(dp_size):
    total = 23
    pool = PagePool(total, dp_size)
    for rank in range(dp_size):
        own = dp_page_range(total, dp_size, rank)
        assert pool.rank_range(rank) == own
        assert pool.num_free(rank) == len(own)
        pages = pool.allocate(rank, len(own))
        assert sorted(pages) == list(own)
        assert pool.num_free(rank) == 0
        with pytest.raises(OutOfPages):
            pool.allocate(rank, 1)
    # Every rank exhausted independently; nothing left anywhere.
    assert all(pool.num_free(r) == 0 for r in range(dp_size))


def test_pool_hands_out_pages_in_order_without_shuffle():
    pool = PagePool(10, 2)
    assert pool.allocate(1, 3) == [5, 6, 7]
    assert pool.allocate(0, 2) == [0, 1]


def test_pool_allocate_zero_is_noop():
    pool = PagePool(4)
    assert pool.allocate(0, 0) == []
    assert pool.num_free(0) == 4


def test_pool_allocate_negative_count_raises():
    pool = PagePool(4)
    with pytest.raises(ValueError, match="count"):
        pool.allocate(0, -1)
    assert pool.num_free(0) == 4


def test_pool_out_of_pages_is_all_or_nothing():
    pool = PagePool(12, 2)  # 6 pages per rank
    held = pool.allocate(0, 4)
    before_free = [pool.num_free(r) for r in range(2)]
    before_refs = {p: pool.refcount(p) for p in range(12)}
    with pytest.raises(OutOfPages, match="rank 0"):
        pool.allocate(0, 3)
    assert [pool.num_free(r) for r in range(2)] == before_free
    assert {p: pool.refcount(p) for p in range(12)} == before_refs
    # The pages still free are exactly the ones not held, and can be taken.
    rest = pool.allocate(0, 2)
    assert sorted(held + rest) == list(range(6))
    # The other rank's pages are never borrowed.
    assert pool.num_free(1) == 6


def test_out_of_pages_is_not_a_value_error():
    # It is a capacity condition, not bad input (errors.py).
    assert issubclass(OutOfPages, RuntimeError)
    assert not issubclass(OutOfPages, ValueError)


def test_pool_free_returns_pages():
    pool = PagePool(8, 2)
    pages = pool.allocate(1, 4)
    assert all(pool.refcount(p) == 1 for p in pages)
    pool.free(pages[:2])
    assert pool.num_free(1) == 2
    assert [pool.refcount(p) for p in pages] == [0, 0, 1, 1]
    again = pool.allocate(1, 2)
    assert sorted(again) == sorted(pages[:2])
    pool.free(pages[2:] + again)
    assert pool.num_free(1) == 4
    assert all(pool.refcount(p) == 0 for p in range(8))


def test_pool_double_free_raises():
    pool = PagePool(4)
    (page,) = pool.allocate(0, 1)
    pool.free([page])
    with pytest.raises(ValueError, match=f"page {page}"):
        pool.free([page])
    assert pool.num_free(0) == 4


@pytest.mark.parametrize("page", [0, 3, 99, -1])
def test_pool_free_unallocated_page_raises(page):
    pool = PagePool(4)
    with pytest.raises(ValueError, match="not allocated"):
        pool.free([page])
    assert pool.num_free(0) == 4


def test_pool_retain_unallocated_page_raises():
    pool = PagePool(4)
    with pytest.raises(ValueError, match="not allocated"):
        pool.retain([2])


def test_pool_refcount_frees_only_on_last_holder():
    pool = PagePool(6)
    pages = pool.allocate(0, 2)
    pool.retain(pages)
    pool.retain(pages[:1])
    assert [pool.refcount(p) for p in pages] == [3, 2]
    assert pool.num_free(0) == 4
    pool.free(pages)
    assert [pool.refcount(p) for p in pages] == [2, 1]
    assert pool.num_free(0) == 4
    pool.free(pages)
    assert [pool.refcount(p) for p in pages] == [1, 0]
    assert pool.num_free(0) == 5
    pool.free(pages[:1])
    assert pool.refcount(pages[0]) == 0
    assert pool.num_free(0) == 6
    with pytest.raises(ValueError, match="not allocated"):
        pool.free(pages[:1])


@pytest.mark.parametrize("dp_size", [1, 2, 3])
def test_pool_shuffle_is_deterministic_and_stays_in_range(dp_size):
    total = 40
    plain = PagePool(total, dp_size)
    a = PagePool(total, dp_size, shuffle_seed=7)
    b = PagePool(total, dp_size, shuffle_seed=7)
    c = PagePool(total, dp_size, shuffle_seed=8)
    for rank in range(dp_size):
        n = plain.num_free(rank)
        in_order = plain.allocate(rank, n)
        order_a = a.allocate(rank, n)
        order_b = b.allocate(rank, n)
        order_c = c.allocate(rank, n)
        own = list(dp_page_range(total, dp_size, rank))
        assert in_order == own
        assert sorted(order_a) == own
        assert sorted(order_c) == own
        assert order_a == order_b
        assert order_a != in_order
        assert order_a != order_c


@pytest.mark.parametrize("dp_size", [1, 3, 4])
def test_pool_owner(dp_size):
    total = 17
    pool = PagePool(total, dp_size)
    for page in range(total):
        rank = pool.owner(page)
        assert page in dp_page_range(total, dp_size, rank)


@pytest.mark.parametrize("page", [-1, 17, 100])
def test_pool_owner_outside_pool_raises(page):
    with pytest.raises(ValueError, match=str(page)):
        PagePool(17, 3).owner(page)


@pytest.mark.parametrize("rank", [-1, 2, 5])
@pytest.mark.parametrize("method", ["rank_range", "num_free", "allocate"])
def test_pool_bad_rank_raises(rank, method):
    pool = PagePool(8, 2)
    args = (rank, 1) if method == "allocate" else (rank,)
    with pytest.raises(ValueError, match="rank"):
        getattr(pool, method)(*args)
    assert pool.num_free(0) == pool.num_free(1) == 4


def test_pool_constructor_rejects_too_few_pages():
    with pytest.raises(ValueError, match="total_pages"):
        PagePool(2, 4)
    with pytest.raises(ValueError, match="total_pages"):
        PagePool(0)


@pytest.mark.parametrize("dp_size", [0, -1])
def test_pool_constructor_rejects_non_positive_dp_size(dp_size):
    with pytest.raises(ValueError, match="dp_size"):
        PagePool(8, dp_size)


@settings(max_examples=60, deadline=None)
@given(
    dp_size=st.integers(1, 4),
    extra=st.integers(0, 20),
    seed=st.none() | st.integers(0, 1000),
    ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6), st.booleans()), max_size=30),
)
def test_pool_conserves_pages(dp_size, extra, seed, ops):
    total = dp_size + extra
    pool = PagePool(total, dp_size, shuffle_seed=seed)
    held: list[list[int]] = [[] for _ in range(dp_size)]  # one entry per holder
    for rank, count, release in ops:
        rank %= dp_size
        if release and held[rank]:
            pool.free([held[rank].pop()])
        else:
            free_before = pool.num_free(rank)
            try:
                pages = pool.allocate(rank, count)
            except OutOfPages:
                assert count > free_before
                assert pool.num_free(rank) == free_before
                continue
            assert all(p in pool.rank_range(rank) for p in pages)
            held[rank].extend(pages)
        for r in range(dp_size):
            assert len(set(held[r])) == len(held[r])
            assert pool.num_free(r) + len(held[r]) == len(pool.rank_range(r))


# --------------------------------------------------------------------------- #
# make_layer_caches and the slot helpers
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_make_layer_caches_shared_layout(dtype):
    caches = make_layer_caches(
        num_layers=3,
        total_pages=10,
        page_size=4,
        num_kv_heads=2,
        head_dim=8,
        dtype=dtype,
        layout=PoolLayout.SHARED,
        dp_size=3,
        dp_rank=2,
    )
    assert len(caches) == 3
    for cache in caches:
        for tensor in (cache.key, cache.value):
            assert tensor.shape == (10, 4, 2, 8)
            assert tensor.dtype == dtype
            assert tensor.device == torch.device("cpu")
            assert torch.isnan(tensor).all()
            assert tensor.is_contiguous()
        assert cache.page_offset == 0
        assert cache.total_pages == 10
        assert cache.global_total_pages == 10
        assert cache.held_pages == range(10)
        assert (cache.num_pages, cache.page_size, cache.num_kv_heads, cache.head_dim) == (
            10,
            4,
            2,
            8,
        )
    # Every layer owns its own storage.
    ptrs = {t.data_ptr() for c in caches for t in (c.key, c.value)}
    assert len(ptrs) == 6


@pytest.mark.parametrize(("dp_size", "dp_rank"), [(1, 0), (3, 0), (3, 1), (3, 2), (4, 3)])
def test_make_layer_caches_per_rank_layout(dp_size, dp_rank):
    total = 10
    caches = make_layer_caches(
        num_layers=2,
        total_pages=total,
        page_size=3,
        num_kv_heads=1,
        head_dim=4,
        layout=PoolLayout.PER_RANK,
        dp_size=dp_size,
        dp_rank=dp_rank,
    )
    own = dp_page_range(total, dp_size, dp_rank)
    for cache in caches:
        assert cache.key.shape == (len(own), 3, 1, 4)
        assert cache.value.shape == (len(own), 3, 1, 4)
        assert cache.page_offset == own.start
        assert cache.total_pages == total
        assert cache.held_pages == own
        assert cache.key.dtype == torch.float32
        assert torch.isnan(cache.key).all()
        assert torch.isnan(cache.value).all()


def test_make_layer_caches_custom_fill():
    (cache,) = make_layer_caches(
        num_layers=1, total_pages=2, page_size=2, num_kv_heads=1, head_dim=2, fill=0.5
    )
    assert torch.equal(cache.key, torch.full((2, 2, 1, 2), 0.5))
    assert torch.equal(cache.value, torch.full((2, 2, 1, 2), 0.5))


def test_make_layer_caches_per_rank_rejects_bad_rank():
    with pytest.raises(ValueError, match="dp_rank"):
        make_layer_caches(
            num_layers=1,
            total_pages=4,
            page_size=2,
            num_kv_heads=1,
            head_dim=2,
            layout=PoolLayout.PER_RANK,
            dp_size=2,
            dp_rank=2,
        )


@pytest.mark.parametrize("page_size", [1, 2, 3, 5, 16])
def test_token_slots_formula(page_size):
    pages = [7, 2, 11, 0]
    positions = range(len(pages) * page_size)
    slots = token_slots(pages, positions, page_size)
    expected = [pages[t // page_size] * page_size + t % page_size for t in positions]
    assert slots == expected
    # Brute force: walk the pages in order, slot by slot.
    walked = [page * page_size + i for page in pages for i in range(page_size)]
    assert slots == walked
    assert len(set(slots)) == len(slots)


def test_token_slots_subset_of_positions():
    # page_size 3 on pages [4, 9]: position 5 -> page 9 offset 2, 3 -> page 9
    # offset 0, 0 -> page 4 offset 0.
    assert token_slots([4, 9], [5, 3, 0], page_size=3) == [29, 27, 12]


def test_token_slots_beyond_pages_raises():
    with pytest.raises(IndexError):
        token_slots([1], [2], page_size=2)


def _per_rank_cache(total=10, dp_size=3, dp_rank=1, page_size=3, heads=2, dim=4, combined=False):
    (cache,) = make_layer_caches(
        num_layers=1,
        total_pages=total,
        page_size=page_size,
        num_kv_heads=heads,
        head_dim=dim,
        layout=PoolLayout.PER_RANK,
        dp_size=dp_size,
        dp_rank=dp_rank,
        combined_kv=combined,
    )
    return cache


def test_local_slots_and_flat_tokens():
    cache = _per_rank_cache()  # rank 1 of 3 over 10 pages: pages 4..6
    assert cache.page_offset == 4
    slots = torch.tensor([12, 13, 20], dtype=torch.long)
    assert local_slots(cache, slots).tolist() == [0, 1, 8]
    flat = flat_tokens(cache.key)
    assert flat.shape == (9, 2, 4)
    assert flat.data_ptr() == cache.key.data_ptr()


def test_write_then_read_round_trip_per_rank_nonzero_offset():
    cache = _per_rank_cache()
    page_size = cache.page_size
    assert cache.page_offset == 4
    pages = [6, 4]  # global ids, deliberately not in order
    length = 5  # ends mid-page
    slots = torch.tensor(token_slots(pages, range(length), page_size), dtype=torch.long)
    gen = torch.Generator().manual_seed(0)
    key = torch.randn(length, 2, 4, generator=gen)
    value = torch.randn(length, 2, 4, generator=gen)
    write_tokens(cache, slots, key, value)
    got_k, got_v = read_tokens(cache, pages, length)
    assert torch.equal(got_k, key)
    assert torch.equal(got_v, value)
    # Physical placement: global page 6 is local page 2, page 4 is local 0.
    assert torch.equal(cache.key[2], key[:3])
    assert torch.equal(cache.key[0, :2], key[3:5])
    assert torch.equal(cache.value[2], value[:3])


def test_write_tokens_touches_only_named_slots():
    cache = _per_rank_cache()
    before_k = cache.key.clone()
    before_v = cache.value.clone()
    slots = torch.tensor([13, 18, 20], dtype=torch.long)  # global; local rows 1, 6, 8
    key = torch.arange(3 * 2 * 4, dtype=torch.float32).reshape(3, 2, 4)
    value = -key
    write_tokens(cache, slots, key, value)
    local = [1, 6, 8]
    flat_k = flat_tokens(cache.key)
    flat_v = flat_tokens(cache.value)
    assert torch.equal(flat_k[local], key)
    assert torch.equal(flat_v[local], value)
    untouched = [i for i in range(flat_k.shape[0]) if i not in local]
    # NaN != NaN: compare the bit patterns of everything else.
    assert torch.equal(
        flat_k[untouched].view(torch.int32), flat_tokens(before_k)[untouched].view(torch.int32)
    )
    assert torch.equal(
        flat_v[untouched].view(torch.int32), flat_tokens(before_v)[untouched].view(torch.int32)
    )
    assert torch.isnan(flat_k[untouched]).all()


def test_write_tokens_casts_to_cache_dtype():
    (cache,) = make_layer_caches(
        num_layers=1,
        total_pages=2,
        page_size=2,
        num_kv_heads=1,
        head_dim=2,
        dtype=torch.float16,
    )
    key = torch.tensor([[[1.5, 2.0]]], dtype=torch.float64)
    write_tokens(cache, torch.tensor([3]), key, key * 2)
    assert cache.key.dtype == torch.float16
    assert cache.key[1, 1, 0].tolist() == [1.5, 2.0]
    assert cache.value[1, 1, 0].tolist() == [3.0, 4.0]


@pytest.mark.parametrize("combined", [False, True])
@pytest.mark.parametrize("slot", [21, 11, 0])
def test_write_tokens_rejects_slot_outside_cache(combined, slot):
    cache = _per_rank_cache(combined=combined)  # holds global pages 4..6 -> slots 12..20
    before = (bits(cache.key), bits(cache.value))
    key = torch.zeros(1, 2, 4)
    with pytest.raises((IndexError, RuntimeError)):  # below the offset too: no wrap-around
        write_tokens(cache, torch.tensor([slot]), key, key)
    assert torch.equal(bits(cache.key), before[0])
    assert torch.equal(bits(cache.value), before[1])


# --------------------------------------------------------------------------- #
# combined K/V caches: the halves of one [pages, 2, page_size, KV, D] tensor
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("layout", list(PoolLayout))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_make_layer_caches_combined_kv(layout, dtype):
    args = dict(
        num_layers=3,
        total_pages=10,
        page_size=4,
        num_kv_heads=2,
        head_dim=8,
        dtype=dtype,
        layout=layout,
        dp_size=3,
        dp_rank=1,
    )
    plain = make_layer_caches(**args)
    caches = make_layer_caches(**args, combined_kv=True)
    bases = set()
    for cache, other in zip(caches, plain, strict=True):
        held = other.num_pages
        combined = cache.key._base
        assert combined is cache.value._base
        assert combined.shape == (held, 2, 4, 2, 8)
        assert combined.dtype == dtype
        assert torch.isnan(combined).all()
        # the halves are views into the one tensor, not copies of it
        assert cache.key.data_ptr() == combined.data_ptr()
        assert cache.value.data_ptr() == combined[:, 1].data_ptr()
        storage = combined.untyped_storage().data_ptr()
        assert cache.key.untyped_storage().data_ptr() == storage
        assert cache.value.untyped_storage().data_ptr() == storage
        assert not cache.key.is_contiguous()
        assert not cache.value.is_contiguous()
        assert cache.key.shape == cache.value.shape == other.key.shape
        assert (cache.page_offset, cache.total_pages) == (other.page_offset, other.total_pages)
        bases.add(storage)
    assert len(bases) == 3  # every layer has a tensor of its own


def test_flat_tokens_refuses_a_combined_half():
    cache = _per_rank_cache(combined=True)
    with pytest.raises(ValueError, match=r"no \[slots, heads, dim\] view"):
        flat_tokens(cache.key)
    # a contiguous cache and any view whose pages are evenly spaced still flatten
    assert flat_tokens(_per_rank_cache().key).shape == (9, 2, 4)
    assert flat_tokens(torch.zeros(1, 2, 3, 4, 5)[:, 0]).shape == (3, 4, 5)


def test_combined_round_trip_writes_through_the_combined_tensor():
    cache = _per_rank_cache(combined=True)  # global pages 4..6 of 10, page_size 3
    combined = cache.key._base
    before = bits(combined)
    pages, length = [6, 4], 5  # not in order, ends mid-page
    slots = torch.tensor(token_slots(pages, range(length), 3), dtype=torch.long)
    gen = torch.Generator().manual_seed(0)
    key = torch.randn(length, 2, 4, generator=gen)
    value = torch.randn(length, 2, 4, generator=gen)
    write_tokens(cache, slots, key, value)
    got_k, got_v = read_tokens(cache, pages, length)
    assert torch.equal(got_k, key)
    assert torch.equal(got_v, value)
    # global page 6 is local page 2, page 4 is local 0; half 0 is K, half 1 is V
    assert torch.equal(combined[2, 0], key[:3])
    assert torch.equal(combined[0, 0, :2], key[3:])
    assert torch.equal(combined[2, 1], value[:3])
    assert torch.equal(combined[0, 1, :2], value[3:])
    changed = (bits(combined) != before).flatten(3).any(-1)  # [page, half, offset]
    expect = torch.zeros_like(changed)
    expect[2, :, :] = True
    expect[0, :, :2] = True
    assert torch.equal(changed, expect)


@settings(max_examples=40, deadline=None)
@given(
    page_size=st.integers(1, 6),
    pages=st.integers(1, 6),
    data=st.data(),
)
def test_put_and_take_rows_agree_on_combined_and_plain(page_size, pages, data):
    """Row ``r`` is ``page * page_size + offset`` in both layouts, and only it changes."""
    slots = pages * page_size
    rows = data.draw(st.lists(st.integers(0, slots - 1), min_size=1, max_size=slots, unique=True))
    index = torch.tensor(rows, dtype=torch.long)
    src = torch.randn(len(rows), 2, 3, generator=torch.Generator().manual_seed(len(rows)))
    plain = torch.full((pages, page_size, 2, 3), float("nan"))
    combined = torch.full((pages, 2, page_size, 2, 3), float("nan"))
    for tensor in (plain, combined[:, 1]):
        put_rows(tensor, index, src)
        assert torch.equal(take_rows(tensor, index), src)
    assert torch.equal(bits(combined[:, 1]), bits(plain))
    assert torch.isnan(combined[:, 0]).all()


@pytest.mark.parametrize("combined", [False, True])
@pytest.mark.parametrize("row", [-1, -9, 9])
def test_put_and_take_rows_refuse_rows_outside(combined, row):
    tensor = torch.zeros(3, 2, 3, 2, 4)[:, 0] if combined else torch.zeros(3, 3, 2, 4)
    index = torch.tensor([row])
    with pytest.raises((IndexError, RuntimeError)):
        put_rows(tensor, index, torch.ones(1, 2, 4))
    with pytest.raises((IndexError, RuntimeError)):
        take_rows(tensor, index)
    assert not tensor.any()


def test_nan_fill_is_nan_bits():
    cache = _per_rank_cache()
    bits = cache.key.view(torch.int32)
    # Every element is a NaN: exponent all ones, mantissa non-zero.
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    assert bool((exponent == 0xFF).all())
    assert bool((mantissa != 0).all())
    assert math.isnan(cache.key.flatten()[0].item())


def test_free_and_retain_are_all_or_nothing():
    pool = PagePool(8)
    held = pool.allocate(0, 3)
    with pytest.raises(ValueError, match="not allocated"):
        pool.free([held[0], 7])  # 7 was never allocated
    assert all(pool.refcount(p) == 1 for p in held)
    with pytest.raises(ValueError, match="not allocated"):
        pool.free([held[1], held[1]])  # one holder, freed twice
    assert pool.refcount(held[1]) == 1
    with pytest.raises(ValueError, match="not allocated"):
        pool.retain([held[2], 6])
    assert pool.refcount(held[2]) == 1
    assert pool.num_free(0) == 5


@pytest.mark.parametrize("rank", [True, 1.0, "0"])
def test_pool_rejects_non_int_rank(rank):
    with pytest.raises(ValueError, match="rank must be an int"):
        PagePool(8, 2).allocate(rank, 1)
