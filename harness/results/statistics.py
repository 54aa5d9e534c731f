"""Statistics over raw timing samples: median, IQR, bootstrap confidence intervals.

Pure functions of the samples, computed outside any timing loop, so that
whoever reads a results file (a report, the gate) recomputes exactly what
the runner printed. Imports numpy only: no torch, no device.

The bootstrap is the percentile bootstrap of the median with a fixed seed:
the same samples always give the same interval. The interval is widened,
if needed, to contain the point estimate (with few samples a percentile
interval can miss it by a resampling accident, and an interval that does
not contain its own estimate confuses every reader).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0


def _as_array(samples: Sequence[float] | np.ndarray) -> np.ndarray:
    data = np.asarray(samples, dtype=np.float64)
    if data.ndim != 1 or data.size == 0:
        raise ValueError(f"need a non-empty 1-d sequence of samples, got shape {data.shape}")
    if not np.all(np.isfinite(data)):
        raise ValueError("samples must be finite")
    return data


def median(samples: Sequence[float] | np.ndarray) -> float:
    return float(np.median(_as_array(samples)))


def quartiles(samples: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """First and third quartile (linear interpolation, as numpy and pytest-benchmark)."""
    q1, q3 = np.percentile(_as_array(samples), [25.0, 75.0])
    return float(q1), float(q3)


def iqr(samples: Sequence[float] | np.ndarray) -> float:
    q1, q3 = quartiles(samples)
    return q3 - q1


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def bootstrap_medians(data: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """``resamples`` medians of ``data`` resampled with replacement (the gate resamples too)."""
    index = rng.integers(0, data.size, size=(resamples, data.size))
    medians: np.ndarray = np.median(data[index], axis=1)
    return medians


def bootstrap_median_ci(
    samples: Sequence[float] | np.ndarray,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median; always contains the sample median."""
    _check_confidence(confidence)
    data = _as_array(samples)
    point = float(np.median(data))
    if data.size == 1:
        return point, point
    medians = bootstrap_medians(data, resamples, np.random.default_rng(seed))
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(medians, [tail, 100 - tail])
    return min(float(low), point), max(float(high), point)


def bootstrap_ratio_ci(
    numerator: Sequence[float] | np.ndarray,
    denominator: Sequence[float] | np.ndarray,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> tuple[float, float]:
    """Interval of ``median(numerator) / median(denominator)``, resampling both independently.

    Used for "backend time / peer time": the two were measured separately,
    so each is resampled on its own.
    """
    _check_confidence(confidence)
    top, bottom = _as_array(numerator), _as_array(denominator)
    if np.any(bottom <= 0):
        raise ValueError("denominator samples must be positive")
    point = float(np.median(top) / np.median(bottom))
    rng = np.random.default_rng(seed)
    ratios = bootstrap_medians(top, resamples, rng) / bootstrap_medians(bottom, resamples, rng)
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return min(float(low), point), max(float(high), point)


@dataclass(frozen=True)
class Summary:
    """What a table shows for one set of samples; recomputable from the samples alone."""

    count: int
    median: float
    q1: float
    q3: float
    minimum: float
    maximum: float
    ci_low: float
    ci_high: float
    confidence: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def relative_ci_width(self) -> float:
        """``(ci_high - ci_low) / median``: how tight the median is known."""
        return (self.ci_high - self.ci_low) / self.median if self.median else float("inf")

    @classmethod
    def of(
        cls,
        samples: Sequence[float] | np.ndarray,
        *,
        confidence: float = DEFAULT_CONFIDENCE,
        resamples: int = DEFAULT_RESAMPLES,
        seed: int = DEFAULT_SEED,
    ) -> Summary:
        data = _as_array(samples)
        q1, q3 = quartiles(data)
        low, high = bootstrap_median_ci(data, confidence=confidence, resamples=resamples, seed=seed)
        return cls(
            count=int(data.size),
            median=float(np.median(data)),
            q1=q1,
            q3=q3,
            minimum=float(data.min()),
            maximum=float(data.max()),
            ci_low=low,
            ci_high=high,
            confidence=confidence,
        )
