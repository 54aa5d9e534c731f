"""The dtype bound discriminates at production sizes: correct computations pass with a
wide margin, real bugs fail, in bf16, fp16 and fp32, for plain attention and with each
attention variant on, and for MLA at DeepSeek's geometry (``python -m
harness.numerics.discrimination``).
"""

from __future__ import annotations

import random

import pytest
import torch

from harness.core.dtypes import dtype_name
from harness.numerics.discrimination import (
    BUGS,
    CORRECT,
    DTYPES,
    MLA_BUGS,
    MLA_CORRECT,
    MLA_SIZES,
    VARIANT_BUGS,
    VARIANT_CASES,
    VARIANT_CORRECT,
    format_table,
    mla_applies,
    mla_table,
    table,
)
from harness.numerics.scenario import Scenario, check_outputs, make_step_inputs

pytestmark = pytest.mark.xdist_group("discrimination")  # one worker computes the tables


@pytest.fixture(scope="module")
def ratios() -> dict[tuple[str, str, str], float]:
    results = table()
    print("\nworst error / bound (fails above 1):\n" + format_table(results))
    return results


def test_every_case_was_measured(ratios):
    cases = {case for case, _, _ in ratios}
    assert cases == set(CORRECT) | set(BUGS)
    assert {dtype for _, dtype, _ in ratios} == {"bfloat16", "float16", "float32"}


@pytest.mark.parametrize("case", list(CORRECT))
def test_correct_computation_stays_under_a_quarter_of_the_bound(ratios, case):
    worst = max(r for (c, _, _), r in ratios.items() if c == case)
    assert worst <= 0.25, format_table(ratios)


@pytest.mark.parametrize("case", list(BUGS))
def test_bug_exceeds_the_bound_in_every_dtype_and_size(ratios, case):
    measured = {(d, z): r for (c, d, z), r in ratios.items() if c == case}
    assert measured
    assert all(r > 1.0 for r in measured.values()), format_table(ratios)


def _odd_shape(rng: random.Random) -> Scenario:
    """A small, awkward shape: tiny head dims, page size 1, long spread contexts, big logits."""
    kv_heads, group = rng.choice([1, 2, 4]), rng.choice([1, 3, 8])
    page = rng.choice([1, 3, 16])
    contexts = [rng.choice([1, 2, 5, 70, 300, 1100]) for _ in range(rng.randint(1, 3))]
    queries = [rng.choice([1, c, max(1, c // 2)]) for c in contexts]
    dtype = rng.choice([torch.float32, torch.float16, torch.bfloat16])
    return Scenario(
        num_heads=kv_heads * group,
        num_kv_heads=kv_heads,
        head_dim=rng.choice([1, 2, 3, 5, 13, 64]),
        page_size=page,
        num_layers=1,
        total_pages=sum(-(-c // page) for c in contexts) + 1,
        context_lens=tuple(contexts),
        query_lens=tuple(queries),
        dtype=dtype,
        scale=rng.choice([None, 0.03, 2.0]),
        magnitude=rng.choice([1.0, 8.0]),
        planted_keys=rng.choice([0, 1, 3]),
        seed=rng.randint(0, 2**16),
    )


def test_correct_computations_stay_well_inside_the_bound_on_odd_shapes():
    """No false alarm on a rare draw: over 40 awkward shapes, under half the bound."""
    rng = random.Random(0)
    worst: dict[str, tuple[float, str]] = {}
    for _ in range(40):
        inputs = make_step_inputs(_odd_shape(rng))
        for name, attention in CORRECT.items():
            ratio = check_outputs(inputs, [attention(inputs)])[0].worst_ratio
            if ratio > worst.get(name, (0.0, ""))[0]:
                worst[name] = (ratio, inputs.scenario.describe())
    print("\n".join(f"{name}: {r:.3f} at {where}" for name, (r, where) in worst.items()))
    assert all(r <= 0.5 for r, _ in worst.values()), worst


# -- with attention variants on (the variant_ratios fixture: tests/conftest.py) ----------


def test_every_variant_case_and_bug_was_measured(variant_ratios):
    assert {case for _, _, case in variant_ratios} == {c.name for c in VARIANT_CASES}
    assert set(VARIANT_BUGS) <= {label for label, _, _ in variant_ratios}
    assert {dtype for _, dtype, _ in variant_ratios} == {"bfloat16", "float16", "float32"}


@pytest.mark.parametrize("computation", list(VARIANT_CORRECT))
def test_correct_variant_computation_stays_under_a_quarter_of_the_bound(
    variant_ratios, computation
):
    measured = [r for (c, _, _), r in variant_ratios.items() if c == computation]
    assert measured
    assert max(measured) <= 0.25, format_table(variant_ratios)


@pytest.mark.parametrize("bug", list(VARIANT_BUGS))
def test_each_variant_bug_fails_in_every_dtype(variant_ratios, bug):
    measured = {(d, z): r for (c, d, z), r in variant_ratios.items() if c == bug}
    assert measured
    assert all(r > 1.0 for r in measured.values()), format_table(variant_ratios)


def test_sdpa_is_not_run_on_what_it_does_not_claim(variant_ratios):
    assert not any(c == "sdpa" and "soft-cap" in z for c, _, z in variant_ratios)


@pytest.fixture(scope="module")
def mla_ratios() -> dict[tuple[str, str, str], float]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results = mla_table()
    finally:
        torch.set_num_threads(threads)
    print("\nMLA, worst error / bound (fails above 1):\n" + format_table(results))
    return results


def test_every_mla_case_was_measured(mla_ratios):
    assert {case for case, _, _ in mla_ratios} == set(MLA_CORRECT) | set(MLA_BUGS)
    assert {size for _, _, size in mla_ratios} == {size.name for size in MLA_SIZES}


@pytest.mark.parametrize("case", list(MLA_CORRECT))
def test_correct_mla_computation_stays_under_a_quarter_of_the_bound(mla_ratios, case):
    worst = max(r for (c, _, _), r in mla_ratios.items() if c == case)
    assert worst <= 0.25, format_table(mla_ratios)


@pytest.mark.parametrize("case", list(MLA_BUGS))
def test_mla_bug_exceeds_the_bound_in_every_dtype_and_size(mla_ratios, case):
    measured = {(d, z): r for (c, d, z), r in mla_ratios.items() if c == case}
    wanted = {(dtype_name(d), z.name) for d in DTYPES for z in MLA_SIZES if mla_applies(case, z, d)}
    assert set(measured) == wanted
    assert all(r > 1.0 for r in measured.values()), format_table(mla_ratios)


def test_only_a_typical_dropped_key_in_long_bf16_rows_is_left_out():
    """Below bf16's rounding of the output: the one cell family not tabled, and only it."""
    left_out = [
        (c, d, z.name)
        for c in MLA_BUGS
        for d in DTYPES
        for z in MLA_SIZES
        if not mla_applies(c, z, d)
    ]
    assert left_out == [
        ("last key dropped", torch.bfloat16, "decode 4x4096"),
        ("last key dropped", torch.bfloat16, "spec-decode q=4/2048 x2"),
    ]
