"""A pool watch reports the slots each call changed, once, in every layout, at any offset;
the partition property, which keeps one, still catches a write into another layer."""

from __future__ import annotations

import pytest
import torch

from harness.conformance.properties import check_partition_respected
from harness.core.contract import LayerCache
from harness.core.errors import PropertyFailure
from harness.core.registry import BackendEntry
from harness.numerics.canary import PoolWatch, changed_slots, snapshot
from harness.numerics.scenario import Scenario
from reference_backends import ReferenceBackend

PAGES, PAGE, KV, D = 6, 4, 2, 8


def caches(layout: str, offset: int) -> list[LayerCache]:
    shape = (PAGES, KV, PAGE, D) if layout == "HND" else (PAGES, PAGE, KV, D)
    made = []
    for _ in range(2):
        key, value = torch.randn(shape), torch.randn(shape)
        key[0] = float("nan")  # a NaN canary compares equal to itself, bit for bit
        made.append(LayerCache(key=key, value=value, page_offset=offset, layout=layout))
    return made


def write(cache: LayerCache, slot: int, which: str = "key") -> None:
    local = slot - cache.page_offset * PAGE
    target = cache.key_nhd if which == "key" else cache.value_nhd
    target[local // PAGE, local % PAGE] += 1.0


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("offset", [0, 3])
def test_each_call_reports_what_it_changed_and_nothing_twice(layout: str, offset: int) -> None:
    pool = caches(layout, offset)
    watch = PoolWatch(pool)
    base = offset * PAGE
    write(pool[1], base + 5)
    write(pool[1], base + 22, "value")
    assert watch.changes() == [set(), {base + 5, base + 22}]
    assert watch.changes() == [set(), set()]  # taken in: not news any more
    write(pool[0], base + 9)
    write(pool[1], base + 5)  # the same slot again, changed again
    assert watch.changes() == [{base + 9}, {base + 5}]
    assert changed_slots(pool, watch.bits) == [set(), set()]  # its bits are the pool's now
    assert all(
        torch.equal(a, b)
        for pair in zip(snapshot(pool), watch.bits, strict=True)
        for a, b in zip(*pair, strict=True)
    )


class _RewritesEarlierLayer(ReferenceBackend):
    """Layer 1's forward also writes its new keys into layer 0, at the mapped slots: the
    slots layer 0's own forward changed, so only their contents are wrong."""

    def forward(self, query, key, value, layer_idx, **kw):
        out = super().forward(query, key, value, layer_idx, **kw)
        if layer_idx == 1:
            step, cache = self._step, self._caches[0]
            rows = torch.as_tensor(step.write_rows)
            page, position = rows // cache.page_size, rows % cache.page_size
            tokens = torch.as_tensor(step.write_tokens)
            cache.key_nhd[page, position] = key[tokens].to(cache.key.dtype)
        return out


class _WritesLaterLayer(ReferenceBackend):
    """Layer 0's forward also writes one slot of layer 1 that no row maps."""

    def forward(self, query, key, value, layer_idx, **kw):
        out = super().forward(query, key, value, layer_idx, **kw)
        if layer_idx == 0:
            cache = self._caches[1]
            cache.value_nhd[-1, -1] = 7.0  # unused memory holds NaN: any number shows
        return out


@pytest.mark.parametrize(
    ("backend", "said"),
    [
        (_RewritesEarlierLayer, "changed after that layer's forward"),
        (_WritesLaterLayer, "changed layer 1 slots"),
    ],
)
def test_a_write_into_another_layer_fails_the_partition_property(backend, said) -> None:
    group = [
        Scenario(num_layers=2, dp_size=2, dp_rank=rank, total_pages=16, seed=rank)
        for rank in range(2)
    ]
    check_partition_respected(BackendEntry("reference", ReferenceBackend, "test"), group)
    with pytest.raises(PropertyFailure, match=said):
        check_partition_respected(BackendEntry("bad", backend, "test"), group)
