"""Watching cache memory: bit patterns before and after a call, and which slots changed.

Bit patterns, not values, so NaN-poisoned memory compares equal to itself
and a write of the same value through a wrong path still shows as unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.core.contract import LayerCache


def _bit_view(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bit patterns, a view where it lives on the CPU (a copy elsewhere)."""
    as_int = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.detach().view(as_int).cpu()


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """Bit patterns, so NaN canaries compare equal to themselves (a copy, kept)."""
    return _bit_view(tensor).clone()


def snapshot(caches: list[LayerCache]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every layer's key and value bits, to compare with after a call."""
    return [(bits(c.key_nhd), bits(c.value_nhd)) for c in caches]


def changed_slots(
    caches: list[LayerCache], before: list[tuple[torch.Tensor, torch.Tensor]]
) -> list[set[int]]:
    """Per layer, the global slots whose key or value bits differ from ``before``."""
    changed = []
    for cache, (key, value) in zip(caches, before, strict=True):
        rows = set()
        for now, old in ((cache.key_nhd, key), (cache.value_nhd, value)):
            current = _bit_view(now)
            if torch.equal(current, old):  # most layers of most calls: one pass, no copy
                continue
            diff = (current != old).flatten(0, 1).flatten(1).any(-1)
            rows |= {
                r + cache.page_offset * cache.page_size for r in diff.nonzero().flatten().tolist()
            }
        changed.append(rows)
    return changed


class PoolWatch:
    """A pool's bits kept current across calls: each call's changes are read against them.

    Copying a whole pool before every call (``snapshot``) costs more than
    comparing it, and a run of many steps on one large pool spends most of
    its time there. A watch copies the pool once and afterwards only the slots
    a call changed. Every rank stepping on one shared pool must use the same
    watch: another's writes are its news.
    """

    def __init__(self, caches: list[LayerCache]) -> None:
        self.caches = caches
        self.bits = snapshot(caches)

    def changes(self, layers: Sequence[int] | None = None) -> list[set[int]]:
        """Per layer (``layers``, default all; the others read as unchanged), the global
        slots changed since the watch last looked at that layer; it takes them in."""
        chosen = range(len(self.caches)) if layers is None else layers
        changed: list[set[int]] = [set() for _ in self.caches]
        for index in chosen:
            cache, (key, value) = self.caches[index], self.bits[index]
            (rows,) = changed_slots([cache], [(key, value)])
            changed[index] = rows
            if not rows:
                continue
            local = torch.tensor(sorted(rows)) - cache.page_offset * cache.page_size
            page, position = local // cache.page_size, local % cache.page_size
            for now, old in ((cache.key_nhd, key), (cache.value_nhd, value)):
                old[page, position] = _bit_view(now)[page, position]  # in place, any strides
        return changed
