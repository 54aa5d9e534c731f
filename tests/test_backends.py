"""Both built-in backends against the float64 oracle, and each contract rule they enforce."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import pytest
import torch

from harness import (
    CacheBindingError,
    Capabilities,
    DPBackendConfig,
    ForeignPageError,
    MetadataError,
    PoolLayout,
    create_attention_backend,
)
from harness.conformance import properties, rejection_properties
from harness.conformance.properties import bits, changed_slots, run_step
from harness.core.batches import BatchBuilder
from harness.core.contract import capabilities_of
from harness.core.kv_pages import PagePool, make_layer_caches
from harness.core.paged_base import PagedBackendBase
from harness.core.registry import BackendEntry, default_registry
from harness.numerics.oracle import SequenceKV
from harness.numerics.scenario import Scenario, check_outputs, make_step_inputs, run_scenario
from reference_backends import ReferenceBackend, SdpaBackend
from suites.mutants.backends import (
    AssumesContiguousPages,
    DropsLastToken,
    IgnoresPageOffset,
    ReadsWholeLastPage,
    WritesPaddingSlots,
)

BACKENDS = ["reference", "sdpa"]

BATCHES = {
    "decode": ((7, 12, 1, 20), (1, 1, 1, 1)),
    "prefill": ((5, 12, 3), (5, 12, 3)),
    "extend": ((9, 16, 11), (4, 5, 2)),
    "mixed": ((1, 13, 8, 21, 6), (1, 13, 3, 1, 6)),
}


def make(name: str, s: Scenario, **kwargs):
    return create_attention_backend(
        name,
        num_heads=s.num_heads,
        num_kv_heads=s.num_kv_heads,
        head_dim=s.head_dim,
        scale=s.softmax_scale,
        dp_config=DPBackendConfig(s.dp_size, s.dp_rank),
        **kwargs,
    )


def assert_matches_oracle(name: str, scenario: Scenario, **kwargs) -> list[torch.Tensor]:
    inputs, outputs = run_scenario(lambda s: make(name, s, **kwargs), scenario)
    checks = check_outputs(inputs, outputs)
    assert len(checks) == scenario.num_layers
    for layer, check in enumerate(checks):
        assert check.checked_tokens > 0
        assert check.passed, f"layer {layer}: {check.describe()}"
    return outputs


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize(("dp_size", "dp_rank"), [(1, 0), (2, 1), (3, 0), (3, 2), (8, 5)])
@pytest.mark.parametrize("layout", list(PoolLayout))
def test_batches_match_oracle_on_every_rank(name, batch, dp_size, dp_rank, layout):
    contexts, queries = BATCHES[batch]
    scenario = Scenario(
        num_heads=8,
        num_kv_heads=2,
        head_dim=16,
        page_size=3,
        total_pages=203,
        num_layers=3,
        context_lens=contexts,
        query_lens=queries,
        dp_size=dp_size,
        dp_rank=dp_rank,
        layout=layout,
        seed=dp_rank,
    )
    assert_matches_oracle(name, scenario)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("batch", ["decode", "mixed"])
def test_dtypes(name, dtype, batch):
    contexts, queries = BATCHES[batch]
    assert_matches_oracle(
        name, Scenario(dtype=dtype, context_lens=contexts, query_lens=queries, dp_size=2, dp_rank=1)
    )


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize(
    "changes",
    [
        {"page_size": 1},
        {"page_size": 5, "context_lens": (10, 5, 15), "query_lens": (1, 5, 3)},  # page ends
        {"page_size": 16, "context_lens": (16, 33), "query_lens": (16, 1)},
        {"num_heads": 8, "num_kv_heads": 1},  # MQA
        {"num_heads": 3, "num_kv_heads": 3},
        {"num_heads": 12, "num_kv_heads": 4, "head_dim": 13},  # odd head dim
        {"scale": 0.77},
        {"causal": False, "context_lens": (9, 7), "query_lens": (3, 7)},
        {"shuffle_pages": True, "context_lens": (19, 30), "query_lens": (2, 30)},
        {"magnitude": 30.0, "scale": 2.0},  # logits in the thousands: stable softmax needed
    ],
    ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()),
)
def test_geometries(name, changes):
    assert_matches_oracle(name, replace(Scenario(dp_size=2, dp_rank=0), **changes))


@pytest.mark.parametrize("name", BACKENDS)
def test_graph_mode_padding_rows_write_nothing(name):
    scenario = Scenario(pad_to=5, dp_size=2, dp_rank=1, context_lens=(6, 3), query_lens=(1, 3))
    inputs = make_step_inputs(scenario)
    before = [bits(c.key) for c in inputs.caches]
    backend = make(name, scenario)
    backend.bind_kv_caches(inputs.caches)
    backend.prepare(inputs.step.metadata, graph_mode=True)
    outputs = [
        backend.forward(inputs.queries[i], inputs.keys[i], inputs.values[i], i)
        for i in range(scenario.num_layers)
    ]
    assert all(c.passed for c in check_outputs(inputs, outputs))
    slots = [s for s in inputs.step.metadata.slot_mapping.tolist() if s != -1]
    assert len(slots) == 4  # only the real rows' tokens
    for cache, old in zip(inputs.caches, before, strict=True):
        changed = (bits(cache.key) != old).flatten(0, 1).any(-1).any(-1).nonzero().flatten()
        assert sorted(changed.tolist()) == sorted(
            s - cache.page_offset * cache.page_size for s in slots
        )


@pytest.mark.parametrize("name", BACKENDS)
def test_forward_writes_only_its_slots_in_its_layer(name):
    scenario = Scenario(dp_size=3, dp_rank=1, layout=PoolLayout.SHARED, num_layers=3)
    inputs = make_step_inputs(scenario)
    backend = make(name, scenario)
    backend.bind_kv_caches(inputs.caches)
    backend.prepare(inputs.step.metadata)
    before = [(bits(c.key), bits(c.value)) for c in inputs.caches]
    backend.forward(inputs.queries[1], inputs.keys[1], inputs.values[1], 1)
    slots = inputs.step.metadata.slot_mapping.tolist()
    for layer, (cache, (old_k, old_v)) in enumerate(zip(inputs.caches, before, strict=True)):
        for new, old in ((cache.key, old_k), (cache.value, old_v)):
            changed = (bits(new) != old).flatten(0, 1).flatten(1).any(-1)
            expected = set(slots) if layer == 1 else set()
            assert set(changed.nonzero().flatten().tolist()) == expected
    flat = inputs.caches[1].key.flatten(0, 1)
    assert torch.equal(flat[slots], inputs.keys[1])


@pytest.mark.parametrize("name", BACKENDS)
def test_inputs_unmodified_and_views_accepted(name):
    scenario = Scenario(num_heads=4, num_kv_heads=2, head_dim=8)
    inputs = make_step_inputs(scenario)
    backend = make(name, scenario)
    backend.bind_kv_caches(inputs.caches)
    backend.prepare(inputs.step.metadata)
    metadata_copy = {
        f.name: getattr(inputs.step.metadata, f.name)
        for f in dataclasses.fields(inputs.step.metadata)
    }
    metadata_copy = {
        k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in metadata_copy.items()
    }
    # non-contiguous views of the same values
    query = inputs.queries[0].transpose(0, 1).contiguous().transpose(0, 1)
    key = torch.cat([inputs.keys[0], inputs.keys[0]], dim=-1)[..., :8]
    value = inputs.values[0].clone()
    copies = [query.clone(), key.clone(), value.clone()]
    assert not query.is_contiguous()
    assert not key.is_contiguous()
    out = backend.forward(query, key, value, 0)
    for tensor, copy in zip((query, key, value), copies, strict=True):
        assert torch.equal(tensor, copy)
    for field, value in metadata_copy.items():
        current = getattr(inputs.step.metadata, field)
        assert torch.equal(current, value) if isinstance(value, torch.Tensor) else current == value
    assert out.shape == query.shape
    assert out.dtype == query.dtype
    assert torch.isfinite(out).all()
    assert check_outputs(inputs, [out, *inputs.queries[1:]])[0].passed


@pytest.mark.parametrize("name", BACKENDS)
def test_second_run_is_bit_identical(name):
    scenario = Scenario(context_lens=(17, 4, 9), query_lens=(1, 4, 3))
    first = run_scenario(lambda s: make(name, s), scenario)[1]
    second = run_scenario(lambda s: make(name, s), scenario)[1]
    for a, b in zip(first, second, strict=True):
        assert torch.equal(bits(a), bits(b))


@pytest.mark.parametrize("name", BACKENDS)
def test_validate_false_gives_the_same_output(name):
    scenario = Scenario(dp_size=2, dp_rank=1, context_lens=(17, 4, 9), query_lens=(1, 4, 3))
    checked = run_scenario(lambda s: make(name, s), scenario)[1]
    fast = run_scenario(lambda s: make(name, s, validate=False), scenario)[1]
    for a, b in zip(checked, fast, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", BACKENDS)
def test_layouts_agree(name):
    base = Scenario(dp_size=4, dp_rank=2, context_lens=(11, 3, 7), query_lens=(2, 3, 1))
    shared = run_scenario(lambda s: make(name, s), base)[1]
    per_rank = run_scenario(lambda s: make(name, s), replace(base, layout=PoolLayout.PER_RANK))[1]
    for a, b in zip(shared, per_rank, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", BACKENDS)
def test_physical_page_order_does_not_matter(name):
    base = Scenario(context_lens=(11, 23, 7), query_lens=(2, 3, 1), page_size=2)
    ordered = run_scenario(lambda s: make(name, s), base)[1]
    shuffled = run_scenario(lambda s: make(name, s), replace(base, shuffle_pages=True))[1]
    for a, b in zip(ordered, shuffled, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


# -- rejection: foreign pages, bad bindings, bad forward inputs; nothing written ----------


def _bound_backend(name: str, scenario: Scenario):
    inputs = make_step_inputs(scenario)
    backend = make(name, scenario)
    backend.bind_kv_caches(inputs.caches)
    return backend, inputs


@pytest.mark.parametrize("name", BACKENDS)
def test_prepare_rejects_a_foreign_page(name):
    scenario = Scenario(dp_size=2, dp_rank=1)
    backend, _ = _bound_backend(name, replace(scenario, dp_rank=0))
    foreign = make_step_inputs(scenario).step.metadata  # pages of rank 1
    with pytest.raises(ForeignPageError, match="outside this rank"):
        backend.prepare(foreign)


@pytest.mark.parametrize("name", BACKENDS)
def test_prepare_rejects_a_foreign_page_named_by_table_and_slot(name):
    scenario = Scenario(
        dp_size=2, dp_rank=0, total_pages=8, page_size=2, context_lens=(3,), query_lens=(1,)
    )
    backend, inputs = _bound_backend(name, scenario)
    metadata = inputs.step.metadata
    # Point the in-use page at rank 1 (page 4..7) consistently in table and slot.
    table = metadata.block_table.clone()
    table[0, 1] = 5
    slots = torch.tensor([5 * 2 + 0])
    bad = replace(metadata, block_table=table, slot_mapping=slots)
    with pytest.raises(ForeignPageError):
        backend.prepare(bad)


@pytest.mark.parametrize("name", BACKENDS)
def test_rejected_forward_writes_nothing(name):
    scenario = Scenario()
    backend, inputs = _bound_backend(name, scenario)
    backend.prepare(inputs.step.metadata)
    before = [bits(c.key) for c in inputs.caches]
    bad_key = inputs.keys[0][:, :1]  # wrong number of KV heads
    with pytest.raises(ValueError, match="key shape"):
        backend.forward(inputs.queries[0], bad_key, inputs.values[0], 0)
    with pytest.raises(ValueError, match="dtype"):
        backend.forward(inputs.queries[0].half(), inputs.keys[0], inputs.values[0], 0)
    with pytest.raises(ValueError, match="layer_idx"):
        backend.forward(inputs.queries[0], inputs.keys[0], inputs.values[0], 7)
    for cache, old in zip(inputs.caches, before, strict=True):
        assert torch.equal(bits(cache.key), old)


@pytest.mark.parametrize("name", BACKENDS)
def test_rejected_prepare_keeps_no_step(name):
    scenario = Scenario()
    backend, inputs = _bound_backend(name, scenario)
    bad = replace(inputs.step.metadata, max_seq_len=999)
    with pytest.raises(MetadataError, match="max_seq_len"):
        backend.prepare(bad)
    with pytest.raises(RuntimeError, match="before prepare"):
        backend.forward(inputs.queries[0], inputs.keys[0], inputs.values[0], 0)


@pytest.mark.parametrize("name", BACKENDS)
def test_bind_rejects_a_range_outside_the_tensors(name):
    caches = make_layer_caches(
        num_layers=1,
        total_pages=10,
        page_size=2,
        num_kv_heads=2,
        head_dim=16,
        layout=PoolLayout.PER_RANK,
        dp_size=2,
        dp_rank=1,
    )
    backend = make(name, Scenario(dp_size=2, dp_rank=0))
    with pytest.raises(CacheBindingError, match=r"owns pages \[0, 5\)"):
        backend.bind_kv_caches(caches)


@pytest.mark.parametrize("name", BACKENDS)
def test_bind_rejects_mismatched_heads(name):
    caches = make_layer_caches(
        num_layers=2, total_pages=10, page_size=2, num_kv_heads=4, head_dim=16
    )
    with pytest.raises(CacheBindingError, match="num_kv_heads"):
        make(name, Scenario()).bind_kv_caches(caches)


@pytest.mark.parametrize("name", BACKENDS)
def test_calls_out_of_order_are_errors(name):
    backend = make(name, Scenario())
    with pytest.raises(RuntimeError, match="bind_kv_caches"):
        backend.prepare(make_step_inputs(Scenario()).step.metadata)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_heads": 0}, "num_heads"),
        ({"num_kv_heads": -2}, "num_kv_heads"),
        ({"head_dim": 2.5}, "head_dim"),
        ({"num_heads": 6, "num_kv_heads": 4}, "num_heads"),
        ({"scale": float("nan")}, "scale"),
        ({"scale": 0.0}, "scale"),
        ({"scale": float("inf")}, "scale"),
        ({"dp_size": 0}, "dp_size"),
        ({"dp_size": 2, "dp_rank": 2}, "dp_rank"),
    ],
)
def test_constructor_rejects_bad_arguments(name, kwargs, field):
    from harness import get_backend

    args = {"num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "scale": 0.5} | kwargs
    with pytest.raises(ValueError, match=field):
        get_backend(name)(**args)


# -- several steps on one backend: prefill, extend, decode, with a freed and re-used page --


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("layout", list(PoolLayout))
def test_consecutive_steps(name, layout):
    from harness.numerics.oracle import naive_attention, oracle_attention
    from harness.numerics.tolerance import compare

    heads, kv_heads, dim, page, total, layers = 4, 2, 8, 3, 24, 2
    pool = PagePool(total, dp_size=2)
    builder = BatchBuilder(pool, rank=1, page_size=page)
    caches = make_layer_caches(
        num_layers=layers,
        total_pages=total,
        page_size=page,
        num_kv_heads=kv_heads,
        head_dim=dim,
        layout=layout,
        dp_size=2,
        dp_rank=1,
    )
    backend = create_attention_backend(
        name,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=dim,
        scale=0.4,
        dp_config=DPBackendConfig(2, 1),
    )
    backend.bind_kv_caches(caches)
    gen = torch.Generator().manual_seed(0)
    history: dict[int, list[list[torch.Tensor]]] = {}  # seq -> layer -> [k, v]
    a, b = builder.admit(), builder.admit()
    plan = [[(a, 5), (b, 2)], [(a, 1), (b, 4)], [(a, 1), (b, 1)], "release-a", [(b, 1)]]
    checked_steps = 0
    for requests in plan:
        if requests == "release-a":
            builder.release(a)
            c = builder.admit()
            history.pop(a)
            plan.append([(c, 4), (b, 1)])
            continue
        step = builder.step(requests)
        backend.prepare(step.metadata)
        for layer in range(layers):
            new_k, new_v, seqs = [], [], []
            for seq_id, q_len in requests:
                k = torch.randn(q_len, kv_heads, dim, generator=gen)
                v = torch.randn(q_len, kv_heads, dim, generator=gen)
                hist = history.setdefault(
                    seq_id, [[torch.empty(0, kv_heads, dim)] * 2 for _ in range(layers)]
                )
                hist[layer] = [torch.cat([hist[layer][0], k]), torch.cat([hist[layer][1], v])]
                new_k.append(k)
                new_v.append(v)
                seqs.append(SequenceKV(*hist[layer]))
            query = torch.randn(step.num_tokens, heads, dim, generator=gen)
            out = backend.forward(query, torch.cat(new_k), torch.cat(new_v), layer)
            q_lens = [q for _, q in requests]
            exact = oracle_attention(query, seqs, q_lens, scale=0.4)
            naive = naive_attention(query, seqs, q_lens, scale=0.4)
            result = compare(out, exact, naive, torch.float32)
            assert result.passed, result.describe()
        checked_steps += 1
    assert checked_steps == 5


# -- combined K/V caches: an engine's one [pages, 2, page_size, KV, D] tensor per layer ----

COMBINED_SCENARIOS = {
    "decode-per-rank": Scenario(
        dp_size=3,
        dp_rank=2,
        layout=PoolLayout.PER_RANK,
        page_size=3,
        total_pages=50,
        context_lens=(7, 12, 1, 20),
        query_lens=(1, 1, 1, 1),
    ),
    "mixed-shuffled": Scenario(
        page_size=5,
        context_lens=(1, 13, 8, 21, 6),
        query_lens=(1, 13, 3, 1, 6),
        shuffle_pages=True,
        dp_size=2,
        dp_rank=1,
    ),
    "graph-fp16": Scenario(
        dtype=torch.float16, pad_to=4, dp_size=2, dp_rank=1, context_lens=(6, 3), query_lens=(1, 3)
    ),
    "shared-prefix-strided-inputs": Scenario(
        shared_prefix=8, context_lens=(10, 12, 9), query_lens=(2, 3, 1), noncontiguous=True
    ),
    "non-causal-mqa-page-1": Scenario(
        causal=False,
        num_heads=8,
        num_kv_heads=1,
        head_dim=13,
        page_size=1,
        context_lens=(9, 7),
        query_lens=(3, 7),
    ),
}


def combined_tensor(cache) -> torch.Tensor:
    """The engine tensor whose halves ``cache`` holds (checked to be views, not copies)."""
    combined = cache.key._base
    assert combined is not None
    assert combined is cache.value._base
    assert combined.shape == (cache.num_pages, 2, *cache.key.shape[1:])
    assert cache.key.data_ptr() == combined[:, 0].data_ptr() == combined.data_ptr()
    assert cache.value.data_ptr() == combined[:, 1].data_ptr()
    storage = combined.untyped_storage().data_ptr()
    assert cache.key.untyped_storage().data_ptr() == storage
    assert cache.value.untyped_storage().data_ptr() == storage
    return combined


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("key", list(COMBINED_SCENARIOS))
def test_combined_kv_gives_the_contiguous_result(name, key):
    """Same outputs, bit for bit, and the same cache contents as separate contiguous tensors."""
    scenario = COMBINED_SCENARIOS[key]
    entry = default_registry().entry(name)
    plain = make_step_inputs(scenario)
    combined = make_step_inputs(replace(scenario, combined_kv=True))
    assert "combined-kv" in combined.scenario.describe()
    for cache in combined.caches:
        combined_tensor(cache)
        assert not cache.key.is_contiguous()
    expected = run_step("combined kv", entry, plain)
    outputs = run_step("combined kv", entry, combined)
    for a, b in zip(expected, outputs, strict=True):
        assert torch.equal(bits(a), bits(b))
    for layer, check in enumerate(check_outputs(combined, outputs)):
        assert check.checked_tokens > 0
        assert check.passed, f"layer {layer}: {check.describe()}"
    for ours, theirs in zip(combined.caches, plain.caches, strict=True):
        assert torch.equal(bits(ours.key), bits(theirs.key))
        assert torch.equal(bits(ours.value), bits(theirs.value))


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("layout", list(PoolLayout))
def test_combined_kv_writes_land_in_the_engine_tensor(name, layout):
    """forward(layer) changes that layer's combined tensor at its slots' K and V, nothing else."""
    scenario = Scenario(
        dp_size=3,
        dp_rank=1,
        layout=layout,
        num_layers=3,
        page_size=3,
        total_pages=30,
        pad_to=4,
        context_lens=(7, 4, 9),
        query_lens=(1, 4, 2),
        combined_kv=True,
    )
    inputs = make_step_inputs(scenario)
    engine = [combined_tensor(cache) for cache in inputs.caches]
    backend = make(name, scenario)
    backend.bind_kv_caches(inputs.caches)
    backend.prepare(inputs.step.metadata, graph_mode=True)
    slots = inputs.step.metadata.slot_mapping.tolist()
    written = [(token, slot) for token, slot in enumerate(slots) if slot != -1]
    assert len(written) == 7
    size = scenario.page_size
    for layer in range(scenario.num_layers):
        before = [bits(t) for t in engine]
        canary_before = [(bits(c.key), bits(c.value)) for c in inputs.caches]
        backend.forward(inputs.queries[layer], inputs.keys[layer], inputs.values[layer], layer)
        for other, (tensor, old) in enumerate(zip(engine, before, strict=True)):
            changed = (bits(tensor) != old).flatten(3).any(-1)  # [page, K/V, offset]
            expect = torch.zeros_like(changed)
            if other == layer:
                base = inputs.caches[other].page_offset * size
                for token, slot in written:
                    page, offset = divmod(slot - base, size)
                    expect[page, :, offset] = True
                    assert torch.equal(tensor[page, 0, offset], inputs.keys[layer][token])
                    assert torch.equal(tensor[page, 1, offset], inputs.values[layer][token])
            assert torch.equal(changed, expect), f"forward({layer}) changed layer {other}"
        # the canary helper of the conformance suite sees the same thing through the views
        seen = changed_slots(inputs.caches, canary_before)
        assert seen == [{s for _, s in written} if i == layer else set() for i in range(3)]


@pytest.mark.parametrize("name", BACKENDS)
def test_combined_kv_passes_the_properties(name):
    entry = default_registry().entry(name)
    scenario = replace(COMBINED_SCENARIOS["mixed-shuffled"], combined_kv=True, pad_to=6)
    properties.check_matches_oracle(entry, scenario)
    properties.check_only_mapped_slots_change(entry, scenario)
    properties.check_inputs_unmodified(entry, scenario)
    properties.check_page_order_irrelevant(entry, scenario)
    properties.check_layouts_agree(entry, scenario)
    properties.check_deterministic(entry, scenario)
    rejection_properties.check_rejects_foreign_pages(entry, scenario)
    ranks = [replace(scenario, dp_rank=r) for r in range(scenario.dp_size)]
    properties.check_every_rank_matches_oracle(entry, ranks)


@pytest.mark.parametrize(
    ("mutant", "changes", "check"),
    [
        (DropsLastToken, {}, "check_matches_oracle"),
        (ReadsWholeLastPage, {}, "check_matches_oracle"),
        (AssumesContiguousPages, {"shuffle_pages": True}, "check_matches_oracle"),
        (IgnoresPageOffset, {"layout": PoolLayout.PER_RANK}, "check_matches_oracle"),
        (WritesPaddingSlots, {"pad_to": 6}, "check_only_mapped_slots_change"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else None,
)
def test_mutants_keep_their_bugs_on_combined_kv(mutant, changes, check):
    """``cache_rows`` / ``write_rows`` overrides still reach the combined tensor, bug and all."""
    entry = BackendEntry(mutant.__name__, mutant, "test")
    scenario = replace(COMBINED_SCENARIOS["mixed-shuffled"], combined_kv=True, **changes)
    with pytest.raises((properties.PropertyFailure, IndexError)):
        getattr(properties, check)(entry, scenario)


# -- a subclass's capabilities() override keeps the base's device claim --------------


@pytest.mark.parametrize("base_devices", [("cpu", "cuda"), ("cpu",)])
def test_capabilities_override_keeps_the_base_device_claim(monkeypatch, base_devices):
    """The natural override (a fresh ``Capabilities``) claims exactly the base's devices."""
    monkeypatch.setattr(PagedBackendBase, "devices", base_devices)

    class Fp32(PagedBackendBase):
        @classmethod
        def capabilities(cls) -> Capabilities:
            return Capabilities(dtypes=(torch.float32,), page_sizes=(16,))

    class Fp32Child(Fp32):
        pass

    class StaticFp32(ReferenceBackend):
        @staticmethod
        def capabilities() -> Capabilities:
            return Capabilities(dtypes=(torch.float32,))

    class ReplacesBase(SdpaBackend):
        @classmethod
        def capabilities(cls) -> Capabilities:
            return dataclasses.replace(super().capabilities(), dtypes=(torch.float32,))

    base = capabilities_of(PagedBackendBase).devices
    assert base == base_devices
    for cls in (Fp32, Fp32Child, StaticFp32, ReplacesBase, ReferenceBackend, SdpaBackend):
        caps = capabilities_of(cls)
        assert caps.devices == base, cls.__name__
        assert ("cuda" in caps.devices) == ("cuda" in base)
    caps = capabilities_of(Fp32)
    assert (caps.dtypes, caps.page_sizes) == ((torch.float32,), (16,))
    assert capabilities_of(ReplacesBase).dtypes == (torch.float32,)


