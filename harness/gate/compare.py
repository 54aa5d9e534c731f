"""The gate's performance comparison: each case's ratio to its in-run peer, candidate vs baseline.

The unit compared is ``backend median / peer median`` within one run: the
peer (torch SDPA over the same tokens held contiguously) was timed in the
same process minutes apart, so a machine that is 20% slower today slows
both and the ratio stays put. Each side pools every run given for it.

The interval is a two-level bootstrap recomputed from the raw samples:

- within a run, the backend's and the peer's samples are resampled
  independently (they were measured separately), giving that run's ratio;
- across runs, a side with at least ``MIN_RUNS_FOR_SPREAD`` runs resamples
  its runs and takes their median, so the spread between processes is part of
  its interval and one run hit by a burst of other work moves nothing;
- a side with fewer runs (typically the one fresh candidate run) cannot show
  that spread itself, so it borrows it: each resample is moved by a normal
  draw with the between-run standard deviation of log-ratio measured on the
  side that has enough runs (the committed baseline pools at least 3).
  Without it, one run's tight interval would call a routine between-process
  drift of a few percent a regression.

The compared quantity is ``change = candidate ratio / baseline ratio`` (a
side's pooled ratio is the median of its runs' ratios, or their geometric
mean with fewer than ``MIN_RUNS_FOR_SPREAD``); 1.10 means 10% slower
relative to the peer. With threshold ``t``:

- FAIL when the whole interval lies above ``1 + t``;
- IMPROVED when it lies below ``1 / (1 + t)``;
- PASS when it lies inside ``[1 / (1 + t), 1 + t]``;
- INCONCLUSIVE otherwise (it straddles a bound: not enough evidence either way).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from harness.results.statistics import DEFAULT_CONFIDENCE, bootstrap_medians

DEFAULT_THRESHOLD = 0.10
DEFAULT_RESAMPLES = 2000
MIN_RUNS_FOR_SPREAD = 3


@dataclass(frozen=True)
class RunSamples:
    """One run's raw forward samples of a backend case and of its peer."""

    backend_ns: Sequence[int]
    peer_ns: Sequence[int]

    @property
    def ratio(self) -> float:
        return float(np.median(self.backend_ns) / np.median(self.peer_ns))


@dataclass(frozen=True)
class Change:
    """Candidate ratio over baseline ratio, with its bootstrap interval."""

    candidate_ratio: float
    baseline_ratio: float
    change: float
    low: float
    high: float
    candidate_runs: int
    baseline_runs: int


def pooled_ratio(runs: Sequence[RunSamples]) -> float:
    """The side's point estimate: the median of its runs' ratios (the geometric mean of fewer
    than ``MIN_RUNS_FOR_SPREAD``), so one run slowed by a neighbour's burst moves nothing."""
    logs = [math.log(r.ratio) for r in runs]
    if len(runs) >= MIN_RUNS_FOR_SPREAD:
        return math.exp(float(np.median(logs)))
    return math.exp(sum(logs) / len(logs))


def between_run_sigma(runs: Sequence[RunSamples]) -> float | None:
    """Standard deviation of log-ratio across runs, or ``None`` with too few runs to tell."""
    if len(runs) < MIN_RUNS_FOR_SPREAD:
        return None
    logs = np.log([r.ratio for r in runs])
    return float(np.std(logs, ddof=1))


def _side_log_ratios(
    runs: Sequence[RunSamples],
    resamples: int,
    rng: np.random.Generator,
    borrowed_sigma: float,
) -> np.ndarray:
    """Bootstrap draws of the side's pooled log-ratio (see the module docstring)."""
    per_run = np.stack(
        [
            np.log(
                bootstrap_medians(np.asarray(r.backend_ns, dtype=np.float64), resamples, rng)
                / bootstrap_medians(np.asarray(r.peer_ns, dtype=np.float64), resamples, rng)
            )
            for r in runs
        ]
    )  # (runs, resamples)
    if len(runs) >= MIN_RUNS_FOR_SPREAD:
        pick = rng.integers(0, len(runs), size=(len(runs), resamples))
        chosen: np.ndarray = np.take_along_axis(per_run, pick, axis=0)
        medians: np.ndarray = np.median(chosen, axis=0)
        return medians
    draws: np.ndarray = per_run.mean(axis=0)
    if borrowed_sigma > 0:
        draws = draws + rng.normal(0.0, borrowed_sigma / math.sqrt(len(runs)), size=resamples)
    return draws


def compare_case(
    case_id: str,
    candidate: Sequence[RunSamples],
    baseline: Sequence[RunSamples],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    spread: float | None = None,
) -> Change:
    """The change of one case between the sides; the seed is derived from ``case_id``.

    ``spread`` is the between-run sigma of log-ratio to lend a side with
    fewer than ``MIN_RUNS_FOR_SPREAD`` runs; by default it is taken from
    this case's other side when that side has enough runs.
    """
    if not candidate or not baseline:
        raise ValueError("both sides need at least one run")
    if spread is None:
        spread = between_run_sigma(baseline) or between_run_sigma(candidate) or 0.0
    rng = np.random.default_rng(zlib.crc32(case_id.encode("utf-8")))
    log_change = _side_log_ratios(candidate, resamples, rng, spread) - _side_log_ratios(
        baseline, resamples, rng, spread
    )
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.exp(np.percentile(log_change, [tail, 100 - tail]))
    cand, base = pooled_ratio(candidate), pooled_ratio(baseline)
    point = cand / base
    return Change(
        candidate_ratio=cand,
        baseline_ratio=base,
        change=point,
        low=min(float(low), point),
        high=max(float(high), point),
        candidate_runs=len(candidate),
        baseline_runs=len(baseline),
    )


def performance_verdict(change: Change, threshold: float) -> str:
    """FAIL / IMPROVED / PASS / INCONCLUSIVE from where the whole interval lies."""
    slower, faster = 1.0 + threshold, 1.0 / (1.0 + threshold)
    if change.low > slower:
        return "FAIL"
    if change.high < faster:
        return "IMPROVED"
    if faster <= change.low and change.high <= slower:
        return "PASS"
    return "INCONCLUSIVE"
