"""Engine-owned page formats: the harness makes, poisons, fills and reads caches through a
backend's format, and a format that misstates where its write op puts a token fails."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings

from harness.conformance.properties import (
    check_every_rank_matches_oracle,
    check_matches_oracle,
    check_only_mapped_slots_change,
)
from harness.conformance.stateful import conformance_machine, run_machine
from harness.conformance.step_strategies import multi_rank_scenarios, scenarios
from harness.conformance.strategies import CI_BUDGET
from harness.core.contract import Capabilities, LayerCache
from harness.core.errors import PropertyFailure
from harness.core.kv_pages import PoolLayout, make_layer_caches
from harness.core.registry import BackendEntry
from harness.numerics.scenario import Scenario, scenario_caches
from reference_backends.reference import ReferenceBackend
from reference_backends.vllm_cpu import VllmCpuPages

DRAWS = settings(
    max_examples=8,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


SPLIT = VllmCpuPages()  # plain torch: vLLM's CPU layout, keys dimension-major per page and head


class OwnsSplitPages(ReferenceBackend):
    """``reference`` on caches in vLLM's CPU format: it reads and writes through their views."""

    @classmethod
    def capabilities(cls) -> Capabilities:
        caps = super().capabilities()
        return dataclasses.replace(caps, cache_layouts=(SPLIT.name,), page_format=SPLIT)


class MisstatesItsFormat(OwnsSplitPages):
    """Its kernel keeps keys token-major in the storage while the format's views say
    dimension-major: its own writes and reads agree, the harness's read-back does not."""

    def bind_kv_caches(self, layer_caches: list[LayerCache]) -> None:
        own = []
        for cache in layer_caches:
            assert cache.storage is not None
            pages, heads, twice, dim = cache.storage.shape
            halves = cache.storage.view(pages, heads, 2, twice // 2, dim)
            key = halves[:, :, 0].permute(0, 2, 1, 3)  # token-major: not what the views say
            own.append(dataclasses.replace(cache, key=key))
        super().bind_kv_caches(own)


def entry(cls: type) -> BackendEntry:
    return BackendEntry(cls.__name__, cls, "test")


STEP = Scenario(
    context_lens=(5, 9),
    query_lens=(1, 9),
    cache_layout=SPLIT.name,
    page_format=SPLIT,
    dp_size=2,
    dp_rank=1,
    total_pages=12,
    seed=4,
)


def test_a_format_whose_name_is_not_claimed_is_refused():
    with pytest.raises(ValueError, match="page_format"):
        Capabilities(page_format=SPLIT)
    assert Capabilities(cache_layouts=(SPLIT.name,), page_format=SPLIT).page_format is SPLIT


@pytest.mark.parametrize("layout", list(PoolLayout))
def test_caches_come_from_the_format_poisoned_through_its_views(layout):
    caches = make_layer_caches(
        num_layers=2, total_pages=12, page_size=4, num_kv_heads=2, head_dim=8,
        layout=layout, dp_size=2, dp_rank=1, cache_layout=SPLIT.name, page_format=SPLIT,
    )  # fmt: skip
    for cache in caches:
        assert cache.layout == SPLIT.name
        assert cache.storage is not None
        assert cache.storage.shape == (cache.num_pages, 2, 8, 8)
        assert cache.page_offset == (0 if layout is PoolLayout.SHARED else 6)
        assert cache.key.shape == cache.value.shape == (cache.num_pages, 4, 2, 8)
        assert cache.storage.isnan().all()  # the two views cover the whole storage
        cache.key[1, 3, 1, 5] = 7.0  # token 3 of page 1, KV head 1, dim 5
        flat = cache.storage[1, 1].reshape(-1)
        assert flat[5 * 4 + 3] == 7.0  # keys dimension-major: dim * page_size + token


def test_a_backend_on_its_own_format_passes_every_property_drawn():
    owned = entry(OwnsSplitPages)
    caps = owned.capabilities
    layouts = set()

    @DRAWS
    @given(scenarios(caps), multi_rank_scenarios(caps))
    def check(s: Scenario, group: list[Scenario]) -> None:
        layouts.add(scenario_caches(s)[0].layout)
        check_matches_oracle(owned, s)
        check_only_mapped_slots_change(owned, s)
        check_every_rank_matches_oracle(owned, group)

    check()
    assert layouts == {SPLIT.name}
    run_machine(conformance_machine(owned, CI_BUDGET), settings(DRAWS, max_examples=4))


def test_a_format_that_misstates_its_layout_fails():
    with pytest.raises(PropertyFailure):
        check_matches_oracle(entry(MisstatesItsFormat), STEP)
    check_matches_oracle(entry(OwnsSplitPages), STEP)


def test_the_read_back_names_the_token_a_write_misplaced():
    class WritesKeysTokenMajor(OwnsSplitPages):
        """Reads through the views, but its write op puts keys token-major."""

        def forward(self, query, key, value, layer_idx, *, out=None):  # type: ignore[no-untyped-def]
            result = super().forward(query, key, value, layer_idx, out=out)
            cache = self._caches[layer_idx]
            assert cache.storage is not None
            assert self._step is not None
            for token, slot in enumerate(self._step.checked.slots):
                if slot >= 0:
                    page, offset = divmod(slot - cache.page_offset * cache.page_size, 4)
                    cache.storage[page, :, offset, :] = key[token]  # token-major
            return result

    with pytest.raises(PropertyFailure, match="reads back as"):
        check_matches_oracle(entry(WritesKeysTokenMajor), STEP)
