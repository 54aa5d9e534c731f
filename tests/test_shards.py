"""Shards of a sweep: a deterministic, balanced partition, and the merge's completeness check."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.core.shards import Shard, check_complete, deal


@given(
    weights=st.lists(st.floats(min_value=0, max_value=1e6), max_size=60),
    count=st.integers(min_value=1, max_value=9),
)
def test_the_shards_partition_the_items_and_balance_their_weight(
    weights: list[float], count: int
) -> None:
    shares = [Shard(k, count).select(weights) for k in range(1, count + 1)]
    assert sorted(i for share in shares for i in share) == list(range(len(weights)))
    assert all(share == sorted(share) for share in shares)  # each keeps the items' order
    loads = [sum(weights[i] for i in share) for share in shares]
    heaviest = max(weights, default=0.0)
    assert max(loads) - min(loads) <= heaviest + 1e-6 * max(loads, default=0.0)
    assert deal(weights, count) == deal(list(weights), count)  # the same on every machine


def test_equal_weights_are_dealt_round_the_shards() -> None:
    assert deal([1.0] * 7, 3) == [0, 1, 2, 0, 1, 2, 0]
    assert Shard(2, 3).select([1.0] * 7) == [1, 4]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("3", "expected a shard as K/N"),
        ("a/2", "expected a shard as K/N"),
        ("0/2", "1 <= K <= N"),
        ("3/2", "1 <= K <= N"),
        ("1/0", "N >= 1"),
    ],
)
def test_a_bad_shard_is_refused_with_its_form(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Shard.parse(text)


def test_shards_round_trip_through_json() -> None:
    assert Shard.from_json(Shard(2, 5).as_json()) == Shard(2, 5)
    assert str(Shard.parse(" 2/5 ")) == "2/5"
    with pytest.raises(ValueError, match="integers"):
        Shard.from_json({"index": "1", "count": 2})


def test_a_merge_needs_every_shard_once() -> None:
    assert check_complete([Shard(2, 2), Shard(1, 2)]) == 2
    with pytest.raises(ValueError, match="shard 2/3 missing: a merge needs all 3"):
        check_complete([Shard(1, 3), Shard(3, 3)])
    with pytest.raises(ValueError, match="shard 1/2 given more than once"):
        check_complete([Shard(1, 2), Shard(1, 2), Shard(2, 2)])
    with pytest.raises(ValueError, match="different counts"):
        check_complete([Shard(1, 2), Shard(2, 3)])
    with pytest.raises(ValueError, match="no shard given"):
        check_complete([])
