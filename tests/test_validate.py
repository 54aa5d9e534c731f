"""Unit tests for harness.core.validate: metadata, ownership, backend args, cache binding."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.core.batches import BatchBuilder
from harness.core.contract import AttentionMetadata, LayerCache
from harness.core.errors import CacheBindingError, ForeignPageError, MetadataError
from harness.core.kv_pages import PagePool, PoolLayout, make_layer_caches
from harness.core.validate import (
    CacheGeometry,
    CheckedMetadata,
    check_rank_is_bound,
    check_rank_ownership,
    read_metadata,
    validate_backend_args,
    validate_dp_config,
    validate_layer_caches,
    validate_metadata,
)

PAGE_SIZE = 2
TOTAL_PAGES = 16


def build_good(*, pad_to=None):
    """A mixed step: extend (a), prefill (b), prefill of one token (c).

    page_size 2, pages handed out in order from a 16-page pool::

        query_start_loc [0, 2, 6, 7]
        seq_lens        [5, 4, 1]
        block_table     [[0, 1, 2], [3, 4, -1], [5, -1, -1]]
        slot_mapping    [3, 4, 6, 7, 8, 9, 10]
        max_query_len 4, max_seq_len 5

    With ``pad_to=5`` two padding rows (seq_len 0, one token of slot -1) follow.
    """
    builder = BatchBuilder(PagePool(TOTAL_PAGES), 0, PAGE_SIZE)
    a = builder.admit()
    builder.step([(a, 3)])
    b, c = builder.admit(), builder.admit()
    return builder.step([(a, 2), (b, 4), (c, 1)], pad_to=pad_to).metadata


GOOD = build_good()
GOOD_PADDED = build_good(pad_to=5)


def validate(md, graph_mode=False, total_pages=TOTAL_PAGES):
    return validate_metadata(
        md, page_size=PAGE_SIZE, total_pages=total_pages, graph_mode=graph_mode
    )


def with_tensor(md, name, edit):
    """``md`` with field ``name`` replaced by an edited clone."""
    tensor = getattr(md, name).clone()
    result = edit(tensor)
    return dataclasses.replace(md, **{name: tensor if result is None else result})


def setitem(index, value):
    def edit(tensor):
        tensor[index] = value

    return edit


def test_good_metadata_is_as_documented():
    assert GOOD.query_start_loc.tolist() == [0, 2, 6, 7]
    assert GOOD.seq_lens.tolist() == [5, 4, 1]
    assert GOOD.block_table.tolist() == [[0, 1, 2], [3, 4, -1], [5, -1, -1]]
    assert GOOD.slot_mapping.tolist() == [3, 4, 6, 7, 8, 9, 10]
    assert (GOOD.max_query_len, GOOD.max_seq_len) == (4, 5)
    assert GOOD_PADDED.seq_lens.tolist() == [5, 4, 1, 0, 0]
    assert GOOD_PADDED.slot_mapping.tolist()[-2:] == [-1, -1]


def test_validate_good_metadata_returns_host_lists():
    checked = validate(GOOD)
    assert isinstance(checked, CheckedMetadata)
    assert checked.query_start == [0, 2, 6, 7]
    assert checked.seq_lens == [5, 4, 1]
    assert checked.pages == [[0, 1, 2], [3, 4], [5]]
    assert checked.slots == [3, 4, 6, 7, 8, 9, 10]
    assert checked.causal is True
    assert checked.query_lens == [2, 4, 1]
    assert checked.real_rows == [0, 1, 2]
    # Without a pool size the same metadata is fine too, and graph_mode does not hurt.
    assert validate(GOOD, total_pages=None).pages == checked.pages
    assert validate(GOOD, graph_mode=True).pages == checked.pages
    # read_metadata gives the same lists without checking.
    unchecked = read_metadata(GOOD, page_size=PAGE_SIZE)
    assert unchecked == checked


def test_validate_padded_metadata_needs_graph_mode():
    checked = validate(GOOD_PADDED, graph_mode=True)
    assert checked.real_rows == [0, 1, 2]
    assert checked.pages == [[0, 1, 2], [3, 4], [5], [], []]
    with pytest.raises(MetadataError) as info:
        validate(GOOD_PADDED, graph_mode=False)
    assert info.value.field == "seq_lens"


def test_validate_does_not_touch_metadata():
    md = build_good()
    before = [getattr(md, f).clone() for f in ("query_start_loc", "seq_lens", "block_table")]
    validate(md)
    after = [md.query_start_loc, md.seq_lens, md.block_table]
    assert all(torch.equal(x, y) for x, y in zip(before, after, strict=True))


# --------------------------------------------------------------------------- #
# One malformed variant per way a field can be wrong
# --------------------------------------------------------------------------- #

# (id, make-bad-metadata, expected field, text of the bad value, graph_mode)
CASES = [
    # --- wrong dtype of each tensor
    (
        "qsl-dtype",
        lambda md: with_tensor(md, "query_start_loc", lambda t: t.long()),
        "query_start_loc",
        "torch.int64",
        False,
    ),
    (
        "seq_lens-dtype",
        lambda md: with_tensor(md, "seq_lens", lambda t: t.long()),
        "seq_lens",
        "torch.int64",
        False,
    ),
    (
        "block_table-dtype",
        lambda md: with_tensor(md, "block_table", lambda t: t.long()),
        "block_table",
        "torch.int64",
        False,
    ),
    (
        "slot_mapping-dtype",
        lambda md: with_tensor(md, "slot_mapping", lambda t: t.int()),
        "slot_mapping",
        "torch.int32",
        False,
    ),
    (
        "seq_lens-float",
        lambda md: with_tensor(md, "seq_lens", lambda t: t.float()),
        "seq_lens",
        "torch.float32",
        False,
    ),
    # --- wrong ndim
    (
        "qsl-ndim",
        lambda md: with_tensor(md, "query_start_loc", lambda t: t[None]),
        "query_start_loc",
        "(1, 4)",
        False,
    ),
    (
        "seq_lens-ndim",
        lambda md: with_tensor(md, "seq_lens", lambda t: t[:, None]),
        "seq_lens",
        "(3, 1)",
        False,
    ),
    (
        "block_table-ndim",
        lambda md: with_tensor(md, "block_table", lambda t: t.flatten()),
        "block_table",
        "(9,)",
        False,
    ),
    (
        "slot_mapping-ndim",
        lambda md: with_tensor(md, "slot_mapping", lambda t: t[None]),
        "slot_mapping",
        "(1, 7)",
        False,
    ),
    (
        "slot_mapping-0d",
        lambda md: dataclasses.replace(md, slot_mapping=torch.tensor(3)),
        "slot_mapping",
        "()",
        False,
    ),
    # --- not a tensor
    (
        "qsl-list",
        lambda md: dataclasses.replace(md, query_start_loc=md.query_start_loc.tolist()),
        "query_start_loc",
        "list",
        False,
    ),
    (
        "seq_lens-tuple",
        lambda md: dataclasses.replace(md, seq_lens=tuple(md.seq_lens.tolist())),
        "seq_lens",
        "tuple",
        False,
    ),
    (
        "block_table-list",
        lambda md: dataclasses.replace(md, block_table=md.block_table.tolist()),
        "block_table",
        "list",
        False,
    ),
    (
        "slot_mapping-none",
        lambda md: dataclasses.replace(md, slot_mapping=None),
        "slot_mapping",
        "NoneType",
        False,
    ),
    # --- query_start_loc values
    (
        "qsl-not-from-0",
        lambda md: with_tensor(md, "query_start_loc", setitem(0, 1)),
        "query_start_loc",
        "starts at 1",
        False,
    ),
    (
        "qsl-decreasing",
        lambda md: with_tensor(md, "query_start_loc", setitem(1, 7)),
        "query_start_loc",
        "7 -> 6",
        False,
    ),
    (
        "qsl-last-too-big",
        lambda md: with_tensor(md, "query_start_loc", setitem(3, 8)),
        "query_start_loc",
        "ends at 8",
        False,
    ),
    (
        "qsl-last-too-small",
        lambda md: with_tensor(md, "query_start_loc", setitem(3, 6)),
        "query_start_loc",
        "ends at 6",
        False,
    ),
    (
        "qsl-short",
        lambda md: with_tensor(md, "query_start_loc", lambda t: t[:3]),
        "query_start_loc",
        "length 3",
        False,
    ),
    (
        "qsl-long",
        lambda md: with_tensor(md, "query_start_loc", lambda t: torch.cat([t, t[-1:]])),
        "query_start_loc",
        "length 5",
        False,
    ),
    # --- block_table shape and values
    (
        "block_table-rows",
        lambda md: with_tensor(md, "block_table", lambda t: t[:2]),
        "block_table",
        "2 rows",
        False,
    ),
    (
        "block_table-columns",
        lambda md: with_tensor(md, "block_table", lambda t: t[:, :2].contiguous()),
        "block_table",
        "2 columns",
        False,
    ),
    (
        "block_table-in-use-minus-1",
        lambda md: with_tensor(md, "block_table", setitem((0, 2), -1)),
        "block_table",
        "page -1",
        False,
    ),
    (
        "block_table-page-eq-total",
        lambda md: with_tensor(md, "block_table", setitem((1, 0), TOTAL_PAGES)),
        "block_table",
        f"page {TOTAL_PAGES}",
        False,
    ),
    (
        "block_table-page-huge",
        lambda md: with_tensor(md, "block_table", setitem((2, 0), 1000)),
        "block_table",
        "page 1000",
        False,
    ),
    (
        "block_table-unused-below-minus-1",
        lambda md: with_tensor(md, "block_table", setitem((2, 1), -2)),
        "block_table",
        "-2",
        False,
    ),
    (
        "block_table-in-use-below-minus-1",
        lambda md: with_tensor(md, "block_table", setitem((0, 0), -7)),
        "block_table",
        "-7",
        False,
    ),
    (
        "block_table-page-twice",
        lambda md: with_tensor(md, "block_table", setitem((0, 2), 0)),
        "block_table",
        "page 0",
        False,
    ),
    # --- seq_lens values
    (
        "seq_lens-negative",
        lambda md: with_tensor(md, "seq_lens", setitem(2, -1)),
        "seq_lens",
        "negative: -1",
        False,
    ),
    (
        "seq_lens-shorter-than-query",
        lambda md: with_tensor(md, "seq_lens", setitem(1, 3)),
        "seq_lens",
        "is 3",
        False,
    ),
    (
        "seq_lens-zero-with-tokens",
        lambda md: with_tensor(md, "seq_lens", setitem(2, 0)),
        "seq_lens",
        "is 0",
        False,
    ),
    (
        "padded-seq_lens-zero-without-graph-mode",
        lambda md: build_good(pad_to=5),
        "seq_lens",
        "is 0",
        False,
    ),
    # --- slot_mapping values
    (
        "slot-disagrees-with-block-table",
        lambda md: with_tensor(md, "slot_mapping", setitem(0, 5)),
        "slot_mapping",
        "slot 5",
        False,
    ),
    (
        "slot-off-by-one-page",
        lambda md: with_tensor(md, "slot_mapping", setitem(6, 12)),
        "slot_mapping",
        "slot 12",
        False,
    ),
    (
        "slot-minus-1-in-real-row",
        lambda md: with_tensor(md, "slot_mapping", setitem(3, -1)),
        "slot_mapping",
        "slot -1",
        False,
    ),
    (
        "slot-below-minus-1",
        lambda md: with_tensor(md, "slot_mapping", setitem(6, -2)),
        "slot_mapping",
        "-2",
        False,
    ),
    (
        # Rows 1 and 2 both claim page 4 and both write its first slot (8).
        "slot-duplicate-across-rows",
        lambda md: with_tensor(
            with_tensor(md, "block_table", setitem((2, 0), 4)), "slot_mapping", setitem(6, 8)
        ),
        "slot_mapping",
        "slot 8",
        False,
    ),
    (
        "padded-row-with-slot",
        lambda md: with_tensor(build_good(pad_to=5), "slot_mapping", setitem(7, 12)),
        "slot_mapping",
        "slot 12",
        True,
    ),
    # --- the Python-int maxima
    (
        "max_query_len-too-big",
        lambda md: dataclasses.replace(md, max_query_len=5),
        "max_query_len",
        "is 5,",
        False,
    ),
    (
        "max_query_len-too-small",
        lambda md: dataclasses.replace(md, max_query_len=2),
        "max_query_len",
        "is 2,",
        False,
    ),
    (
        "max_query_len-float",
        lambda md: dataclasses.replace(md, max_query_len=4.0),
        "max_query_len",
        "is 4.0",
        False,
    ),
    (
        "max_query_len-bool",
        lambda md: dataclasses.replace(md, max_query_len=True),
        "max_query_len",
        "is True",
        False,
    ),
    (
        "max_query_len-tensor",
        lambda md: dataclasses.replace(md, max_query_len=torch.tensor(4)),
        "max_query_len",
        "tensor(4)",
        False,
    ),
    (
        "max_seq_len-too-small",
        lambda md: dataclasses.replace(md, max_seq_len=4),
        "max_seq_len",
        "is 4,",
        False,
    ),
    (
        "max_seq_len-too-big",
        lambda md: dataclasses.replace(md, max_seq_len=6),
        "max_seq_len",
        "is 6,",
        False,
    ),
    (
        "max_seq_len-float",
        lambda md: dataclasses.replace(md, max_seq_len=5.0),
        "max_seq_len",
        "is 5.0",
        False,
    ),
    (
        "max_seq_len-bool",
        lambda md: dataclasses.replace(md, max_seq_len=False),
        "max_seq_len",
        "is False",
        False,
    ),
    # --- causal
    (
        "causal-int",
        lambda md: dataclasses.replace(md, causal=1),
        "causal",
        "got 1",
        False,
    ),
    (
        "causal-str",
        lambda md: dataclasses.replace(md, causal="yes"),
        "causal",
        "'yes'",
        False,
    ),
    (
        "causal-tensor",
        lambda md: dataclasses.replace(md, causal=torch.tensor(True)),
        "causal",
        "tensor(True)",
        False,
    ),
]


def _params():
    return [
        pytest.param(make, field, bad, graph_mode, id=case_id)
        for case_id, make, field, bad, graph_mode in CASES
    ]


@pytest.mark.parametrize(("make", "field", "bad", "graph_mode"), _params())
def test_malformed_metadata_names_field(make, field, bad, graph_mode):
    md = make(GOOD)
    with pytest.raises(MetadataError) as info:
        validate(md, graph_mode=graph_mode)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert isinstance(info.value, ValueError)
    assert not isinstance(info.value, ForeignPageError)


@pytest.mark.parametrize(("make", "field", "bad", "graph_mode"), _params())
def test_malformed_metadata_message_has_bad_value(make, field, bad, graph_mode):
    with pytest.raises(MetadataError) as info:
        validate(make(GOOD), graph_mode=graph_mode)
    assert bad in str(info.value)


def test_every_metadata_field_has_a_malformed_case():
    fields = {f.name for f in dataclasses.fields(AttentionMetadata)}
    covered = {case[2] for case in CASES}
    assert fields <= covered


@pytest.mark.parametrize("not_metadata", [None, {}, GOOD.seq_lens, "metadata"])
def test_not_attention_metadata(not_metadata):
    with pytest.raises(MetadataError) as info:
        validate(not_metadata)
    assert info.value.field == "metadata"
    assert type(not_metadata).__name__ in str(info.value)


def test_page_beyond_total_is_allowed_without_total_pages():
    md = with_tensor(GOOD, "block_table", setitem((2, 0), 99))
    md = with_tensor(md, "slot_mapping", setitem(6, 99 * PAGE_SIZE))
    assert validate(md, total_pages=None).pages[2] == [99]
    with pytest.raises(MetadataError, match="page 99"):
        validate(md, total_pages=TOTAL_PAGES)


def test_max_query_len_one_rejects_true():
    # True == 1, yet a bool is not an int for the contract.
    builder = BatchBuilder(PagePool(4), 0, PAGE_SIZE)
    s = builder.admit()
    md = builder.step([(s, 1)]).metadata
    assert md.max_query_len == 1
    validate(md)
    with pytest.raises(MetadataError) as info:
        validate(dataclasses.replace(md, max_query_len=True))
    assert info.value.field == "max_query_len"


def test_unused_block_table_entries_are_not_range_checked():
    # Entries past a row's in-use prefix may hold anything >= -1.
    md = with_tensor(GOOD, "block_table", setitem((2, slice(1, None)), TOTAL_PAGES + 5))
    assert validate(md).pages[2] == [5]


def test_real_row_with_no_new_tokens_is_valid():
    # A sequence in the batch with q = 0 (seq_len > 0): allowed, nothing written.
    md = AttentionMetadata(
        query_start_loc=torch.tensor([0, 0, 1], dtype=torch.int32),
        seq_lens=torch.tensor([3, 1], dtype=torch.int32),
        block_table=torch.tensor([[0, 1], [2, -1]], dtype=torch.int32),
        slot_mapping=torch.tensor([4], dtype=torch.int64),
        max_query_len=1,
        max_seq_len=3,
    )
    assert validate(md).pages == [[0, 1], [2]]


# --------------------------------------------------------------------------- #
# check_rank_ownership
# --------------------------------------------------------------------------- #


def test_ownership_accepts_exact_range():
    check_rank_ownership(validate(GOOD), page_size=PAGE_SIZE, page_range=range(0, 6))
    check_rank_ownership(
        validate(GOOD_PADDED, graph_mode=True), page_size=PAGE_SIZE, page_range=range(0, 6)
    )


@pytest.mark.parametrize("page_range", [range(0, 5), range(1, 16), range(6, 16)])
def test_ownership_rejects_in_use_page_outside_range(page_range):
    with pytest.raises(ForeignPageError) as info:
        check_rank_ownership(validate(GOOD), page_size=PAGE_SIZE, page_range=page_range)
    assert info.value.field == "block_table"
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, MetadataError)
    assert f"[{page_range.start}, {page_range.stop})" in str(info.value)


def test_ownership_rejects_slot_outside_range():
    # Pages inside the range, but a slot on page 5 (slot 10 with page_size 2).
    checked = CheckedMetadata(
        query_start=[0, 1], seq_lens=[1], pages=[[0]], slots=[10], causal=True
    )
    with pytest.raises(ForeignPageError) as info:
        check_rank_ownership(checked, page_size=PAGE_SIZE, page_range=range(0, 2))
    assert info.value.field == "slot_mapping"
    assert "slot 10" in str(info.value)
    assert "page 5" in str(info.value)


def test_ownership_ignores_padding_slots():
    checked = CheckedMetadata(
        query_start=[0, 2], seq_lens=[0], pages=[[]], slots=[-1, -1], causal=True
    )
    check_rank_ownership(checked, page_size=PAGE_SIZE, page_range=range(3, 4))


def test_ownership_ignores_pages_beyond_in_use_prefix():
    # Row 2 (one token) uses page 5 only; its tail names foreign pages 15 and 14.
    md = with_tensor(GOOD, "block_table", setitem(2, torch.tensor([5, 15, 14])))
    checked = validate(md)
    assert checked.pages[2] == [5]
    check_rank_ownership(checked, page_size=PAGE_SIZE, page_range=range(0, 6))
    with pytest.raises(ForeignPageError):
        check_rank_ownership(checked, page_size=PAGE_SIZE, page_range=range(0, 5))


# --------------------------------------------------------------------------- #
# validate_backend_args
# --------------------------------------------------------------------------- #

GOOD_ARGS = {"num_heads": 8, "num_kv_heads": 2, "head_dim": 16, "scale": 0.25}


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"num_kv_heads": 8},
        {"num_kv_heads": 1},
        {"scale": 1},
        {"scale": 1e-9},
        {"dp_size": 4, "dp_rank": 3},
        {"dp_size": 1, "dp_rank": 0},
    ],
)
def test_backend_args_accepted(overrides):
    assert validate_backend_args(**{**GOOD_ARGS, **overrides}) is None


BAD_ARGS = [
    (field, value)
    for field in ("num_heads", "num_kv_heads", "head_dim")
    for value in (0, -1, True, False, 2.0, "8", None)
] + [
    ("scale", value)
    for value in (
        float("nan"),
        float("inf"),
        float("-inf"),
        0,
        0.0,
        -1,
        -0.5,
        True,
        False,
        "0.25",
        None,
    )
]


@pytest.mark.parametrize(("field", "value"), BAD_ARGS)
def test_backend_args_rejected_naming_field(field, value):
    with pytest.raises(ValueError, match=field) as info:
        validate_backend_args(**{**GOOD_ARGS, field: value})
    assert repr(value) in str(info.value)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(6, 4), (8, 3), (1, 2), (7, 2)])
def test_backend_args_heads_not_multiple(num_heads, num_kv_heads):
    with pytest.raises(ValueError, match="multiple") as info:
        validate_backend_args(**{**GOOD_ARGS, "num_heads": num_heads, "num_kv_heads": num_kv_heads})
    message = str(info.value)
    assert "num_heads" in message
    assert "num_kv_heads" in message
    assert str(num_heads) in message
    assert str(num_kv_heads) in message


@pytest.mark.parametrize(
    ("dp_size", "dp_rank", "field"),
    [
        (0, 0, "dp_size"),
        (-1, 0, "dp_size"),
        (True, 0, "dp_size"),
        (2.0, 0, "dp_size"),
        (None, 0, "dp_size"),
        (2, -1, "dp_rank"),
        (2, 2, "dp_rank"),
        (4, 4, "dp_rank"),
        (1, 1, "dp_rank"),
        (2, True, "dp_rank"),
        (2, 0.0, "dp_rank"),
        (2, "0", "dp_rank"),
    ],
)
def test_backend_args_bad_dp_config(dp_size, dp_rank, field):
    with pytest.raises(ValueError, match=field):
        validate_backend_args(**GOOD_ARGS, dp_size=dp_size, dp_rank=dp_rank)
    with pytest.raises(ValueError, match=field):
        validate_dp_config(dp_size, dp_rank)


def test_backend_args_accept_huge_finite_scale():
    validate_backend_args(**{**GOOD_ARGS, "scale": 10**30})
    validate_backend_args(**{**GOOD_ARGS, "scale": 1e300})


def test_backend_args_int_scale_beyond_float_range_is_value_error():
    with pytest.raises(ValueError, match="scale"):
        validate_backend_args(**{**GOOD_ARGS, "scale": 10**400})


# --------------------------------------------------------------------------- #
# validate_layer_caches and check_rank_is_bound
# --------------------------------------------------------------------------- #

HEADS, DIM = 2, 8


def caches(**kwargs):
    args = {
        "num_layers": 2,
        "total_pages": 8,
        "page_size": 4,
        "num_kv_heads": HEADS,
        "head_dim": DIM,
    }
    args.update(kwargs)
    return make_layer_caches(**args)


def layer(key, value=None, **kwargs):
    return LayerCache(key=key, value=key.clone() if value is None else value, **kwargs)


SHAPE = (8, 4, HEADS, DIM)


def test_validate_layer_caches_good_geometry():
    geometry = validate_layer_caches(caches(), num_kv_heads=HEADS, head_dim=DIM)
    assert geometry == CacheGeometry(
        num_layers=2,
        num_pages=8,
        page_size=4,
        page_offset=0,
        total_pages=8,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    per_rank = caches(layout=PoolLayout.PER_RANK, dp_size=3, dp_rank=2, dtype=torch.bfloat16)
    geometry = validate_layer_caches(tuple(per_rank), num_kv_heads=HEADS, head_dim=DIM)
    assert (geometry.num_pages, geometry.page_offset, geometry.total_pages) == (2, 6, 8)
    assert geometry.dtype == torch.bfloat16


def test_validate_layer_caches_total_pages_none_means_held():
    geometry = validate_layer_caches(
        [layer(torch.zeros(SHAPE), page_offset=3)], num_kv_heads=HEADS, head_dim=DIM
    )
    assert geometry.total_pages == 11


def _noncontiguous():
    return torch.zeros(8, 4, DIM, HEADS).transpose(2, 3)


def _aliased():
    """Every page is the same memory (stride 0): a write to one slot changes eight."""
    return torch.zeros(1, 4, HEADS, DIM).expand(SHAPE)


def test_validate_layer_caches_accepts_strided_views():
    """An engine's combined ``[pages, 2, ...]`` halves, and any other strides, bind."""
    combined = torch.zeros(8, 2, 4, HEADS, DIM)
    key, value = combined[:, 0], combined[:, 1]
    assert not key.is_contiguous()
    assert not value.is_contiguous()
    views = [
        layer(key, value),
        layer(_noncontiguous(), _noncontiguous()),
        layer(torch.zeros(16, 4, HEADS, DIM)[::2], torch.zeros(SHAPE)),
    ]
    geometry = validate_layer_caches(views, num_kv_heads=HEADS, head_dim=DIM)
    assert (geometry.num_layers, geometry.num_pages, geometry.page_size) == (3, 8, 4)
    built = caches(combined_kv=True, layout=PoolLayout.PER_RANK, dp_size=2, dp_rank=1)
    geometry = validate_layer_caches(built, num_kv_heads=HEADS, head_dim=DIM)
    assert (geometry.num_pages, geometry.page_offset, geometry.total_pages) == (4, 4, 8)


