"""The paired rounds: both sides timed case by case, round by round, in alternating order.

Every case is first built and checked against the float64 oracle on both
sides (each worker builds the same seeded inputs). A case both sides pass
is open; then, round after round, each open case is timed on one side and
at once on the other (``samples`` forwards each, after ``warmup``), the
side that goes first alternating between rounds and between neighbouring
cases, so drift and a noisy neighbour hit both sides alike. Every round
after the first runs in a fresh pair of worker processes (``SidePair``),
which rebuild the same inputs: a bias that one process carries for its
whole life (its memory layout, say) then varies from round to round, and
the test counts it as spread instead of calling it a change. A round's
unit is ``log(median candidate / median base)``; after each round
``harness.ab.sequential`` weighs the case's rounds, and a decided case is
timed no more. The run ends when every case is decided, or after the plan's
``max_rounds``.

A case that only one side can run is not compared, and says why: a failing
status on the candidate fails it (a lost capability too: UNSUPPORTED where
the base PASSED), as the gate judges statuses.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from harness.ab.sequential import Evidence, SequentialPlan, weigh
from harness.bench.timing import MIN_SAMPLES
from harness.bench.workloads import CaseSpec, Workload
from harness.results.pairs import round_log_ratio
from harness.results.store import FAILING_STATUSES


@dataclass(frozen=True)
class PairConfig:
    """How each round is timed, and the plan that decides."""

    plan: SequentialPlan = field(default_factory=SequentialPlan)
    samples: int = 5  # forwards per side per round: the round's time is their median
    warmup: int = 1
    cold_cache: bool = True  # flush the last-level cache before every forward, as bench does
    time_budget_s: float | None = None  # stop opening rounds after this long (open: INCONCLUSIVE)

    def __post_init__(self) -> None:
        if self.samples < MIN_SAMPLES or self.warmup < 0:
            raise ValueError(
                f"need samples >= {MIN_SAMPLES} (a round's median of fewer is one outlier away "
                f"from wrong) and warmup >= 0, got {self.samples} and {self.warmup}"
            )


@dataclass
class Round:
    """One round of one case: both sides' raw samples, and which side went first."""

    first: str  # "base" or "candidate"
    base_ns: list[int]
    candidate_ns: list[int]

    @property
    def log_ratio(self) -> float:
        return round_log_ratio(self.base_ns, self.candidate_ns)

    def to_json(self) -> dict[str, Any]:
        return {"first": self.first, "base_ns": self.base_ns, "candidate_ns": self.candidate_ns}


@dataclass
class PairedCase:
    """One case of the comparison: statuses, rounds, the evidence and the verdict."""

    workload: Workload
    spec: CaseSpec
    base_status: str = ""
    candidate_status: str = ""
    errors: dict[str, str] = field(default_factory=dict)
    rounds: list[Round] = field(default_factory=list)
    evidence: Evidence | None = None
    verdict: str | None = None  # None while open
    detail: str = ""

    @property
    def key(self) -> str:
        return f"{self.workload.key}/{self.spec.name}"

    @property
    def compared(self) -> bool:
        return self.base_status == "PASSED" and self.candidate_status == "PASSED"

    def log_ratios(self) -> list[float]:
        return [r.log_ratio for r in self.rounds]


def status_verdict(case: PairedCase) -> tuple[str, str] | None:
    """The verdict of a case that cannot be compared (``None``: both sides passed)."""
    base, candidate = case.base_status, case.candidate_status
    if case.compared:
        return None
    if candidate in FAILING_STATUSES:
        why = case.errors.get("candidate", "")
        return "FAIL", f"candidate {candidate}" + (f": {why}" if why else "")
    if candidate == "UNSUPPORTED" and base == "PASSED":
        return "FAIL", "UNSUPPORTED by the candidate, PASSED by the base (a lost capability)"
    if candidate == "UNSUPPORTED" and base == "UNSUPPORTED":
        return "UNSUPPORTED", case.errors.get("candidate", "outside both claims")
    why = case.errors.get("base", "")
    return "UNCOMPARED", f"base {base}" + (f": {why}" if why else "")


ProgressFn = Callable[[str], None]


class Requester(Protocol):
    """What the rounds need of a side: ``SideProcess``, or a model of one in the tests."""

    def request(self, op: str, **fields: Any) -> dict[str, Any]: ...


@runtime_checkable
class Pipelined(Protocol):
    """A side that can take a request and reply later (``SideProcess``)."""

    def send(self, op: str, **fields: Any) -> None: ...

    def receive(self, op: str) -> dict[str, Any]: ...


