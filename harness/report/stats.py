"""Every number a report shows for a case, recomputed from raw samples, once.

The summaries stored in a results file are informational (a reader must not
trust them over the samples), so the median, its interval, the ratios to the
peer and to ``reference`` with their bootstrap intervals, the rates and the
roofline share are derived here from ``samples_ns`` and the run's ceilings.
Figures, the page and the Markdown summary all read these, so they agree.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.bench.engine_peer import engine_in
from harness.results.reliability import unreliable
from harness.results.statistics import DEFAULT_RESAMPLES, Summary, bootstrap_ratio_ci, median

if TYPE_CHECKING:
    from harness.report.inputs import BenchRun
    from harness.results.store import CaseRecord, RunRecord

REFERENCE = "reference"
KINDS = ("decode", "prefill", "extend", "mixed", "dp-scaling", "targets")
MAX_RESAMPLED_VALUES = 4_000_000  # resamples x samples: bounds memory for huge sample sets
# The ratio to reference is a second opinion beside the ratio to the peer (which keeps the
# default, so it matches what `attn-harness bench` printed); half the resamples keep the
# report quick (about 200 cases in a few seconds) at a negligible cost in interval precision.
REFERENCE_RESAMPLES = DEFAULT_RESAMPLES // 2
MAX_THREADS = 8


@dataclass(frozen=True)
class Ceiling:
    """One set of device limits: the roofline's slope and its flat roofs."""

    source: str  # "measured" | "datasheet"
    memory_bandwidth: float | None  # bytes/s
    matmul_flops: dict[str, float]  # dtype -> FLOP/s


