"""The dtype bound discriminates at production sizes: correct computations pass with a
wide margin, real bugs fail, in bf16, fp16 and fp32 (``python -m harness.discrimination``).
"""

from __future__ import annotations

import pytest

from harness.discrimination import BUGS, CORRECT, format_table, table


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
