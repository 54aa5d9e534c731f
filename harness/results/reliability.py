"""Whether a case's timing is a result: one cluster of samples, a ratio known closely enough.

On a busy machine the samples of one case can fall into two clusters (seen here: a
peer's decode case at about 1.5 ms and 9 ms, median 8.34 ms, interval 1.48-9.47 ms).
The median then says which cluster happened to hold more samples, and a ratio to it
(there, 0.12x with interval [0.10, 1.93] beside 1.01x one context up) says nothing
about the kernel. Such a case is *unreliable*: the bench measures it again, then flags
it if it still is, and reports keep it out of their medians over cases. The rules
are read from the raw samples alone, so a report judges a results file as the run did.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CLUSTER_GAP = 1.5
"""Two neighbouring samples (in sorted order) this far apart split the samples in two."""
CLUSTER_SHARE = 0.25
"""...when each side holds at least this share of them: a few slow outliers (an
interrupt, a page fault) leave the median where it was and are not a second cluster."""
CLUSTER_SAMPLES = 8
"""Fewer samples than this make no claim of two clusters (the interval speaks for them)."""
RATIO_SPAN_LIMIT = 3.0
"""A ratio whose confidence interval spans more than this factor (high / low) is not known
(the case that showed the need: [0.10, 1.93]; five samples of a tiny case on a loaded
machine reach 2x)."""
UNRELIABLE = "unreliable"
"""The kind of flag an unreliable case gets (the text before its first colon)."""


@dataclass(frozen=True)
class Clusters:
    """Samples split at their widest gap into a fast and a slow cluster."""

    fast: tuple[float, ...]
    slow: tuple[float, ...]

    def describe(self) -> str:
        def near(values: tuple[float, ...]) -> str:
            return f"{len(values)} near {_ms(statistics.median(values))}"

        return f"{near(self.fast)}, {near(self.slow)}"


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3g} ms" if ns >= 1e5 else f"{ns / 1e3:.3g} us"


def clusters(samples: Sequence[float]) -> Clusters | None:
    """The two clusters ``samples`` fall into, or ``None`` where they form one."""
    values = sorted(float(s) for s in samples if s > 0)
    if len(values) < CLUSTER_SAMPLES:
        return None
    smallest = max(2, math.ceil(CLUSTER_SHARE * len(values)))
    best: tuple[float, int] | None = None
    for split in range(smallest, len(values) - smallest + 1):
        gap = values[split] / values[split - 1]
        if gap >= CLUSTER_GAP and (best is None or gap > best[0]):
            best = (gap, split)
    if best is None:
        return None
    split = best[1]
    return Clusters(tuple(values[:split]), tuple(values[split:]))


def unreliable(
    samples: Sequence[float],
    peer_samples: Sequence[float] | None = None,
    ratio: float | None = None,
    ratio_ci: Sequence[float] | None = None,
) -> str | None:
    """Why a case's timing (and its ratio to the peer) is not a result, or ``None``."""
    for whose, values in (("its", samples), ("its peer's", peer_samples)):
        found = clusters(values) if values else None
        if found is not None:
            return f"{UNRELIABLE}: {whose} samples fall into two clusters ({found.describe()})"
    if ratio and ratio_ci is not None and len(ratio_ci) == 2:
        low, high = ratio_ci
        if low > 0 and high / low > RATIO_SPAN_LIMIT:
            return (
                f"{UNRELIABLE}: its ratio to the peer, {ratio:.2f}x, has the interval "
                f"[{low:.2f}, {high:.2f}], wider than a factor of {RATIO_SPAN_LIMIT:g}"
            )
    return None