@dataclass(frozen=True)
class CaseStats:
    """One case record and what the report derives from it (``None`` where it cannot)."""

    case: CaseRecord
    kind: str | None
    median_s: float | None = None
    ci_s: tuple[float, float] | None = None
    confidence: float | None = None
    ratio_peer: float | None = None
    ratio_peer_ci: tuple[float, float] | None = None
    ratio_reference: float | None = None
    ratio_reference_ci: tuple[float, float] | None = None
    ratio_engine: float | None = None  # over the run's engine peer (``harness.bench.engine_peer``)
    ratio_engine_ci: tuple[float, float] | None = None
    roofline_fraction: float | None = None
    bound: str | None = None
    unreliable: str | None = None  # why its timing is not a result (``results.reliability``)

    @property
    def valid(self) -> bool:
        return self.median_s is not None

    @property
    def counts(self) -> bool:
        """Timed, and a result: what medians over cases take."""
        return self.valid and self.unreliable is None

    @property
    def tokens(self) -> float | None:
        return _number(self.metric("tokens"))

    @property
    def flops(self) -> float | None:
        return _number(self.metric("flops"))

    @property
    def bytes(self) -> float | None:
        return _number(self.metric("bytes"))

    @property
    def intensity(self) -> float | None:
        flops, moved = self.flops, self.bytes
        return flops / moved if flops and moved else None

    def metric(self, name: str) -> Any:
        return (self.case.metrics or {}).get(name)

    def per_second(self, amount: float | None) -> tuple[float, float, float] | None:
        """``amount`` over the median time, and over the interval's ends (low, high rate)."""
        if amount is None or self.median_s is None or self.ci_s is None:
            return None
        low, high = self.ci_s
        return amount / self.median_s, amount / high, amount / (low if low > 0 else self.median_s)

    @property
    def context_length(self) -> int | None:
        lens = (self.case.spec or {}).get("context_lens") or []
        numbers = [n for n in lens if isinstance(n, int | float)]
        return int(max(numbers)) if numbers else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _resamples(count: int, wanted: int = DEFAULT_RESAMPLES) -> int:
    return max(200, min(wanted, MAX_RESAMPLED_VALUES // max(count, 1)))


def _samples(case: CaseRecord | None) -> list[int] | None:
    """The forward samples of a case whose time counts (passed, timed, median above zero)."""
    if case is None or not case.valid or case.forward is None:
        return None
    samples = case.forward.samples_ns
    return samples if samples and median(samples) > 0 else None


def _ratio(
    top: CaseRecord,
    bottom: CaseRecord | None,
    confidence: float,
    wanted: int = DEFAULT_RESAMPLES,
) -> tuple[float | None, tuple[float, float] | None]:
    """``median(top) / median(bottom)`` with its bootstrap interval, both sample sets resampled."""
    a, b = _samples(top), _samples(bottom)
    if a is None or b is None or min(b) <= 0:
        return None, None
    resamples = _resamples(max(len(a), len(b)), wanted)
    low, high = bootstrap_ratio_ci(a, b, confidence=confidence, resamples=resamples)
    return median(a) / median(b), (low, high)


def workload_kind(record: RunRecord, case: CaseRecord) -> str | None:
    """The kind the run's workload list gives, else one read off the workload's name."""
    for w in record.workloads:
        if w.get("name") == case.workload and w.get("version") == case.workload_version:
            if w.get("kind") in KINDS:
                return str(w["kind"])
            break
    guess = case.workload.removesuffix("-sweep")
    return guess if guess in KINDS else None


def ceilings(record: RunRecord) -> list[Ceiling]:
    """The run's measured and datasheet ceiling sets that have numbers in them."""
    found = []
    for source in ("measured", "datasheet"):
        data = record.ceilings.get(source)
        if not isinstance(data, dict):
            continue
        bandwidth = _number(data.get("memory_bandwidth"))
        flops = {
            str(k): float(v)
            for k, v in (data.get("matmul_flops") or {}).items()
            if _number(v) is not None and float(v) > 0
        }
        if (bandwidth and bandwidth > 0) or flops:
            found.append(Ceiling(source, bandwidth if bandwidth and bandwidth > 0 else None, flops))
    return found


def used_ceiling(record: RunRecord) -> Ceiling | None:
    """The set the fractions are computed against: ``ceilings.used``, else measured first."""
    sets = ceilings(record)
    used = record.ceilings.get("used")
    return next((c for c in sets if c.source == used), sets[0] if sets else None)


def _roofline(
    case: CaseRecord, median_s: float, ceiling: Ceiling | None
) -> tuple[float | None, str | None]:
    metrics = case.metrics or {}
    moved, flops = _number(metrics.get("bytes")), _number(metrics.get("flops"))
    if ceiling is None:
        return None, None
    fractions: dict[str, float] = {}
    if moved is not None and ceiling.memory_bandwidth:
        fractions["memory"] = moved / median_s / ceiling.memory_bandwidth
    peak = ceiling.matmul_flops.get(str((case.spec or {}).get("dtype")))
    if flops is not None and peak:
        fractions["compute"] = flops / median_s / peak
    if not fractions:
        return None, None
    bound = max(fractions, key=lambda k: fractions[k])
    return fractions[bound], bound


@dataclass(frozen=True)
class _Index:
    """The records a case is compared with: peers by id, ``reference`` and the engine peer
    by case."""

    peers: dict[str, CaseRecord]
    references: dict[tuple[str, int, str], CaseRecord]
    engines: dict[tuple[str, int, str], CaseRecord]
    engine_name: str | None

    @classmethod
    def of(cls, record: RunRecord) -> _Index:
        engine = engine_in(record.cases)

        def by_case(name: str | None) -> dict[tuple[str, int, str], CaseRecord]:
            return {_key(c): c for c in record.cases if c.role == "backend" and c.backend == name}

        return cls(
            peers={c.id: c for c in record.cases if c.role == "peer"},
            references=by_case(REFERENCE),
            engines=by_case(engine),
            engine_name=engine,
        )

    def engine(self, case: CaseRecord) -> CaseRecord | None:
        if case.role != "backend" or case.backend == self.engine_name:
            return None
        return self.engines.get(_key(case))

    def peer(self, case: CaseRecord) -> CaseRecord | None:
        return None if case.role == "peer" else self.peers.get(case.peer or "")

    def reference(self, case: CaseRecord) -> CaseRecord | None:
        if case.role == "backend" and case.backend == REFERENCE:
            return None
        return self.references.get(_key(case))


def _key(case: CaseRecord) -> tuple[str, int, str]:
    return case.workload, case.workload_version, case.case


def _stats(
    record: RunRecord, case: CaseRecord, index: _Index, ceiling: Ceiling | None
) -> CaseStats:
    kind = workload_kind(record, case)
    samples = _samples(case)
    if samples is None or case.forward is None:
        return CaseStats(case=case, kind=kind)
    confidence = case.forward.confidence
    summary = Summary.of(samples, confidence=confidence, resamples=_resamples(len(samples)))
    median_s = summary.median / 1e9
    ratio_peer, ratio_peer_ci = _ratio(case, index.peer(case), confidence)
    ratio_ref, ratio_ref_ci = _ratio(case, index.reference(case), confidence, REFERENCE_RESAMPLES)
    ratio_engine, ratio_engine_ci = _ratio(
        case, index.engine(case), confidence, REFERENCE_RESAMPLES
    )
    fraction, bound = _roofline(case, median_s, ceiling)
    peer = _samples(index.peer(case)) if case.role != "peer" else None
    why = unreliable(samples, peer, ratio_peer, ratio_peer_ci)
    return CaseStats(
        case=case,
        kind=kind,
        median_s=median_s,
        ci_s=(summary.ci_low / 1e9, summary.ci_high / 1e9),
        confidence=confidence,
        ratio_peer=ratio_peer,
        ratio_peer_ci=ratio_peer_ci,
        ratio_reference=ratio_ref,
        ratio_reference_ci=ratio_ref_ci,
        ratio_engine=ratio_engine,
        ratio_engine_ci=ratio_engine_ci,
        roofline_fraction=fraction,
        bound=bound,
        unreliable=why,
    )


def run_stats(record: RunRecord) -> list[CaseStats]:
    """One ``CaseStats`` per case record, in the run's order.

    The bootstraps dominate a report's time; numpy releases the GIL while it
    resamples, so threads share them out. Each bootstrap is seeded on its
    own, so the numbers do not depend on the threads.
    """
    ceiling, index = used_ceiling(record), _Index.of(record)
    workers = max(1, min(MAX_THREADS, os.cpu_count() or 1, len(record.cases)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda case: _stats(record, case, index, ceiling), record.cases))


def overhead_median_ns(record: RunRecord) -> float | None:
    """The timer's overhead (an empty call), recomputed from its samples."""
    overhead = record.timing.get("overhead")
    samples = overhead.get("samples_ns") if isinstance(overhead, dict) else None
    if not samples:
        return None
    return median([float(s) for s in samples])


@dataclass(frozen=True)
class AnalysedRun:
    """A benchmark run with its cases' recomputed numbers, as figures and tables read it."""

    label: str
    path: Path
    record: RunRecord
    cases: list[CaseStats]


def analyse(runs: Sequence[BenchRun]) -> list[AnalysedRun]:
    return [AnalysedRun(r.label, r.path, r.record, run_stats(r.record)) for r in runs]