def request_each(sides: Mapping[str, Requester], op: str, **fields: Any) -> dict[str, dict]:
    """The same request to every side, answered by all at once where they can.

    Building and checking a case takes both workers as long as it takes one
    when each has a core: the oracle check and the fresh pair's rebuilding
    were half of an ``ab`` run's time done one side after the other. Never
    used for timing, where the sides must take turns.
    """
    pipelined = {label: side for label, side in sides.items() if isinstance(side, Pipelined)}
    for side in pipelined.values():
        side.send(op, **fields)
    return {
        label: pipelined[label].receive(op) if label in pipelined else side.request(op, **fields)
        for label, side in sides.items()
    }


Renewal = tuple[Callable[[], Mapping[str, Requester]], str]
"""How to start a fresh pair of sides, and the size their cases are rebuilt at."""


def prepare_cases(
    sides: Mapping[str, Requester],
    plan: Sequence[tuple[Workload, CaseSpec]],
    size: str,
    progress: ProgressFn,
) -> list[PairedCase]:
    """Build and check every case on both sides; the ones that cannot be compared get verdicts."""
    cases = []
    for workload, spec in plan:
        case = PairedCase(workload, spec)
        replies = request_each(sides, "prepare", workload=workload.name, case=spec.name, size=size)
        for label, reply in replies.items():
            status = reply.get("status", "RUNTIME_ERROR")
            setattr(case, f"{label}_status", status)
            if reply.get("error"):
                case.errors[label] = str(reply["error"])
        decided = status_verdict(case)
        if decided is not None:
            case.verdict, case.detail = decided
        progress(f"checked {case.key}: base {case.base_status}, candidate {case.candidate_status}")
        cases.append(case)
    return cases


def _time_round(
    sides: Mapping[str, Requester], case: PairedCase, first: str, config: PairConfig
) -> Round:
    order = ("base", "candidate") if first == "base" else ("candidate", "base")
    samples = {}
    for label in order:
        reply = sides[label].request(
            "time",
            key=case.key,
            samples=config.samples,
            warmup=config.warmup,
            cold_cache=config.cold_cache,
        )
        samples[label] = [int(x) for x in reply["samples_ns"]]
    return Round(first, samples["base"], samples["candidate"])


def load_cases(sides: Mapping[str, Requester], cases: Sequence[PairedCase], size: str) -> None:
    """Rebuild the open cases in fresh workers; the ones a side cannot rebuild get verdicts."""
    for case in cases:
        replies = request_each(
            sides, "load", workload=case.workload.name, case=case.spec.name, size=size
        )
        for label, reply in replies.items():
            status = reply.get("status", "RUNTIME_ERROR")
            if status != "PASSED":
                setattr(case, f"{label}_status", status)
                case.errors[label] = f"in a fresh process: {reply.get('error') or status}"
        decided = status_verdict(case)
        if decided is not None:
            case.verdict, case.detail = decided


def run_rounds(
    sides: Mapping[str, Requester],
    cases: list[PairedCase],
    config: PairConfig,
    progress: ProgressFn,
    clock: Callable[[], float] = time.monotonic,
    renew: Renewal | None = None,
) -> None:
    """Time the open cases round by round until each is decided (verdicts set in place).

    With ``renew`` (``SidePair.start`` and the cases' size), every round
    after the first runs in a fresh pair of workers that rebuild the open
    cases first; without it, every round reuses ``sides``.
    """
    compared = [c for c in cases if c.compared]
    started = clock()
    for number in range(config.plan.max_rounds):
        still_open = [c for c in compared if c.verdict is None]
        if not still_open:
            break
        if config.time_budget_s is not None and clock() - started > config.time_budget_s:
            break
        if renew is not None and number > 0:
            start, size = renew
            sides = start()
            load_cases(sides, still_open, size)
        for index, case in enumerate(compared):
            if case.verdict is not None:
                continue
            first = "base" if (number + index) % 2 == 0 else "candidate"
            case.rounds.append(_time_round(sides, case, first, config))
            case.evidence = weigh(case.log_ratios(), config.plan, len(compared))
            if case.evidence.decision is not None:
                case.verdict = case.evidence.decision
                for side in sides.values():
                    side.request("drop", key=case.key)
        decided = sum(c.verdict is not None for c in compared)
        progress(f"round {number + 1}: {decided} of {len(compared)} cases decided")
    for case in compared:
        if case.verdict is None:
            case.verdict = "INCONCLUSIVE"
        case.detail = evidence_text(case.evidence)


def evidence_text(evidence: Evidence | None) -> str:
    """``+12.3% [+8.1%, +16.7%] over 9 rounds``: the paired ratio's estimate and interval."""
    if evidence is None or evidence.rounds == 0:
        return "not timed"
    low, high = evidence.interval()

    def signed(factor: float) -> str:
        return f"{(factor - 1.0) * 100:+.1f}%" if math.isfinite(factor) else "?"

    return (
        f"{signed(evidence.ratio)} [{signed(low)}, {signed(high)}] "
        f"over {evidence.rounds} round{'s' if evidence.rounds != 1 else ''}"
    )
