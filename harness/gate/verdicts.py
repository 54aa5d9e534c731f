"""The gate's verdict over whole runs: statuses, conformance failures, then performance.

Order of judgement, per case (``workload@version/case::backend``):

1. any candidate case (a backend's or the peer's) whose status is failing
   (not PASSED nor UNSUPPORTED) fails the gate, and so does a case that
   PASSED in the baseline and is UNSUPPORTED now (a lost capability);
2. a case UNSUPPORTED on both sides is listed, not compared;
3. a case on one side only is listed (MISSING: gone from the candidate;
   NEW: not in the baseline), not failed;
4. otherwise the case's ratio to its in-run peer is compared (``compare``).

Any failed conformance test among the inputs fails the gate as well.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from harness.gate.compare import (
    MIN_RUNS_FOR_SPREAD,
    Change,
    RunSamples,
    between_run_sigma,
    compare_case,
    performance_verdict,
)
from harness.results.store import FAILING_STATUSES, CaseRecord, RunRecord

# verdicts that fail the gate, and the order the table lists them in
FAILING_VERDICTS = ("FAIL",)
ORDER = ("FAIL", "IMPROVED", "INCONCLUSIVE", "PASS", "MISSING", "NEW", "UNSUPPORTED", "UNCOMPARED")


@dataclass(frozen=True)
class CaseVerdict:
    key: str
    verdict: str
    detail: str = ""
    change: Change | None = None


@dataclass
class GateReport:
    threshold: float
    cases: list[CaseVerdict]
    conformance_failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.conformance_failures) or any(
            c.verdict in FAILING_VERDICTS for c in self.cases
        )

    def count(self, verdict: str) -> int:
        return sum(c.verdict == verdict for c in self.cases)


def case_key(case: CaseRecord, backend: str | None = None) -> str:
    return f"{case.workload}@{case.workload_version}/{case.case}::{backend or case.backend}"


@dataclass
class _Side:
    """Per case key: the runs' samples and every status seen."""

    samples: dict[str, list[RunSamples]] = field(default_factory=lambda: defaultdict(list))
    statuses: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, str] = field(default_factory=dict)
    runs: int = 0


def _collect(runs: Iterable[RunRecord], rename: Mapping[str, str] | None = None) -> _Side:
    side = _Side()
    for run in runs:
        side.runs += 1
        by_id = {c.id: c for c in run.cases}
        for case in run.cases:
            backend = (rename or {}).get(case.backend, case.backend)
            key = case_key(case, backend)
            side.statuses[key].append(case.status)
            if case.error:
                side.errors.setdefault(key, case.error.splitlines()[0])
            peer = by_id.get(case.peer) if case.peer else None
            if case.role == "peer" or not case.valid or peer is None or not peer.valid:
                continue
            assert case.forward is not None
            assert peer.forward is not None
            side.samples[key].append(RunSamples(case.forward.samples_ns, peer.forward.samples_ns))
    return side


PRIOR_DF = 4  # weight of the machine-wide spread, in degrees of freedom (a case's own has runs-1)


def typical_spread(baseline: Mapping[str, Sequence[RunSamples]]) -> float:
    """The machine's typical between-run sigma: the root of the median variance over cases.

    The median, not the mean: a few very noisy cases (tiny batches) must not
    make every case look noisy and hide real regressions everywhere.
    """
    variances = sorted(
        s * s for runs in baseline.values() if (s := between_run_sigma(runs)) is not None
    )
    if not variances:
        return 0.0
    middle = len(variances) // 2
    median = (
        variances[middle] if len(variances) % 2 else (variances[middle - 1] + variances[middle]) / 2
    )
    return math.sqrt(median)


def moderated_spread(own: float | None, runs: int, typical: float) -> float:
    """A case's between-run sigma, its own estimate shrunk toward the machine's typical one.

    Three runs give a sigma with two degrees of freedom: by chance it can come
    out near zero for a noisy case (false alarms) or huge for a quiet one (lost
    power). Pooling it with the typical spread as ``PRIOR_DF`` more degrees of
    freedom (a moderated variance, as in empirical-Bayes tests) keeps both in check.
    """
    if own is None:
        return typical
    own_df = max(runs - 1, 0)
    return math.sqrt((own_df * own * own + PRIOR_DF * typical * typical) / (own_df + PRIOR_DF))


