"""The ``compiled`` backend (C++ kernel) against the float64 oracle, on the shapes it special-cases.

The kernel has paths of its own that the generic backend tests would not
single out: direct fp32 rows versus converted fp16/bf16 or strided rows,
AVX2 micro-kernels with tails (head dims and GQA groups not multiples of
their widths), key blocks crossing pages of any size, KV heads grouped per
work item, and split keys merged in a second pass (few sequences).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from harness import Capabilities, PoolLayout
from harness.numerics.canary import bits
from harness.numerics.scenario import Scenario, check_outputs, make_step_inputs, run_scenario
from reference_backends import compiled
from reference_backends.compiled import CompiledBackend, build_plan


def make(scenario: Scenario, **kwargs) -> CompiledBackend:
    return CompiledBackend(
        num_heads=scenario.num_heads,
        num_kv_heads=scenario.num_kv_heads,
        head_dim=scenario.head_dim,
        scale=scenario.softmax_scale,
        dp_size=scenario.dp_size,
        dp_rank=scenario.dp_rank,
        **kwargs,
    )


def assert_matches_oracle(scenario: Scenario) -> list[torch.Tensor]:
    inputs, outputs = run_scenario(make, scenario)
    for layer, check in enumerate(check_outputs(inputs, outputs)):
        assert check.checked_tokens > 0
        assert check.passed, f"layer {layer}: {check.describe()}"
    return outputs


BASE = Scenario(num_heads=8, num_kv_heads=2, head_dim=16, page_size=3, total_pages=120)

SHAPES = {
    "decode": {"context_lens": (7, 12, 1, 20), "query_lens": (1, 1, 1, 1)},
    "prefill": {"context_lens": (5, 40, 3), "query_lens": (5, 40, 3)},
    "extend": {"context_lens": (9, 16, 70), "query_lens": (4, 5, 33)},
    "mixed": {"context_lens": (1, 13, 8, 21, 6), "query_lens": (1, 13, 3, 1, 6)},
    "page 1": {"page_size": 1, "total_pages": 200, "context_lens": (37, 5), "query_lens": (1, 5)},
    "page 256": {
        "page_size": 256,
        "total_pages": 6,
        "context_lens": (300, 257, 2),
        "query_lens": (1, 30, 2),
    },
    "page 5, ends on a page": {
        "page_size": 5,
        "context_lens": (10, 5, 15),
        "query_lens": (1, 5, 3),
    },
    "mqa 32 heads": {"num_heads": 32, "num_kv_heads": 1},
    "gqa 16": {"num_heads": 32, "num_kv_heads": 2, "query_lens": (1, 9)},
    "gqa 3, head dim 13": {"num_heads": 6, "num_kv_heads": 2, "head_dim": 13},
    "mha, head dim 67": {"num_heads": 3, "num_kv_heads": 3, "head_dim": 67},
    "head dim 128": {"head_dim": 128, "context_lens": (33, 70), "query_lens": (1, 70)},
    "non-causal": {"causal": False, "context_lens": (9, 7), "query_lens": (3, 7)},
    "large logits": {"magnitude": 30.0, "scale": 2.0},
    "shuffled pages": {"shuffle_pages": True, "context_lens": (19, 30), "query_lens": (2, 30)},
    "shared prefix": {"shared_prefix": 6, "context_lens": (10, 12, 9), "query_lens": (1, 2, 1)},
    # the wide-rows path (16+ query rows of a KV head: rows in vectors, padded to whole ones)
    "wide rows, 17 of them": {
        "num_heads": 1,
        "num_kv_heads": 1,
        "context_lens": (17, 50),
        "query_lens": (17, 17),
    },
    "wide rows, many blocks": {
        "head_dim": 128,
        "context_lens": (200, 131),
        "query_lens": (70, 131),
        "page_size": 7,
    },
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_matches_oracle(shape, dtype):
    assert_matches_oracle(replace(BASE, dtype=dtype, **SHAPES[shape]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_caches_and_views(dtype):
    """Halves of one [pages, 2, ...] tensor per layer (no flat view) and strided q/k/v."""
    scenario = replace(BASE, combined_kv=True, noncontiguous=True, dtype=dtype, **SHAPES["extend"])
    inputs = make_step_inputs(scenario)
    assert not inputs.caches[0].key.is_contiguous()
    assert_matches_oracle(scenario)


def test_non_unit_head_dim_stride():
    """A cache whose last dimension is strided is read element by element, still right."""
    scenario = replace(BASE, **SHAPES["mixed"])
    inputs = make_step_inputs(scenario)
    caches = []
    for cache in inputs.caches:
        wide = torch.full((*cache.key.shape[:3], 2 * cache.key.shape[3]), float("nan"))
        key, value = wide.clone(), wide.clone()
        key[..., ::2] = cache.key
        value[..., ::2] = cache.value
        caches.append(replace(cache, key=key[..., ::2], value=value[..., ::2]))
    backend = make(scenario)
    backend.bind_kv_caches(caches)
    backend.prepare(inputs.step.metadata)
    outputs = [backend.forward(*inputs.forward_args(n), n) for n in range(scenario.num_layers)]
    assert all(check.passed for check in check_outputs(inputs, outputs))


@pytest.mark.parametrize(("dp_size", "dp_rank"), [(2, 1), (3, 0), (3, 2), (8, 5)])
@pytest.mark.parametrize("layout", list(PoolLayout))
def test_every_rank_and_layout(dp_size, dp_rank, layout):
    """Per-rank pools bind pages from page_offset on: block-table ids are global."""
    scenario = replace(
        BASE,
        dp_size=dp_size,
        dp_rank=dp_rank,
        layout=layout,
        seed=dp_rank,
        total_pages=203,
        **SHAPES["mixed"],
    )
    assert_matches_oracle(scenario)


def test_nan_poisoned_tails_never_reach_the_output():
    """Last pages end mid-page; everything past the tokens is NaN (make_layer_caches' fill)."""
    scenario = replace(BASE, page_size=7, context_lens=(8, 13, 29), query_lens=(1, 13, 2))
    inputs = make_step_inputs(scenario)
    assert torch.isnan(inputs.caches[0].key).any()
    outputs = assert_matches_oracle(scenario)
    assert all(torch.isfinite(out).all() for out in outputs)


def test_graph_mode_padding_rows_write_nothing():
    scenario = replace(BASE, pad_to=6, pad_query_len=2, dp_size=2, dp_rank=1, **SHAPES["decode"])
    inputs = make_step_inputs(scenario)
    before = [bits(cache.key) for cache in inputs.caches]
    backend = make(scenario)
    backend.bind_kv_caches(inputs.caches)
    backend.prepare(inputs.step.metadata, graph_mode=True)
    outputs = [backend.forward(*inputs.forward_args(n), n) for n in range(scenario.num_layers)]
    assert all(check.passed for check in check_outputs(inputs, outputs))
    real = inputs.step.metadata.slot_mapping != -1
    for layer, cache in enumerate(inputs.caches):
        changed = (bits(cache.key) != before[layer]).any(dim=(2, 3)).flatten()
        slots = inputs.step.metadata.slot_mapping[real]
        assert set(changed.nonzero().flatten().tolist()) <= set(slots.tolist())
        assert torch.isfinite(outputs[layer]).all()  # padding rows come back zeroed


def test_long_contexts_split_keys_and_merge():
    """One or two long sequences split their keys across items; the merge is exact enough."""
    scenario = replace(
        BASE,
        page_size=16,
        total_pages=200,
        head_dim=64,
        context_lens=(1500, 700),
        query_lens=(1, 3),
        num_layers=1,
    )
    inputs = make_step_inputs(scenario)
    backend = make(scenario)
    backend.bind_kv_caches(inputs.caches)
    backend.prepare(inputs.step.metadata)
    assert backend._step is not None
    assert backend._step.plan.merges.shape[0] > 0  # the split path is what this test runs
    assert_matches_oracle(scenario)


def test_plan_groups_kv_heads_for_decode_and_splits_only_when_few_items():
    scenario = replace(BASE, num_heads=32, num_kv_heads=8, page_size=16, total_pages=300)
    decode = replace(scenario, context_lens=(2048, 2048), query_lens=(1, 1), num_layers=1)
    inputs = make_step_inputs(decode)
    backend = make(decode)
    backend.bind_kv_caches(inputs.caches)
    from harness.core.validate import read_metadata

    checked = read_metadata(inputs.step.metadata, page_size=16)
    geometry = backend._require_bound()
    plan = build_plan(checked, geometry, num_heads=32, num_kv_heads=8, num_threads=2)
    assert plan.heads_per_item == 8  # all 8 KV heads of a tile run together
    assert plan.merges.shape[0] == 2  # 2 items for 2 threads: each sequence's keys split
    many = build_plan(checked, geometry, num_heads=32, num_kv_heads=8, num_threads=1)
    assert many.merges.shape[0] == 0 or many.tiles.shape[0] >= 4


def test_second_run_is_bit_identical_and_threads_agree():
    scenario = replace(BASE, context_lens=(600, 40), query_lens=(1, 40), page_size=8)
    inputs = make_step_inputs(scenario)
    backend = make(scenario)
    backend.bind_kv_caches(inputs.caches)
    backend.prepare(inputs.step.metadata)
    args = inputs.forward_args(0)
    first = backend.forward(*args, 0)
    assert torch.equal(bits(first), bits(backend.forward(*args, 0)))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        backend.prepare(inputs.step.metadata)
        other = backend.forward(*args, 0)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(other, first, rtol=1e-5, atol=1e-5)


def test_validate_false_gives_the_same_output():
    scenario = replace(BASE, **SHAPES["mixed"])
    _, checked = run_scenario(make, scenario)
    _, unchecked = run_scenario(lambda s: make(s, validate=False), scenario)
    for a, b in zip(checked, unchecked, strict=True):
        assert torch.equal(a, b)


def test_capabilities_claim_the_cpu_and_three_dtypes():
    caps = CompiledBackend.capabilities()
    assert isinstance(caps, Capabilities)
    assert caps.devices == ("cpu",)
    assert set(caps.dtypes) == {torch.float32, torch.float16, torch.bfloat16}
    assert caps.page_sizes is None
    assert caps.head_dims is None
    assert caps.graph_mode


def test_build_is_cached_and_named_by_its_inputs():
    compiled.load_library()
    info = compiled._build()
    assert info.cached
    assert info.seconds == 0.0
    assert info.path.parent == compiled.build_dir()
    assert info.path.exists()


def test_missing_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(compiled.shutil, "which", lambda name: None)
    with pytest.raises(compiled.CompilerUnavailable, match="no compiler"):
        compiled._compiler()