BAD_CACHES = [
    ("empty-list", lambda: [], "non-empty"),
    ("single-cache-not-list", lambda: caches()[0], "non-empty"),
    ("none", lambda: None, "non-empty"),
    ("non-layercache", lambda: [caches()[0], "cache"], "str"),
    ("tensor-not-layercache", lambda: [torch.zeros(SHAPE)], "Tensor"),
    ("3d-key", lambda: [layer(torch.zeros(8, 4, HEADS * DIM), torch.zeros(SHAPE))], "4-D"),
    ("3d-both", lambda: [layer(torch.zeros(32, HEADS, DIM))], "4-D"),
    ("key-not-tensor", lambda: [LayerCache(key=None, value=torch.zeros(SHAPE))], "4-D"),
    (
        "shape-mismatch",
        lambda: [layer(torch.zeros(SHAPE), torch.zeros(7, 4, HEADS, DIM))],
        "value shape (7, 4, 2, 8)",
    ),
    (
        "dtype-mismatch",
        lambda: [layer(torch.zeros(SHAPE), torch.zeros(SHAPE, dtype=torch.float16))],
        "dtype",
    ),
    ("int-dtype", lambda: [layer(torch.zeros(SHAPE, dtype=torch.int32))], "torch.int32"),
    ("bool-dtype", lambda: [layer(torch.zeros(SHAPE, dtype=torch.bool))], "torch.bool"),
    ("aliased-key", lambda: [layer(_aliased(), torch.zeros(SHAPE))], "key has stride 0"),
    ("aliased-value", lambda: [layer(torch.zeros(SHAPE), _aliased())], "value has stride 0"),
    ("wrong-kv-heads", lambda: caches(num_kv_heads=HEADS + 1), "num_kv_heads is 3"),
    ("wrong-head-dim", lambda: caches(head_dim=DIM * 2), "head_dim is 16"),
    ("zero-pages", lambda: [layer(torch.zeros(0, 4, HEADS, DIM))], "at least one page"),
    ("zero-page-size", lambda: [layer(torch.zeros(8, 0, HEADS, DIM))], "at least one page"),
    ("negative-offset", lambda: [layer(torch.zeros(SHAPE), page_offset=-1)], "page_offset"),
    ("float-offset", lambda: [layer(torch.zeros(SHAPE), page_offset=1.0)], "page_offset"),
    (
        "total-below-offset-plus-pages",
        lambda: [layer(torch.zeros(SHAPE), page_offset=4, total_pages=11)],
        "total_pages 11 < page_offset 4 + num_pages 8",
    ),
    ("total-float", lambda: [layer(torch.zeros(SHAPE), total_pages=8.0)], "total_pages 8.0"),
    (
        "layers-differ-in-pages",
        lambda: [caches()[0], layer(torch.zeros(7, 4, HEADS, DIM))],
        "differ from layer 0",
    ),
    (
        "layers-differ-in-dtype",
        lambda: [caches()[0], caches(dtype=torch.float16)[0]],
        "differ from layer 0",
    ),
    (
        "layers-differ-in-offset",
        lambda: [caches()[0], layer(torch.zeros(SHAPE), page_offset=1, total_pages=9)],
        "differ from layer 0",
    ),
    (
        "layers-differ-in-total",
        lambda: [caches()[0], layer(torch.zeros(SHAPE), total_pages=16)],
        "differ from layer 0",
    ),
]


