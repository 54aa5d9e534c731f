"""The answer a report leads with: does each backend conform, how fast is it, what needs a look.

A reader opens a report to learn three things before any figure: whether
every backend passed conformance (and where the failures are), how fast
each backend is against the in-run SDPA peer and against the device's
ceiling, and which measurements are suspect (flags). ``verdict_of`` reduces
the inputs and their recomputed statistics to exactly that, as data; the
page and ``summary.md`` both render it, so they agree. Rows that say nothing
(a backend's cases it declared it cannot run) are collapsed here into one
``Unsupported`` line per backend and reason.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness.bench.engine_peer import ENGINE_PEERS
from harness.report.stats import AnalysedRun, CaseStats

if TYPE_CHECKING:
    from harness.report.inputs import ConformanceRun, Inputs
    from harness.results.store import RunRecord

PEER_ROLE = "peer"
UNSUPPORTED = "UNSUPPORTED"
# run-level fields of a results file whose name marks them as warnings about the run
RUN_FLAG_WORDS = ("flag", "warning")


@dataclass(frozen=True)
class ConformanceLine:
    """One backend's conformance tally; ``failures`` are indices into ``ReportVerdict.failures``."""

    backend: str  # as shown: the name, with the file when a backend is in several runs
    passed: int
    failed: int
    unsupported: int
    examples: int
    failures: tuple[int, ...] = ()
    not_checked: int = 0  # examples an interpreted run's cost budget left out

    @property
    def tests(self) -> int:
        return self.passed + self.failed + self.unsupported