def test_subclass_narrows_devices_with_the_class_attribute_or_its_own_claim():
    class CpuOnly(ReferenceBackend):
        devices = ("cpu",)

        @classmethod
        def capabilities(cls) -> Capabilities:
            return Capabilities(dtypes=(torch.float32,))

    class CpuOnlyNoOverride(SdpaBackend):
        devices = ("cpu",)

    class CudaOnly(ReferenceBackend):
        @classmethod
        def capabilities(cls) -> Capabilities:
            return Capabilities(devices=("cuda",))

    assert capabilities_of(CpuOnly).devices == ("cpu",)
    assert capabilities_of(CpuOnlyNoOverride).devices == ("cpu",)
    assert capabilities_of(CudaOnly).devices == ("cuda",)
    assert capabilities_of(ReferenceBackend).devices == ("cpu", "cuda")


def test_capabilities_override_of_the_wrong_type_is_still_reported():
    class Wrong(ReferenceBackend):
        @classmethod
        def capabilities(cls) -> dict:  # type: ignore[override]
            return {"dtypes": (torch.float32,)}

    with pytest.raises(TypeError, match=r"Wrong\.capabilities\(\) returned dict"):
        capabilities_of(Wrong)


def test_a_subclass_without_attend_is_refused_when_built():
    class Forgot(PagedBackendBase):
        def attention(self, query, cache, step):  # misnamed: attend is the hook
            return query

    with pytest.raises(TypeError, match=r"Forgot does not implement attend\(query, cache, step\)"):
        Forgot(num_heads=1, num_kv_heads=1, head_dim=8, scale=0.3)
    with pytest.raises(TypeError, match="does not implement attend"):
        PagedBackendBase(num_heads=1, num_kv_heads=1, head_dim=8, scale=0.3)
