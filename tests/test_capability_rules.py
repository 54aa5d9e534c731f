"""Claims as kernels state them: rules on shapes, per-device dtypes, variant pairs, logit bounds."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.conformance.check_matrix import quick_coverage
from harness.conformance.coverage_promises import requirements
from harness.conformance.step_strategies import production_scenarios, scenarios
from harness.conformance.strategies import CI_BUDGET
from harness.core.contract import Capabilities
from harness.core.registry import BackendEntry
from harness.dist.claims import claim_problems, fit_claim
from harness.dist.schedule import DistSetup
from harness.numerics.logit_shaping import logit_reach
from reference_backends import ReferenceBackend

FAST = settings(
    max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
RULED = Capabilities(page_size_multiple=16, head_dim_multiple=16, min_head_dim=32)
VARIANTS = Capabilities(
    sliding_window=True,
    soft_cap=True,
    sinks=True,
    alibi=True,
    min_sliding_window=2,
    incompatible=("alibi+sinks",),
    soft_cap_logit_bound=20.0,
)
FP8_PAGES = Capabilities(  # vLLM's CPU kernel: pages of 16 on its vec16 path, which has no FP8
    page_size_multiple=16, fp8_page_size_multiple=32, kv_cache_dtypes=("auto", "fp8_e4m3")
)
FP8_ONLY = Capabilities(
    page_size_multiple=16, fp8_page_size_multiple=32, kv_cache_dtypes=("fp8_e4m3",)
)
BY_DEVICE = Capabilities(
    devices=("cpu", "cuda"), dtypes_by_device={"cpu": (torch.float32, torch.float16)}
)


def test_new_fields_default_to_no_rule():
    caps = Capabilities()
    assert caps.allows_page_size(3)
    assert caps.allows_head_dim(5)
    assert caps.dtypes_on("cpu") == caps.dtypes
    assert caps.allows_variants(["alibi", "sinks"])
    assert caps.unsupported_reason(page_size=3, head_dim=5, window=1) is None


def test_shape_rules_narrow_the_claim():
    assert RULED.unsupported_reason(page_size=32, head_dim=64) is None
    assert RULED.unsupported_reason(page_size=8) == "unsupported page_size 8"
    assert RULED.unsupported_reason(head_dim=16) == "unsupported head_dim 16"  # under 32
    assert RULED.unsupported_reason(head_dim=40) == "unsupported head_dim 40"  # not x16


def test_dtypes_differ_by_device():
    assert BY_DEVICE.dtypes_on("cpu") == (torch.float32, torch.float16)
    assert torch.bfloat16 in BY_DEVICE.dtypes_on("cuda")
    reason = BY_DEVICE.unsupported_reason(dtype=torch.bfloat16, device="cpu")
    assert reason == "unsupported dtype torch.bfloat16 on 'cpu'"
    assert BY_DEVICE.unsupported_reason(dtype=torch.bfloat16, device="cuda") is None


def test_variant_rules_refuse_what_the_kernel_does_not_serve():
    assert VARIANTS.unsupported_reason(alibi=True, sinks=True) == (
        "unsupported the combination sinks+alibi"
    )
    assert VARIANTS.unsupported_reason(alibi=True, soft_cap=True) is None
    assert VARIANTS.unsupported_reason(sliding_window=True, window=1) == (
        "unsupported sliding_window 1 < 2"
    )


def test_a_constructor_refuses_an_incompatible_pair():
    class NoAlibiWithSinks(ReferenceBackend):
        @classmethod
        def capabilities(cls) -> Capabilities:
            return Capabilities(alibi=True, sinks=True, incompatible=("alibi+sinks",))

    from harness.core.errors import Unsupported

    with pytest.raises(Unsupported, match="sinks\\+alibi"):
        NoAlibiWithSinks(
            num_heads=2,
            num_kv_heads=1,
            head_dim=8,
            scale=0.3,
            sinks=torch.zeros(2),
            alibi_slopes=torch.ones(2),
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"incompatible": ("alibi",)}, "not two of"),
        ({"incompatible": ("alibi+window",)}, "not two of"),
        ({"page_size_multiple": 0}, "page_size_multiple"),
        ({"fp8_page_size_multiple": 0}, "fp8_page_size_multiple"),
        ({"min_head_dim": 0}, "min_head_dim"),
        ({"soft_cap_logit_bound": 0.0}, "soft_cap_logit_bound"),
    ],
)
def test_a_bad_rule_names_itself(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Capabilities(**kwargs)


@FAST
@given(scenarios(RULED))
def test_plain_draws_keep_to_the_shape_rules(s):
    assert s.page_size % 16 == 0
    assert s.head_dim % 16 == 0
    assert s.head_dim >= 32


@FAST
@given(st.sampled_from(["page-sizes", "head-geometry", "long-context"]), st.data())
def test_production_draws_keep_to_the_shape_rules(regime, data):
    s = data.draw(production_scenarios(RULED, regime))
    assert s.page_size % 16 == 0
    assert s.head_dim % 16 == 0
    assert s.head_dim >= 32


def test_fp8_at_a_page_size_its_path_does_not_serve_is_outside_the_claim():
    assert FP8_PAGES.unsupported_reason(page_size=16) is None
    assert FP8_PAGES.unsupported_reason(page_size=64, kv_cache_dtype="fp8_e4m3") is None
    reason = FP8_PAGES.unsupported_reason(page_size=48, kv_cache_dtype="fp8_e4m3")
    assert reason == (
        "unsupported kv_cache_dtype 'fp8_e4m3' at page_size 48 (FP8 needs a multiple of 32)"
    )
    assert FP8_PAGES.fp8_page_size(16) == 32
    assert FP8_PAGES.fp8_page_size(64) == 64
    assert Capabilities(page_sizes=(16, 48, 96), fp8_page_size_multiple=32).fp8_page_size(16) == 96


@FAST
@given(st.sampled_from([FP8_PAGES, FP8_ONLY]), st.data())
def test_fp8_draws_keep_to_the_page_sizes_that_serve_them(caps, data):
    s = data.draw(scenarios(caps))
    assert s.page_size % 16 == 0
    if s.variant.quantized:
        assert s.page_size % 32 == 0


@FAST
@given(scenarios(BY_DEVICE))
def test_cpu_draws_take_the_cpu_dtypes(s):
    assert s.dtype in (torch.float32, torch.float16)


@FAST
@given(scenarios(VARIANTS))
def test_variant_draws_keep_to_the_variant_rules(s):
    v = s.variant
    assert not (v.alibi_slopes is not None and v.sinks is not None)
    assert v.sliding_window is None or v.sliding_window >= 2
    if v.logits_soft_cap is not None:
        assert logit_reach(s) <= 20.0 * v.logits_soft_cap


def test_variant_draws_still_reach_every_feature():
    seen: Counter[str] = Counter()

    @settings(FAST, max_examples=300)
    @given(scenarios(VARIANTS))
    def draw(s):
        v = s.variant
        seen.update(
            name
            for name, on in (
                ("window", v.sliding_window is not None),
                ("cap", v.logits_soft_cap is not None),
                ("sinks", v.sinks is not None),
                ("alibi", v.alibi_slopes is not None),
                ("cap+planted", v.logits_soft_cap is not None and s.planted_keys > 0),
            )
            if on
        )

    draw()
    assert {"window", "cap", "sinks", "alibi", "cap+planted"} <= set(seen), seen


def _promised(caps: Capabilities, dimension: str, device: str = "cpu") -> list[str]:
    """The values of ``dimension`` the ci profile promises inside ``caps``, in order."""
    found = requirements(
        caps,
        dp_aware=True,
        max_dp_size=CI_BUDGET.max_dp_size,
        max_context=CI_BUDGET.max_context,
        limit=CI_BUDGET.production,
        device=device,
    )
    return [r.wanted for r in found if r.dimension == dimension]


def test_coverage_promises_only_values_the_rules_allow():
    assert _promised(RULED, "page_size") == ["16"]
    assert _promised(RULED, "head_dim") == ["32", "64"]  # the plain draws' head dims, x16, >= 32
    assert _promised(BY_DEVICE, "dtype", device="cpu") == ["float32", "float16"]


def test_the_quick_check_keeps_to_the_rules():
    coverage = quick_coverage(RULED)
    assert all(p % 16 == 0 for p in coverage.page_sizes)
    assert all(d % 16 == 0 for d in coverage.head_dims)
    assert min(coverage.head_dims) >= 32
    assert quick_coverage(BY_DEVICE).dtypes == (torch.float32, torch.float16)


def test_a_dp_run_moves_inside_the_rules_and_names_what_it_cannot():
    class Ruled(ReferenceBackend):
        @classmethod
        def capabilities(cls) -> Capabilities:
            return RULED

    setup = fit_claim(DistSetup(dp_size=2, page_size=20, head_dim=8), RULED)
    assert (setup.page_size, setup.head_dim) == (16, 32)
    entry = BackendEntry("ruled", Ruled, "test")
    problems = claim_problems(
        entry,
        dtype=torch.float32,
        device="cpu",
        dp_sizes=[1],
        page_size=20,
        head_dim=8,
        longest=10,
    )
    assert problems == [
        "its page_size claim leaves out 20",
        "its head_dim claim leaves out 8",
    ]