@pytest.mark.parametrize(
    ("make", "text"), [pytest.param(make, text, id=i) for i, make, text in BAD_CACHES]
)
def test_validate_layer_caches_rejects(make, text):
    with pytest.raises(CacheBindingError) as info:
        validate_layer_caches(make(), num_kv_heads=HEADS, head_dim=DIM)
    assert isinstance(info.value, ValueError)
    assert text in str(info.value)


def test_validate_layer_caches_names_the_bad_layer():
    layers = [*caches(num_layers=3), layer(torch.zeros(SHAPE, dtype=torch.int64))]
    with pytest.raises(CacheBindingError, match=r"layer_caches\[3\]"):
        validate_layer_caches(layers, num_kv_heads=HEADS, head_dim=DIM)


@pytest.mark.parametrize("dp_size", [1, 2, 3])
def test_check_rank_is_bound_shared_pool_every_rank(dp_size):
    geometry = validate_layer_caches(caches(), num_kv_heads=HEADS, head_dim=DIM)
    for rank in range(dp_size):
        assert check_rank_is_bound(geometry, dp_size, rank) == range(*_bounds(8, dp_size, rank))


def _bounds(total, dp_size, rank):
    base, extra = divmod(total, dp_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def test_check_rank_is_bound_per_rank_pool():
    per_rank = caches(layout=PoolLayout.PER_RANK, dp_size=2, dp_rank=1)
    geometry = validate_layer_caches(per_rank, num_kv_heads=HEADS, head_dim=DIM)
    assert check_rank_is_bound(geometry, 2, 1) == range(4, 8)
    with pytest.raises(CacheBindingError) as info:
        check_rank_is_bound(geometry, 2, 0)
    message = str(info.value)
    assert "rank 0 of 2" in message
    assert "[0, 4)" in message
    assert "[4, 8)" in message
    # Another partition of the same pool does not fit either.
    with pytest.raises(CacheBindingError):
        check_rank_is_bound(geometry, 4, 1)
    assert check_rank_is_bound(geometry, 4, 2) == range(4, 6)


@pytest.mark.parametrize(("dp_size", "dp_rank"), [(16, 0), (0, 0), (2, 2), (2, -1)])
def test_check_rank_is_bound_bad_partition(dp_size, dp_rank):
    geometry = validate_layer_caches(caches(), num_kv_heads=HEADS, head_dim=DIM)
    with pytest.raises(CacheBindingError, match="bad DP partition"):
        check_rank_is_bound(geometry, dp_size, dp_rank)


# --------------------------------------------------------------------------- #
# The same malformed metadata, through the built-in backends' ``prepare``
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize(("make", "field", "bad", "graph_mode"), _params())
def test_builtins_reject_malformed_metadata_in_prepare(backend, make, field, bad, graph_mode):
    from harness import create_attention_backend

    attention = create_attention_backend(
        backend, num_heads=2, num_kv_heads=1, head_dim=4, scale=0.5
    )
    caches = make_layer_caches(
        num_layers=1, total_pages=TOTAL_PAGES, page_size=PAGE_SIZE, num_kv_heads=1, head_dim=4
    )
    attention.bind_kv_caches(caches)
    attention.prepare(build_good(pad_to=5 if graph_mode else None), graph_mode=graph_mode)
    with pytest.raises(MetadataError) as info:
        attention.prepare(make(GOOD), graph_mode=graph_mode)
    assert info.value.field == field
    with pytest.raises(RuntimeError, match="before prepare"):  # the rejected step is not kept
        attention.forward(torch.ones(7, 2, 4), torch.ones(7, 1, 4), torch.ones(7, 1, 4), 0)


def test_per_rank_cache_without_total_pages_says_what_is_missing():
    import torch

    from harness import DPBackendConfig, LayerCache, create_attention_backend, dp_page_range

    pages = dp_page_range(20, 4, 1)
    key = torch.zeros(len(pages), 4, 1, 8)
    backend = create_attention_backend(
        "reference",
        num_heads=1,
        num_kv_heads=1,
        head_dim=8,
        scale=0.3,
        dp_config=DPBackendConfig(dp_size=4, dp_rank=1),
    )
    with pytest.raises(ValueError, match="must give the whole pool's total_pages"):
        backend.bind_kv_caches([LayerCache(key=key, value=key.clone(), page_offset=pages.start)])
