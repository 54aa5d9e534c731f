"""A sweep split into shards: which share of the work shard ``K/N`` runs.

Any scheduler (a CI matrix, a Slurm array, a Kubernetes indexed Job) runs
shard ``K`` of ``N`` with nothing but its index; the share must therefore be
a pure function of the work list, its weights and ``(K, N)``, the same on
every machine, so the shards cover the work exactly once between them.
Items are dealt longest first to the least loaded shard (ties to the lowest
shard, items in list order), which keeps the shards' expected costs within
one item of each other without anyone measuring anything.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (from 1) of ``count``."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 1 <= self.index <= self.count:
            raise ValueError(f"shard {self.index}/{self.count}: K/N needs N >= 1 and 1 <= K <= N")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``K/N`` as a scheduler writes it (``--shard 2/4``)."""
        index, slash, count = text.strip().partition("/")
        if not slash or not index.strip().isdigit() or not count.strip().isdigit():
            raise ValueError(f"expected a shard as K/N (for example 1/4), got {text!r}")
        return cls(int(index), int(count))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def as_json(self) -> dict[str, int]:
        return {"index": self.index, "count": self.count}

    @classmethod
    def from_json(cls, data: Any) -> Shard:
        if not isinstance(data, dict) or set(data) != {"index", "count"}:
            raise ValueError(f"a shard is {{'index': K, 'count': N}}, got {data!r}")
        index, count = data["index"], data["count"]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (index, count)):
            raise ValueError(f"a shard's index and count are integers, got {data!r}")
        return cls(index, count)

    def select(self, weights: Sequence[float]) -> list[int]:
        """The positions (in order) of the items this shard runs, of items weighing ``weights``."""
        owners = deal(weights, self.count)
        return [i for i, owner in enumerate(owners) if owner == self.index - 1]


def deal(weights: Sequence[float], count: int) -> list[int]:
    """The shard (from 0) of each item: heaviest first, each to the least loaded shard."""
    if count < 1:
        raise ValueError(f"shard count must be >= 1, got {count}")
    if any(not w >= 0 for w in weights):
        raise ValueError("item weights must be >= 0")
    order = sorted(range(len(weights)), key=lambda i: (-weights[i], i))
    loads = [(0.0, shard) for shard in range(count)]
    owners = [0] * len(weights)
    for item in order:
        load, shard = heapq.heappop(loads)
        owners[item] = shard
        heapq.heappush(loads, (load + weights[item], shard))
    return owners


def check_complete(shards: Sequence[Shard], what: str = "shard") -> int:
    """The shard count, once ``shards`` are each of ``1..N`` exactly once; else ``ValueError``
    naming what is missing, duplicated or of another count."""
    if not shards:
        raise ValueError(f"no {what} given")
    counts = sorted({s.count for s in shards})
    if len(counts) > 1:
        raise ValueError(
            f"the {what}s come from splits into different counts ({', '.join(map(str, counts))})"
        )
    count = counts[0]
    seen = sorted(s.index for s in shards)
    duplicated = sorted({i for i in seen if seen.count(i) > 1})
    if duplicated:
        raise ValueError(
            f"{what} {', '.join(f'{i}/{count}' for i in duplicated)} given more than once"
        )
    missing = [i for i in range(1, count + 1) if i not in seen]
    if missing:
        raise ValueError(
            f"{what} {', '.join(f'{i}/{count}' for i in missing)} missing: "
            f"a merge needs all {count}"
        )
    return count
