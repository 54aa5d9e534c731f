"""A run's ceilings held against its own cases: no fraction from a ceiling the run contradicts.

A ceiling is the best rate the probe saw; a case whose measured rate
exceeds it shows that the ceiling is too low (the probe ran while the
machine was busy) or that the case's timing is wrong, and nothing inside
the run tells which. The rule:

1. the ceiling is the best of every probe round of the run (before the
   cases, a recheck as soon as a case exceeds it, after the cases);
2. a case above that best is flagged (``measurement error``) and its own
   fraction withheld (``harness.bench.metrics.roofline``);
3. the ceiling is then *contradicted* for the whole run: it is known to be
   too low by an unknown factor, so every fraction against it would be too
   high by as much. Each such fraction is withheld (``None``, named in the
   case's ``metrics.withheld``), with one run flag saying which ceiling,
   by how much, and how many cases it cost.

Raising the ceiling to the fastest case instead was rejected: it would turn
a timer error into a kernel at 100% of the device and measure every other
case against that kernel rather than against the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.bench.ceilings import Ceilings, ceiling_label
from harness.bench.metrics import AttentionWork

if TYPE_CHECKING:
    from harness.results.store import CaseRecord

FRACTIONS = {"bandwidth": "bandwidth_fraction", "compute": "compute_fraction"}


@dataclass(frozen=True)
class Contradiction:
    """A ceiling some cases of the run exceeded."""

    key: str  # "copy" or "matmul_DTYPE"
    ceiling: float
    best_rate: float  # the fastest case's rate against it
    above: int  # cases above it
    withheld: int = 0  # fractions withheld because of it

    @property
    def kind(self) -> str:
        return "bandwidth" if self.key == "copy" else "compute"


def _timed(cases: Sequence[CaseRecord]) -> list[CaseRecord]:
    return [c for c in cases if c.status == "PASSED" and c.metrics]


def ceiling_key(kind: str, case: CaseRecord) -> str:
    """Which ceiling a case's ``kind`` fraction is measured against."""
    return "copy" if kind == "bandwidth" else f"matmul_{(case.spec or {}).get('dtype')}"


def rate(kind: str, metrics: dict[str, Any]) -> float:
    """The case's achieved bytes/s (``bandwidth``) or FLOP/s (``compute``)."""
    return float(metrics["gbps"]) * 1e9 if kind == "bandwidth" else float(metrics["tflops"]) * 1e12


def ceiling_value(ceilings: Ceilings | None, key: str) -> float | None:
    if ceilings is None:
        return None
    if key == "copy":
        return ceilings.memory_bandwidth
    return ceilings.flops_for(key.removeprefix("matmul_"))


def contradictions(cases: Sequence[CaseRecord], ceilings: Ceilings | None) -> list[Contradiction]:
    """Every ceiling that some timed case's rate exceeds."""
    found: dict[str, Contradiction] = {}
    for case in _timed(cases):
        assert case.metrics is not None
        for kind in FRACTIONS:
            key = ceiling_key(kind, case)
            ceiling = ceiling_value(ceilings, key)
            achieved = rate(kind, case.metrics)
            if not ceiling or achieved <= ceiling:
                continue
            seen = found.get(key)
            best = achieved if seen is None else max(achieved, seen.best_rate)
            found[key] = Contradiction(key, ceiling, best, 1 if seen is None else seen.above + 1)
    return list(found.values())


def withhold(cases: Sequence[CaseRecord], found: Sequence[Contradiction]) -> list[Contradiction]:
    """Withhold every fraction against a contradicted ceiling; the count each one cost.

    The roofline fraction and the bound are the larger of the two fractions,
    so they are withheld with either.
    """
    keys = {c.key for c in found}
    costs = dict.fromkeys(keys, 0)
    for case in _timed(cases):
        metrics = case.metrics
        assert metrics is not None
        withheld = set(metrics.get("withheld") or [])
        for kind, field in FRACTIONS.items():
            key = ceiling_key(kind, case)
            if key in keys:
                costs[key] += 1
                withheld.add(kind)
                metrics[field] = None
        if withheld:
            metrics["withheld"] = sorted(withheld)
            metrics["roofline_fraction"] = None
            metrics["bound"] = None
    return [Contradiction(c.key, c.ceiling, c.best_rate, c.above, costs[c.key]) for c in found]


IMPOSSIBLE_MARGIN = 3.0
"""A case faster than this many times the best rate any probe of the run measured fails:
a busy machine lowers a probe by less (the worst seen here: 3x on one probe, and a run
keeps the best of several), and a kernel that does the work never passes its ceiling by
more than a few percent."""


def impossible(
    work: AttentionWork, seconds: float, dtype: str, ceilings: Ceilings | None, cache_bytes: int
) -> str | None:
    """Why ``seconds`` cannot be the time of ``work`` on this machine, or ``None``.

    Bytes: all but ``cache_bytes`` (what the caches could hold between calls, flushed
    or not) come from memory at most ``IMPOSSIBLE_MARGIN`` times the best copy rate.
    FLOPs: at most that many times the best matmul rate of ``dtype``. A time below
    either is not the work: a kernel returning before it finishes, or skipping it.
    """
    if ceilings is None or not seconds > 0:
        return None
    bandwidth = ceilings.memory_bandwidth
    beyond = work.bytes - cache_bytes
    if bandwidth and beyond > 0:
        fastest = beyond / (IMPOSSIBLE_MARGIN * bandwidth)
        if seconds < fastest:
            return (
                f"faster than the machine can move these bytes: {seconds * 1e6:.3g} us for "
                f"{work.bytes / 1e6:.4g} MB; with {cache_bytes / 1e6:.3g} MB of them in its "
                f"caches, the rest at {IMPOSSIBLE_MARGIN:g}x the best copy rate of the run "
                f"({bandwidth / 1e9:.3g} GB/s) takes at least {fastest * 1e6:.3g} us"
            )
    peak = ceilings.flops_for(dtype)
    achieved = work.flops / seconds
    if peak and achieved > IMPOSSIBLE_MARGIN * peak:
        return (
            f"faster than the machine can compute: {achieved / 1e9:.4g} GFLOP/s, above "
            f"{IMPOSSIBLE_MARGIN:g}x the best {dtype} matmul rate of the run ({peak / 1e9:.4g} "
            "GFLOP/s)"
        )
    return None


def _figure(key: str, value: float) -> str:
    return f"{value / 1e9:.3g} GB/s" if key == "copy" else f"{value / 1e9:.3g} GFLOP/s"


def contradiction_flag(c: Contradiction, rounds: int) -> str:
    """The run's flag for one contradicted ceiling."""
    probes = f"best of {rounds} probes" if rounds > 1 else "one probe" if rounds else "datasheet"
    cases = "1 case" if c.above == 1 else f"{c.above} cases"
    return (
        f"ceiling contradicted: {cases} reached {_figure(c.key, c.best_rate)}, above the "
        f"{ceiling_label(c.key)} ceiling of {_figure(c.key, c.ceiling)} ({probes}); "
        f"{c.kind} fractions withheld for {c.withheld} cases"
    )
