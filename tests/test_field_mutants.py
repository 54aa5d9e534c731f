"""Each field mutant is exact just outside the regime of its real bug and far off just inside.

The field mutants (``suites.mutants.field``) reproduce attention-kernel bugs
that shipped in engines; these cases prove each is detectable at a shape the
oracle can check cheaply: the check fails by orders of magnitude (or NaN)
inside the regime, and passes outside it.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from harness.core.registry import BackendEntry, load_backend_spec
from harness.core.variants import AttentionVariant, alibi_slopes_for
from harness.numerics.scenario import Scenario, backend_for, check_outputs, run_scenario
from harness.numerics.tolerance import Comparison
from reference_backends.reference import ReferenceBackend
from suites.mutants import backends
from suites.mutants import field as f
from suites.mutants.kill_matrix import mutant_specs

FAR_OFF = 100.0  # a triggered bug's worst error / bound: far beyond rounding
FAR_OFF_FAR_BELOW_ZERO = 20.0
"""Rows whose logits sit near -5e4 (``FiniteSentinelMax``) or -2e4 (``WindowMaskFinite``):
the bound charges fp32 rounding of logits that large (``2 sqrt(D) u32 |logit|`` times the
value scale, ~2.4e-2 of it at -5e4 and D=16), so even an all-zero output is at most ~40x
it; measured 38x and 57x."""
FAR_BELOW_OFFSET = {
    f.FiniteSentinelMax: FAR_OFF_FAR_BELOW_ZERO,
    f.WindowMaskFinite: FAR_OFF_FAR_BELOW_ZERO,
}

BASE = Scenario(num_heads=4, num_kv_heads=2, head_dim=16, page_size=16, num_layers=1)
LONG = replace(BASE, num_heads=2, num_kv_heads=1, head_dim=8, page_size=64, total_pages=40)


def decode(length: int, **kwargs: object) -> Scenario:
    """One decode row over ``length`` keys."""
    return replace(LONG, context_lens=(length,), query_lens=(1,), **kwargs)  # type: ignore[arg-type]


def prefill(length: int, **kwargs: object) -> Scenario:
    return replace(LONG, context_lens=(length,), query_lens=(length,), **kwargs)  # type: ignore[arg-type]


def rows(contexts: tuple[int, ...], queries: tuple[int, ...], **kwargs: object) -> Scenario:
    return replace(BASE, context_lens=contexts, query_lens=queries, **kwargs)  # type: ignore[arg-type]


def window(size: int, **kwargs: object) -> AttentionVariant:
    return AttentionVariant(sliding_window=size, **kwargs)  # type: ignore[arg-type]


def fp8(k_scale: float, v_scale: float) -> AttentionVariant:
    return AttentionVariant(kv_cache_dtype="fp8_e4m3", k_scale=k_scale, v_scale=v_scale)


SINKS = AttentionVariant(sinks=(2.0, 1.5, -1.0, 3.0))
ALIBI = AttentionVariant(alibi_slopes=alibi_slopes_for(4))
CAP = AttentionVariant(logits_soft_cap=5.0)
FAR_BELOW = (-1e5,)


def heads(num_heads: int, num_kv_heads: int) -> Scenario:
    return replace(BASE, num_heads=num_heads, num_kv_heads=num_kv_heads)


def head_dim(dim: int) -> Scenario:
    return replace(BASE, head_dim=dim, context_lens=(7, 20), query_lens=(1, 20))


def budget(sequences: int, length: int) -> Scenario:
    """``sequences`` prefills of ``length`` tokens: ``sequences * length`` query tokens."""
    pages = sequences * (length // 256 + 1) + 2
    return replace(
        LONG,
        num_heads=1,
        page_size=256,
        total_pages=pages,
        context_lens=(length,) * sequences,
        query_lens=(length,) * sequences,
    )


# mutant: (scenarios just outside its regime, scenarios just inside it)
CASES: dict[type, tuple[list[Scenario], list[Scenario]]] = {
    f.SplitKvEmptySplitNaN: (
        [decode(300), prefill(256), decode(200, variant=window(16))],
        [prefill(257), decode(600, variant=window(16))],
    ),
    f.MergeStartsEmptyNaN: (
        [prefill(300), decode(600, variant=window(400)), decode(200, variant=window(16))],
        [decode(600, variant=window(16))],
    ),
    f.SplitCountEmptyTail: (
        [decode(255), decode(257), decode(511)],
        [decode(256), decode(512)],
    ),
    f.FiniteSentinelMax: (
        [rows((9,), (9,), logit_offsets=(-1e3,)), rows((9,), (1,), logit_offsets=(-4e4,))],
        [
            rows((9,), (9,), logit_offsets=(-5.5e4,)),
            rows((5, 9), (1, 9), logit_offsets=(0, -5.5e4)),
        ],
    ),
    f.WindowMaskFinite: (
        [rows((20,), (1,), variant=window(4)), rows((20,), (20,), logit_offsets=FAR_BELOW)],
        [rows((20,), (1,), variant=window(4), logit_offsets=(-2e4,))],
    ),
    f.SoftCapAfterMaskInDecode: (
        [
            rows((20,), (1,), variant=CAP),
            rows((20,), (20,), variant=window(4, logits_soft_cap=5.0)),
        ],
        [rows((20,), (1,), variant=window(4, logits_soft_cap=5.0))],
    ),
    f.SoftCapIgnored: (
        [rows((5, 9), (1, 9))],
        [rows((5, 9), (1, 9), variant=CAP)],
    ),
    f.SinksIgnoredInPrefill: (
        [rows((5, 9), (1, 1), variant=SINKS), rows((5, 9), (1, 9))],
        [rows((9,), (9,), variant=SINKS), rows((12,), (4,), variant=SINKS)],
    ),
    f.AlibiDroppedInDecode: (
        [rows((9, 12), (9, 5), variant=ALIBI), rows((1,), (1,), variant=ALIBI), rows((20,), (1,))],
        [rows((20,), (1,), variant=ALIBI)],
    ),
    f.WindowIgnoredOnCachedPrefix: (
        [
            rows((20,), (10,), variant=window(20)),
            rows((20,), (20,), variant=window(4)),
            rows((20,), (1,), variant=window(4)),
        ],
        [rows((20,), (5,), variant=window(4))],
    ),
    f.Fp8ScalesIgnoredInRaggedPrefill: (
        [
            rows((20, 9), (5, 1), variant=fp8(0.0625, 0.5)),
            rows((9,), (9,), variant=fp8(1.0, 1.0)),
        ],
        [rows((9,), (9,), variant=fp8(0.0625, 0.5))],
    ),
    f.Fp8ScalesFallBackToOne: (
        [rows((5, 9), (1, 9), variant=fp8(1.0, 1.0))],
        [rows((9,), (1,), variant=fp8(0.0625, 0.5))],
    ),
    f.GqaGroupPaddedToPow2: (
        [heads(8, 2), heads(16, 2), heads(6, 1)],
        [heads(6, 2), heads(10, 2), heads(12, 2), heads(14, 2)],
    ),
    f.HeadDimTailUnmasked: (
        [head_dim(64), head_dim(128), head_dim(192), head_dim(13)],
        [head_dim(80), head_dim(96)],
    ),
    f.OutputChunkAtColumnZero: (
        [head_dim(96), head_dim(128)],
        [head_dim(192), head_dim(256)],
    ),
    f.PageTokensPast128Dropped: (
        [replace(decode(300), page_size=128, total_pages=8), replace(decode(128), page_size=256)],
        [replace(decode(129), page_size=256, total_pages=4)],
    ),
    f.CombinedKvBlockStrideAssumed: (
        [rows((5, 20), (1, 6))],
        [
            rows((5, 20), (1, 6), combined_kv=True),
            rows((40,), (1,), combined_kv=True, cache_layout="HND"),
        ],
    ),
    f.NewKvStridesAssumed: (
        [rows((5, 20), (1, 6))],
        [rows((5, 20), (1, 6), noncontiguous=True)],
    ),
    f.SpecVerifyNoCausal: (
        [rows((20,), (4,)), rows((20, 30), (4, 3)), rows((20, 30), (9, 9)), rows((5, 9), (1, 1))],
        [rows((20, 30), (4, 4)), rows((10, 11, 12), (2, 2, 2))],
    ),
    f.SpecVerifyPaddedQStride: (
        [rows((20, 30), (4, 4)), rows((20, 30), (8, 8)), rows((20,), (5,))],
        [rows((20, 30), (5, 5)), rows((10, 11, 12), (3, 3, 3)), rows((20, 30), (7, 7))],
    ),
    f.SpecVerifyRowsAsDecode: (
        [rows((20,), (4,)), rows((20, 30), (4, 3)), rows((20, 30), (1, 1))],
        [rows((20, 30), (4, 4)), rows((10, 11, 12), (2, 2, 2))],
    ),
    f.ScratchWrapsPastTokenBudget: (
        [budget(4, 2048)],
        [budget(4, 2049)],
    ),
}


def build(cls: type, s: Scenario) -> ReferenceBackend:
    return backend_for(BackendEntry(cls.__name__, cls, "spec"), s)


def run(cls: type, scenario: Scenario) -> list[Comparison]:
    inputs, outputs = run_scenario(lambda s: build(cls, s), scenario)
    return check_outputs(inputs, outputs)


def test_every_field_mutant_has_cases_a_source_and_a_regime() -> None:
    assert set(CASES) == set(f.FIELD_MUTANTS)
    assert len(f.FIELD_MUTANTS) >= 20
    assert set(f.FIELD_MUTANTS) <= set(backends.MUTANTS)
    specs = mutant_specs()
    for cls in f.FIELD_MUTANTS:
        spec = f"suites.mutants.field:{cls.__name__}"
        assert spec in specs
        assert load_backend_spec(spec) is cls
        assert getattr(backends, cls.__name__) is cls
        assert issubclass(cls, ReferenceBackend)
        assert cls.capabilities() == ReferenceBackend.capabilities()
        doc = cls.__doc__ or ""
        assert re.search(r"^\s*Source: [\w.-]+/[\w.-]+#\d+", doc, re.MULTILINE), cls.__name__
        assert re.search(r"^\s*Regime: ", doc, re.MULTILINE), cls.__name__


@pytest.mark.parametrize("cls", list(CASES), ids=lambda c: c.__name__)
def test_exact_just_outside_regime(cls: type) -> None:
    for scenario in CASES[cls][0]:
        for check in run(cls, scenario):
            assert check.checked_tokens > 0
            assert check.passed, f"{scenario.describe()}: {check.describe()}"


@pytest.mark.parametrize("cls", list(CASES), ids=lambda c: c.__name__)
def test_far_off_just_inside_regime(cls: type) -> None:
    for scenario in CASES[cls][1]:
        checks = run(cls, scenario)
        assert not all(c.passed for c in checks), scenario.describe()
        worst = max(c.worst_ratio for c in checks)
        far = FAR_BELOW_OFFSET.get(cls, FAR_OFF)
        assert worst > far, f"{scenario.describe()}: only {worst:.1f}x the bound"


SMALL = [
    replace(BASE, context_lens=(7, 12, 1, 20), query_lens=(1, 1, 1, 1)),
    replace(BASE, page_size=3, total_pages=60, context_lens=(9, 16, 11), query_lens=(4, 5, 2)),
    replace(BASE, page_size=5, context_lens=(5, 12, 3), query_lens=(5, 12, 3), dp_size=3),
    replace(BASE, num_heads=8, num_kv_heads=1, head_dim=13, causal=False),
]


@pytest.mark.parametrize("cls", f.FIELD_MUTANTS, ids=lambda c: c.__name__)
def test_bit_identical_to_reference_on_small_shapes(cls: type) -> None:
    """Outside every regime a field mutant is the reference, bit for bit."""
    for scenario in SMALL:
        _, expected = run_scenario(lambda s: build(ReferenceBackend, s), scenario)
        _, actual = run_scenario(lambda s: build(cls, s), scenario)
        for a, b in zip(actual, expected, strict=True):
            assert torch.equal(a, b), scenario.describe()