@dataclass(frozen=True)
class Range:
    """The median of some values and their extremes."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Range | None:
        return Range(statistics.median(values), min(values), max(values)) if values else None


@dataclass(frozen=True)
class PerformanceLine:
    """One backend of one run: its ratio to the peer and its share of the ceiling, over cases."""

    run: str  # the run's label
    backend: str
    is_peer: bool
    cases: int  # every case of this backend in the run
    timed: int  # cases that passed and were timed
    ratio: Range | None  # median forward time over the peer's, across timed cases
    ratio_engine: Range | None  # ... over the run's engine peer's (None: no engine peer)
    roofline: Range | None  # share of the binding ceiling, across timed cases
    bound: str | None  # the ceilings its cases are bound by, with counts where they differ
    failing: tuple[str, ...] = ()  # "case: STATUS" of each case that did not pass
    unsupported: int = 0
    unsupported_reason: str | None = None  # the most common reason the backend gave
    unreliable: int = 0  # timed cases whose timing is not a result: in no range above

    @property
    def unreliable_note(self) -> str:
        """What the note column says of its unreliable cases ("" where there are none)."""
        if not self.unreliable:
            return ""
        why = "two clusters of samples, or a ratio not known"
        return f"{self.unreliable} unreliable ({why}): in no range"


@dataclass(frozen=True)
class WorkloadLine:
    """One backend on one workload of one run: its share of the ceiling that binds there."""

    run: str
    workload: str
    backend: str
    roofline: Range | None  # across the workload's timed cases
    bound: str | None  # the ceiling most of them are bound by (mem, cmp)


@dataclass(frozen=True)
class Unsupported:
    """Cases a backend declared it cannot run, for one reason: one line, not a row each."""

    run: str
    backend: str
    count: int
    reason: str


@dataclass(frozen=True)
class Flag:
    """A warning about a measurement (a case's flag) or about a whole run."""

    run: str
    text: str
    workload: str | None = None
    case: str | None = None
    backend: str | None = None


@dataclass(frozen=True)
class FailedTest:
    """One failed conformance test, in the order the conformance section lists them."""

    backend: str
    test: str
    message: str


@dataclass
class ReportVerdict:
    conformance: list[ConformanceLine]
    performance: list[PerformanceLine]
    unsupported: list[Unsupported]
    flags: list[Flag]
    failures: list[FailedTest] = field(default_factory=list)
    several_runs: bool = False
    by_workload: list[WorkloadLine] = field(default_factory=list)  # each backend's roofline share

    @property
    def conformance_failed(self) -> list[ConformanceLine]:
        return [line for line in self.conformance if line.failed]

    @property
    def failing_cases(self) -> int:
        return sum(len(line.failing) for line in self.performance)

    @property
    def ok(self) -> bool:
        """True when nothing failed; flags are for a look, not a failure."""
        return not self.conformance_failed and not self.failing_cases

    def headline(self) -> str:
        """One sentence: PASSED or FAILED, and why."""
        parts: list[str] = []
        if self.conformance:
            failed = self.conformance_failed
            if failed:
                names = ", ".join(line.backend for line in failed)
                parts.append(f"conformance failed for {names}")
            else:
                count = len(self.conformance)
                verb = "conforms" if count == 1 else "conform"
                parts.append(f"{count} of {_plural(count, 'backend')} {verb}")
        if self.performance:
            timed = sum(line.timed for line in self.performance if not line.is_peer)
            failing = self.failing_cases
            parts.append(
                f"{_plural(failing, 'benchmark case')} failed"
                if failing
                else f"{timed} cases timed"
            )
        flags = len(self.flags)
        parts.append(f"{_plural(flags, 'measurement flag')}" if flags else "no measurement flag")
        return f"{'PASSED' if self.ok else 'FAILED'}: " + "; ".join(parts)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


# -- conformance --------------------------------------------------------------------------


def _conformance(runs: Sequence[ConformanceRun]) -> tuple[list[ConformanceLine], list[FailedTest]]:
    """One line per backend (per run when a backend is in several); failures numbered in
    the order the conformance section lists them: run by run, each run's in file order."""
    failures: list[FailedTest] = []
    numbers: dict[tuple[int, str], list[int]] = {}
    for index, run in enumerate(runs):
        for case in run.failed():
            numbers.setdefault((index, case.backend), []).append(len(failures))
            failures.append(FailedTest(case.backend, case.test, case.message or ""))
    columns = list(dict.fromkeys((i, c.backend) for i, run in enumerate(runs) for c in run.cases))
    runs_of = Counter(backend for _, backend in columns)
    lines: list[ConformanceLine] = []
    for index, backend in columns:
        run = runs[index]
        outcomes = Counter(c.outcome for c in run.cases if c.backend == backend)
        shown = backend if runs_of[backend] == 1 else f"{backend} ({run.path.name})"
        lines.append(
            ConformanceLine(
                backend=shown,
                passed=outcomes["passed"],
                failed=outcomes["failed"],
                unsupported=outcomes["unsupported"],
                examples=sum(run.examples.get(backend, {}).values()),
                failures=tuple(numbers.get((index, backend), ())),
                not_checked=sum(c.not_checked for c in run.cases if c.backend == backend),
            )
        )
    return lines, failures


# -- performance ----------------------------------------------------------------------------


def _most_common(values: Sequence[str]) -> str | None:
    return Counter(values).most_common(1)[0][0] if values else None


def bound_mix(bounds: Sequence[str]) -> str | None:
    """``"memory"`` where every case is bound by memory; ``"memory 60, compute 20"`` where
    they differ: a backend's decode cases outnumber its prefill ones, and the most common
    bound alone would call its compute-bound cases memory-bound."""
    counts = Counter(bounds).most_common()
    if len(counts) <= 1:
        return counts[0][0] if counts else None
    return ", ".join(f"{bound} {count}" for bound, count in counts)


def _performance(run: AnalysedRun) -> list[PerformanceLine]:
    lines = []
    for backend in dict.fromkeys(s.case.backend for s in run.cases):
        cases = [s for s in run.cases if s.case.backend == backend]
        timed = [s for s in cases if s.valid]
        counted = [s for s in timed if s.counts]  # an unreliable case feeds no median
        ratios = [s.ratio_peer for s in counted if s.ratio_peer is not None]
        to_engine = [s.ratio_engine for s in counted if s.ratio_engine is not None]
        fractions = [s.roofline_fraction for s in counted if s.roofline_fraction is not None]
        failing = tuple(
            f"{s.case.workload} / {s.case.case}: {s.case.status}"
            for s in cases
            if s.case.status not in ("PASSED", UNSUPPORTED)
        )
        lines.append(
            PerformanceLine(
                run=run.label,
                backend=backend,
                is_peer=all(s.case.role == PEER_ROLE for s in cases),
                cases=len(cases),
                timed=len(timed),
                ratio=Range.of(ratios),
                ratio_engine=Range.of(to_engine),
                roofline=Range.of(fractions),
                bound=bound_mix([s.bound for s in timed if s.bound]),
                failing=failing,
                unsupported=sum(s.case.status == UNSUPPORTED for s in cases),
                unsupported_reason=_most_common(
                    [_reason(s) for s in cases if s.case.status == UNSUPPORTED]
                ),
                unreliable=len(timed) - len(counted),
            )
        )
    return lines


def _by_workload(run: AnalysedRun) -> list[WorkloadLine]:
    """Per workload and backend, the share of the binding ceiling over its timed cases: how
    far each backend (the peer one of them) is from the machine, workload by workload."""
    lines = []
    for workload in dict.fromkeys(s.case.workload for s in run.cases):
        cases = [s for s in run.cases if s.case.workload == workload and s.counts]
        for backend in dict.fromkeys(s.case.backend for s in cases):
            own = [s for s in cases if s.case.backend == backend]
            fractions = [s.roofline_fraction for s in own if s.roofline_fraction is not None]
            if fractions:
                bound = _most_common([s.bound for s in own if s.bound])
                lines.append(WorkloadLine(run.label, workload, backend, Range.of(fractions), bound))
    return lines


def _reason(s: CaseStats) -> str:
    return " ".join((s.case.error or "no reason given").split())


def unsupported_groups(run: AnalysedRun) -> list[Unsupported]:
    """Each backend's UNSUPPORTED cases, counted per reason, in the order they appear."""
    counts: Counter[tuple[str, str]] = Counter(
        (s.case.backend, _reason(s)) for s in run.cases if s.case.status == UNSUPPORTED
    )
    return [Unsupported(run.label, b, n, reason) for (b, reason), n in counts.items()]


def shown_cases(run: AnalysedRun) -> list[CaseStats]:
    """The cases worth a row: all but those a backend declared it cannot run."""
    return [s for s in run.cases if s.case.status != UNSUPPORTED]


# -- flags ----------------------------------------------------------------------------------


def _run_flags(label: str, record: RunRecord) -> list[Flag]:
    """Warnings about the run itself: a partial run, and any flag or warning field it carries."""
    flags = []
    if record.partial:
        flags.append(Flag(label, "partial run: it stopped before its last case"))
    for text in getattr(record, "flags", []) or []:  # the run's own (ceiling spread, ...)
        flags.append(Flag(label, str(text)))
    for section in ("timing", "environment"):
        data = getattr(record, section)
        for key, value in (data if isinstance(data, dict) else {}).items():
            if not any(word in str(key).lower() for word in RUN_FLAG_WORDS):
                continue
            items = value if isinstance(value, list) else [value]
            for item in items:
                if item not in (None, "", [], {}):
                    flags.append(Flag(label, f"{section}.{key}: {_flat(item)}"))
    return flags


def _flat(value: object) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={_flat(v)}" for k, v in value.items())
    return " ".join(str(value).split())


def _flags(run: AnalysedRun) -> list[Flag]:
    flags = _run_flags(run.label, run.record)
    for s in run.cases:
        for text in s.case.flags:
            flags.append(Flag(run.label, str(text), s.case.workload, s.case.case, s.case.backend))
    return flags


def verdict_of(inputs: Inputs, runs: Sequence[AnalysedRun]) -> ReportVerdict:
    """The verdict of everything the report was built from."""
    conformance, failures = _conformance(inputs.conformance)
    return ReportVerdict(
        conformance=conformance,
        performance=[line for run in runs for line in _performance(run)],
        unsupported=[group for run in runs for group in unsupported_groups(run)],
        flags=[flag for run in runs for flag in _flags(run)],
        failures=failures,
        several_runs=len(runs) > 1,
        by_workload=[line for run in runs for line in _by_workload(run)],
    )


def engine_among(verdict: ReportVerdict) -> str | None:
    """The engine peer among the verdict's backends (``harness.bench.engine_peer``), if any."""
    backends = {line.backend for line in verdict.performance}
    return next((e for e in ENGINE_PEERS if e in backends), None)
