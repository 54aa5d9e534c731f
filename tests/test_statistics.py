"""Median, IQR and bootstrap intervals: pure functions of the raw samples."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.statistics import (
    Summary,
    bootstrap_median_ci,
    bootstrap_ratio_ci,
    iqr,
    median,
    quartiles,
)

samples = st.lists(st.integers(min_value=1, max_value=10**9), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(samples)
def test_bootstrap_ci_contains_the_median(data):
    low, high = bootstrap_median_ci(data)
    assert low <= median(data) <= high


@settings(max_examples=40, deadline=None)
@given(samples, samples)
def test_ratio_ci_contains_the_ratio_of_medians(top, bottom):
    low, high = bootstrap_ratio_ci(top, bottom)
    assert low <= median(top) / median(bottom) <= high


def test_bootstrap_is_deterministic_for_a_seed():
    data = [5, 9, 3, 12, 7, 8, 6, 30, 4, 5]
    assert bootstrap_median_ci(data) == bootstrap_median_ci(data)
    assert bootstrap_median_ci(data, seed=1) != bootstrap_median_ci(data, seed=2)


def test_interval_narrows_as_samples_accumulate():
    rng = np.random.default_rng(3)
    few = rng.normal(100, 10, 10)
    many = np.concatenate([few, rng.normal(100, 10, 990)])
    width = [np.subtract(*bootstrap_median_ci(x)[::-1]) for x in (few, many)]
    assert width[1] < width[0] / 3


def test_summary_matches_numpy():
    data = [10, 20, 30, 40, 1000]
    s = Summary.of(data)
    assert s.median == 30
    assert (s.q1, s.q3) == quartiles(data) == (20, 40)
    assert s.iqr == iqr(data) == 20
    assert (s.minimum, s.maximum, s.count) == (10, 1000, 5)
    assert s.ci_low <= 30 <= s.ci_high
    assert s.relative_ci_width == (s.ci_high - s.ci_low) / 30


def test_constant_samples_have_a_zero_width_interval():
    assert bootstrap_median_ci([7, 7, 7, 7, 7]) == (7, 7)
    assert Summary.of([7] * 5).relative_ci_width == 0


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [[1, 2]], [float("inf")]])
def test_rejects_empty_or_non_finite_samples(bad):
    with pytest.raises(ValueError, match="samples"):
        median(bad)


def test_rejects_confidence_outside_0_1():
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_median_ci([1, 2, 3], confidence=1.0)
