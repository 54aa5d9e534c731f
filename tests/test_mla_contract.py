"""The MLA kind in the contract: claims, constructor checks, latent caches, the kit's write,
and that nothing draws one kind for a backend of the other."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from harness import Capabilities, Unsupported, make_layer_caches, validate_backend_args
from harness.conformance.strategies import geometries, production_geometries
from harness.core.errors import CacheBindingError
from harness.core.kv_pages import write_tokens
from harness.core.registry import BackendEntry
from harness.numerics.latent import for_kind, latent_pairs
from harness.numerics.scenario import Scenario, backend_for, check_outputs, run_scenario
from reference_backends import ReferenceBackend, ReferenceMlaBackend

MLA = Capabilities(kind="mla")
VLLM_CPU_MLA = Capabilities(kind="mla", head_dims=(576,), kv_lora_ranks=(512,), page_sizes=(16,))


def test_the_kind_is_checked_and_ranks_are_an_mla_claim():
    with pytest.raises(ValueError, match="kind"):
        Capabilities(kind="gqa")
    with pytest.raises(ValueError, match="kv_lora_ranks"):
        Capabilities(kv_lora_ranks=(512,))
    assert VLLM_CPU_MLA.allows_latent(576, 512)
    assert not VLLM_CPU_MLA.allows_latent(320, 256)  # Mistral-Small-4's: not claimed
    assert not MLA.allows_latent(24, 24)  # a value row as wide as the latent row: no rope


def test_each_kind_refuses_the_other():
    assert MLA.unsupported_reason(dtype=torch.float32) == (
        "unsupported MHA attention (an MLA backend)"
    )
    assert Capabilities().unsupported_reason(kv_lora_rank=16) == "unsupported MLA attention"
    assert MLA.unsupported_reason(head_dim=24, kv_lora_rank=16) is None
    with pytest.raises(Unsupported, match="MLA attention"):
        ReferenceBackend(num_heads=2, num_kv_heads=1, head_dim=24, scale=0.2, kv_lora_rank=16)
    with pytest.raises(Unsupported, match="MHA attention"):
        ReferenceMlaBackend(num_heads=2, num_kv_heads=1, head_dim=24, scale=0.2)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"kv_lora_rank": 24}, "kv_lora_rank"),  # the whole row: no rope part left
        ({"kv_lora_rank": 0}, "kv_lora_rank"),
        ({"kv_lora_rank": 8.0}, "kv_lora_rank"),
        ({"kv_lora_rank": 16, "num_kv_heads": 2, "num_heads": 4}, "num_kv_heads"),
    ],
)
def test_bad_mla_constructor_values_name_the_field(kwargs, field):
    args = {"num_heads": 2, "num_kv_heads": 1, "head_dim": 24, "scale": 0.2} | kwargs
    with pytest.raises(ValueError, match=field):
        validate_backend_args(**args)


def test_an_fp8_latent_cache_has_one_scale():
    with pytest.raises(ValueError, match="one scale"):
        ReferenceMlaBackend(
            num_heads=2, num_kv_heads=1, head_dim=24, scale=0.2, kv_lora_rank=16,
            kv_cache_dtype="fp8_e4m3", k_scale=0.5, v_scale=0.25,
        )  # fmt: skip


def test_a_latent_cache_is_one_tensor_whose_value_is_its_prefix():
    (cache,) = make_layer_caches(
        num_layers=1, total_pages=3, page_size=4, num_kv_heads=1, head_dim=24, value_dim=16
    )
    assert cache.latent.shape == (3, 4, 24)
    assert cache.value_dim == 16
    assert cache.value.data_ptr() == cache.key.data_ptr()
    rows = torch.randn(2, 1, 24)
    write_tokens(cache, torch.tensor([1, 6]), rows, rows[..., :16])
    assert torch.equal(cache.latent[0, 1], rows[0, 0])
    assert torch.equal(cache.value[1, 2, 0], rows[1, 0, :16])  # the same memory


def test_a_value_tensor_of_its_own_is_refused_for_mla():
    (cache,) = make_layer_caches(
        num_layers=1, total_pages=3, page_size=4, num_kv_heads=1, head_dim=24, value_dim=16
    )
    separate = type(cache)(key=cache.key, value=cache.value.clone())
    backend = ReferenceMlaBackend(
        num_heads=2, num_kv_heads=1, head_dim=24, scale=0.2, kv_lora_rank=16
    )
    with pytest.raises(CacheBindingError, match="view"):
        backend.bind_kv_caches([separate])
    backend.bind_kv_caches([cache])


def test_the_kit_writes_one_latent_row_per_token_and_returns_the_value_width():
    entry = BackendEntry("reference-mla", ReferenceMlaBackend, "built-in")
    s = Scenario(
        num_heads=3, num_kv_heads=1, head_dim=13, kv_lora_rank=8, page_size=3,
        context_lens=(7, 2), query_lens=(2, 2), num_layers=1,
    )  # fmt: skip
    inputs, outputs = run_scenario(lambda sc: backend_for(entry, sc), s)
    assert outputs[0].shape == (4, 3, 8)
    assert all(c.passed for c in check_outputs(inputs, outputs))
    latent = inputs.caches[0].latent.flatten(0, 1)
    for token, slot in enumerate(inputs.step.metadata.slot_mapping.tolist()):
        assert torch.equal(latent[slot], inputs.keys[0][token, 0])


@settings(max_examples=30, deadline=None, database=None)
@given(geometries(MLA))
def test_an_mla_claim_draws_only_latent_steps(scenario):
    assert scenario.kv_lora_rank is not None
    assert scenario.num_kv_heads == 1
    assert not scenario.combined_kv
    pair = (scenario.kv_lora_rank, scenario.head_dim - scenario.kv_lora_rank)
    assert pair in latent_pairs(MLA)


@settings(max_examples=20, deadline=None, database=None)
@given(production_geometries(VLLM_CPU_MLA, "head-geometry"))
def test_a_served_models_latent_geometry_is_drawn_in_production(scenario):
    assert (scenario.head_dim, scenario.kv_lora_rank, scenario.page_size) == (576, 512, 16)
    assert scenario.num_heads in (16, 64, 128)  # DeepSeek-V3 (TP 8 or whole), Kimi K2


@settings(max_examples=30, deadline=None, database=None)
@given(geometries(Capabilities()))
def test_an_mha_claim_never_draws_a_latent_step(scenario):
    assert scenario.kv_lora_rank is None
    assert for_kind(Capabilities(), scenario) is scenario
