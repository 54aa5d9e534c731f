"""The ``triton`` backend on the CPU (Triton's interpreter) against the float64 oracle.

Each case aims at one of the kernels' own thresholds: the split-KV merge
past 256 keys, a query tile's edge, a GQA group padded to a power of two,
a head dim that is not one, strided and per-rank caches, graph-mode padding.
The conformance suite covers the rest; these name the kernel path that broke.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from harness import DPBackendConfig, PoolLayout, Unsupported, create_attention_backend
from harness.core.kv_pages import make_layer_caches
from harness.core.variants import AttentionVariant
from harness.numerics.scenario import Scenario, check_outputs, run_scenario
from reference_backends.triton_backend import MIN_SPLIT_KEYS, TritonBackend

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="the triton extra is not installed"
)


def make(s: Scenario, **kwargs) -> TritonBackend:
    backend = create_attention_backend(
        "triton",
        num_heads=s.num_heads,
        num_kv_heads=s.num_kv_heads,
        head_dim=s.head_dim,
        scale=s.softmax_scale,
        dp_config=DPBackendConfig(s.dp_size, s.dp_rank),
        **(s.variant.constructor_kwargs(s.device) | kwargs),
    )
    assert isinstance(backend, TritonBackend)
    return backend


def assert_matches_oracle(scenario: Scenario) -> TritonBackend:
    made: list[TritonBackend] = []
    inputs, outputs = run_scenario(lambda s: made.append(make(s)) or made[-1], scenario)
    for layer, check in enumerate(check_outputs(inputs, outputs)):
        assert check.checked_tokens > 0
        assert check.passed, f"layer {layer}: {check.describe()}"
    return made[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_long_decode_is_split_and_merged(dtype):
    scenario = Scenario(
        num_heads=4,
        num_kv_heads=1,
        head_dim=32,
        page_size=16,
        total_pages=200,
        num_layers=1,
        context_lens=(3 * MIN_SPLIT_KEYS + 5, 40, MIN_SPLIT_KEYS + 1),
        query_lens=(1, 1, 1),
        dtype=dtype,
    )
    backend = assert_matches_oracle(scenario)
    plan = backend._step.plan
    assert plan.num_splits == 4  # the longest context's splits; shorter rows leave some empty
    assert plan.part_out is not None


@pytest.mark.parametrize("query_len", [15, 16, 17, 65])
def test_prefill_tiles_end_where_the_query_ends(query_len):
    scenario = Scenario(
        num_heads=6,
        num_kv_heads=2,  # group 3: padded to 4 rows per token in a tile
        head_dim=24,  # not a power of two: padded and masked
        page_size=5,
        total_pages=120,
        num_layers=1,
        context_lens=(query_len + 70, query_len),
        query_lens=(query_len, query_len),
        dtype=torch.float16,
    )
    assert_matches_oracle(scenario)


def test_wide_gqa_group_and_non_causal_extend():
    scenario = Scenario(
        num_heads=16,
        num_kv_heads=1,
        head_dim=16,
        page_size=7,
        total_pages=80,
        num_layers=2,
        context_lens=(40, 9, 33),
        query_lens=(6, 1, 33),
        causal=False,
    )
    assert_matches_oracle(scenario)


@pytest.mark.parametrize("combined_kv", [False, True])
def test_per_rank_pool_with_strided_inputs(combined_kv):
    scenario = Scenario(
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        page_size=3,
        total_pages=90,
        context_lens=(7, 12, 20),
        query_lens=(1, 4, 20),
        dp_size=3,
        dp_rank=2,
        layout=PoolLayout.PER_RANK,
        noncontiguous=True,
        combined_kv=combined_kv,
        shuffle_pages=True,
    )
    assert_matches_oracle(scenario)


def test_rows_far_below_zero_after_a_tile_they_cannot_see():
    """A prefill row whose first key tiles lie outside its window, logits all near -6e4:
    its running max stays -inf over those tiles (a finite stand-in zeroed such rows)."""
    assert_matches_oracle(
        Scenario(
            num_heads=1,
            num_kv_heads=1,
            head_dim=64,
            page_size=1,
            total_pages=300,
            num_layers=1,
            context_lens=(257,),
            query_lens=(257,),
            logit_offsets=(-6e4,),
            variant=AttentionVariant(sliding_window=3),
            seed=11,
        )
    )


def test_graph_mode_padding_rows_are_not_scheduled():
    scenario = Scenario(
        context_lens=(9, 4),
        query_lens=(1, 4),
        pad_to=5,
        pad_query_len=2,
        page_size=4,
    )
    backend = assert_matches_oracle(scenario)
    plan = backend._step.plan
    assert plan.decode_rows.tolist() == [0]
    assert sorted(set(plan.tile_rows.tolist())) == [1]
    assert not plan.all_tokens_covered  # padded tokens exist: the output is zero-filled


def test_float64_cache_is_refused_as_unsupported():
    backend = make(Scenario())
    caches = make_layer_caches(
        num_layers=1,
        total_pages=8,
        page_size=4,
        num_kv_heads=2,
        head_dim=16,
        dtype=torch.float64,
    )
    with pytest.raises(Unsupported, match="float64"):
        backend.bind_kv_caches(caches)


def test_capabilities_say_the_cpu_is_interpreted():
    caps = TritonBackend.capabilities()
    assert "cpu" in caps.devices
    assert caps.interpreted_devices == ("cpu",)


def test_cpu_use_after_a_compiled_triton_import_is_refused_clearly():
    """Triton fixes interpret-or-compile at its first import; a late CPU use cannot switch."""
    code = (
        "import triton, torch\n"
        "from harness.numerics.scenario import Scenario, run_scenario\n"
        "from reference_backends.triton_backend import TritonBackend\n"
        "s = Scenario()\n"
        "try:\n"
        "    run_scenario(lambda s: TritonBackend(num_heads=4, num_kv_heads=2, head_dim=16,"
        " scale=0.25), s)\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert result.stdout.startswith("Unsupported")
    assert "TRITON_INTERPRET=1" in result.stdout


def test_without_the_triton_package_it_claims_no_device_and_says_what_to_install(monkeypatch):
    import reference_backends.triton_backend as module

    monkeypatch.setattr(module, "_triton_available", lambda: False)
    assert TritonBackend.capabilities().devices == ()
    with pytest.raises(Unsupported, match=r"attn-harness\[triton\]"):
        make(Scenario())


GPT_OSS_LIKE = AttentionVariant(
    sliding_window=7, logits_soft_cap=2.0, sinks=(1.0, -1.0, 0.5, 6.0), alibi_slopes=None
)
VARIANTS = {
    "window": AttentionVariant(sliding_window=5),
    "soft-cap": AttentionVariant(logits_soft_cap=3.0),
    "sinks": AttentionVariant(sinks=(0.5, -1.0, 6.0, 0.0)),
    "alibi": AttentionVariant(alibi_slopes=(0.5, 0.25, -0.1, 0.0)),
    "window+soft-cap+sinks": GPT_OSS_LIKE,
}


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize(
    ("contexts", "queries", "layout"),
    [((300, 20), (1, 20), "NHD"), ((600,), (1,), "HND"), ((9, 12), (9, 4), "HND")],
    ids=["split-decode+prefill", "split-decode-hnd", "prefill+extend-hnd"],
)
def test_variants_match_the_oracle(name, contexts, queries, layout):
    """Window, soft-cap, sinks and ALiBi in the decode kernel, its split merge and prefill."""
    scenario = Scenario(
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        page_size=4,
        total_pages=300,
        num_layers=1,
        context_lens=contexts,
        query_lens=queries,
        dtype=torch.float16,
        planted_keys=2,
        variant=VARIANTS[name],
        cache_layout=layout,
        combined_kv=layout == "HND",
    )
    assert_matches_oracle(scenario)
