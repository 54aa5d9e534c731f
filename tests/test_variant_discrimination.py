"""With variants on, the bound still discriminates at production sizes: correct computations
pass with a wide margin and each variant's planted bug fails, in bf16, fp16 and fp32
(``python -m harness.numerics.variant_discrimination``)."""

from __future__ import annotations

import pytest

from harness.numerics.variant_discrimination import BUGS, CASES, CORRECT, format_table, table


@pytest.fixture(scope="module")
def ratios() -> dict[tuple[str, str, str], float]:
    results = table()
    print("\nworst error / bound (fails above 1):\n" + format_table(results))
    return results


def test_every_case_and_bug_was_measured(ratios):
    assert {case for _, _, case in ratios} == {c.name for c in CASES}
    assert set(BUGS) <= {label for label, _, _ in ratios}
    assert {dtype for _, dtype, _ in ratios} == {"bfloat16", "float16", "float32"}


@pytest.mark.parametrize("computation", list(CORRECT))
def test_correct_computation_stays_under_a_quarter_of_the_bound(ratios, computation):
    measured = [r for (c, _, _), r in ratios.items() if c == computation]
    assert measured
    assert max(measured) <= 0.25, format_table(ratios)


@pytest.mark.parametrize("bug", list(BUGS))
def test_each_variant_bug_fails_in_every_dtype(ratios, bug):
    measured = {(d, z): r for (c, d, z), r in ratios.items() if c == bug}
    assert measured
    assert all(r > 1.0 for r in measured.values()), format_table(ratios)


def test_sdpa_is_not_run_on_what_it_does_not_claim(ratios):
    assert not any(c == "sdpa" and "soft-cap" in z for c, _, z in ratios)