def _status_verdict(key: str, candidate: _Side, baseline: _Side) -> CaseVerdict | None:
    """A verdict decided by statuses alone, or ``None`` to compare times."""
    now = candidate.statuses.get(key)
    before = baseline.statuses.get(key)
    if now is None:
        return CaseVerdict(key, "MISSING", "in the baseline, not in the candidate")
    failed = _failing_status(key, candidate)
    if failed is not None:
        return failed
    if before is None:
        return CaseVerdict(key, "NEW", "not in the baseline")
    if "UNSUPPORTED" in now:
        if "PASSED" in before:
            return CaseVerdict(key, "FAIL", "PASSED in the baseline, UNSUPPORTED now")
        return CaseVerdict(key, "UNSUPPORTED", candidate.errors.get(key, "unsupported"))
    if key.endswith("::contiguous-sdpa"):
        return CaseVerdict(key, "UNCOMPARED", "the peer itself: every ratio is relative to it")
    if not candidate.samples.get(key) or not baseline.samples.get(key):
        side = "candidate" if not candidate.samples.get(key) else "baseline"
        return CaseVerdict(key, "UNCOMPARED", f"no passing time with a timed peer in the {side}")
    return None


def _failing_status(key: str, side: _Side) -> CaseVerdict | None:
    """FAIL when any run of ``side`` gave the case a failing status, naming it and the error."""
    failing = sorted(set(side.statuses.get(key, ())) & FAILING_STATUSES)
    if not failing:
        return None
    why = side.errors.get(key)
    return CaseVerdict(key, "FAIL", f"status {', '.join(failing)}" + (f": {why}" if why else ""))


def status_failures(runs: Sequence[RunRecord], threshold: float) -> GateReport:
    """The gate without a baseline: only cases whose status is failing (no timing compared)."""
    side = _collect(runs)
    verdicts = [_failing_status(key, side) for key in sorted(side.statuses)]
    return GateReport(threshold, [v for v in verdicts if v is not None])


def judge(
    candidate_runs: Sequence[RunRecord],
    baseline_runs: Sequence[RunRecord],
    *,
    threshold: float,
    rename: Mapping[str, str] | None = None,
    conformance_failures: Sequence[str] = (),
) -> GateReport:
    """Every case's verdict; ``rename`` maps candidate backend names to baseline names."""
    if not candidate_runs or not baseline_runs:
        raise ValueError("the gate needs at least one candidate run and one baseline run")
    candidate = _collect(candidate_runs, rename)
    baseline = _collect(baseline_runs)
    typical = typical_spread(baseline.samples) or typical_spread(candidate.samples)
    verdicts: list[CaseVerdict] = []
    for key in sorted(set(candidate.statuses) | set(baseline.statuses)):
        decided = _status_verdict(key, candidate, baseline)
        if decided is not None:
            verdicts.append(decided)
            continue
        spread = _case_spread(baseline.samples[key], candidate.samples[key], typical)
        change = compare_case(key, candidate.samples[key], baseline.samples[key], spread=spread)
        verdict = performance_verdict(change, threshold)
        verdicts.append(CaseVerdict(key, verdict, _change_text(change), change))
    notes = []
    if max(candidate.runs, baseline.runs) < MIN_RUNS_FOR_SPREAD:
        notes.append(
            f"neither side has {MIN_RUNS_FOR_SPREAD} runs: the intervals hold only the noise "
            "within each run, not the spread between processes (a baseline pools >= 3 runs)"
        )
    elif min(candidate.runs, baseline.runs) < MIN_RUNS_FOR_SPREAD:
        notes.append(
            f"{candidate.runs} candidate and {baseline.runs} baseline run(s): the side with "
            f"fewer than {MIN_RUNS_FOR_SPREAD} runs borrows the other's between-run spread "
            f"(typical sigma of log-ratio {typical:.3f}; each case's own is shrunk toward it)"
        )
    if candidate.runs < MIN_RUNS_FOR_SPREAD:
        notes.append(
            f"{candidate.runs} candidate run(s): a burst of other work during one case can move "
            f"its ratio far past any threshold; pool {MIN_RUNS_FOR_SPREAD} runs, whose median "
            "ignores one such run (nox -s gate does)"
        )
    verdicts.sort(key=lambda v: (ORDER.index(v.verdict), v.key))
    return GateReport(threshold, verdicts, list(conformance_failures), notes)


def _case_spread(
    baseline: Sequence[RunSamples], candidate: Sequence[RunSamples], typical: float
) -> float:
    """The between-run sigma lent to a side with too few runs, from the side with more."""
    side = baseline if len(baseline) >= len(candidate) else candidate
    return moderated_spread(between_run_sigma(side), len(side), typical)


def _change_text(change: Change) -> str:
    return (
        f"ratio to peer {change.baseline_ratio:.3g} -> {change.candidate_ratio:.3g}: "
        f"{_signed(change.change)} [{_signed(change.low)}, {_signed(change.high)}]"
    )


def _signed(factor: float) -> str:
    return f"{(factor - 1.0) * 100:+.1f}%"
