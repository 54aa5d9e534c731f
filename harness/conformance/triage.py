"""Failure triage: which failures share a cause, and what separates them from what held.

One bug usually fails many tests: a causal mask off by one fails every test
that draws a multi-token query, and passes every decode. Listing sixteen
near-identical failures hides that; the evidence to say it is already in the
run. Every checked example is labelled along the coverage dimensions
(``claim_coverage.labels``: dtype, query length, page size, variant, rank
position, ...) and a few of the triage's own, held or failed
(``triage_evidence``). For each dimension this module takes the
labels the failing examples have and asks how many held examples share them:
a dimension whose failing labels no held example has, while held examples
outside them exist, is where the bug lives ("every failing example has query
length 2-64; all 212 examples with query length 1 held").

The scoring is deliberately plain (precision of "label in the failing set"
as a predictor of failure, ties broken by how many held examples it puts
outside): it is a hint for a person, printed with its counts, never a
verdict. Failures no dimension separates are grouped by the property that
failed, which is then the evidence ("every example of this property
failed; every other property held").

Public: ``Cause``, ``Group``, ``explain``, ``group_failures``, ``cause_line``,
``group_json``, and, from ``triage_evidence``, ``example_key``, ``TriageLog``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.conformance.claim_coverage import DIMENSIONS
from harness.conformance.triage_evidence import (
    DIMENSION_WORDS,
    TRIAGE_DIMENSIONS,
    ExampleKey,
    TestEvidence,
    TriageLog,
    count_bucket,
    example_key,
    index_bucket,
    triage_labels,
)

__all__ = [
    "DIMENSION_WORDS",
    "TRIAGE_DIMENSIONS",
    "Cause",
    "ExampleKey",
    "Group",
    "TestEvidence",
    "TriageLog",
    "cause_line",
    "chance_of",
    "count_bucket",
    "example_key",
    "explain",
    "group_failures",
    "group_json",
    "index_bucket",
    "symptom",
    "triage_labels",
]

MIN_HELD_OUTSIDE = 2
"""A dimension separates only when at least this many held examples lie outside the
failing labels: one held example is too little to say where a bug lives."""

MIN_PRECISION = 0.75
"""Below this share of failures among the examples with the failing labels, the
dimension does not explain the failures (they are spread over held examples too)."""


@dataclass(frozen=True)
class Cause:
    """A dimension whose values the failing examples share and the held ones mostly lack."""

    dimension: str
    failing: tuple[str, ...]  # the labels failing examples have along it
    others: tuple[str, ...]  # labels held examples have that no failing example has
    failed: int  # failing examples
    held_inside: int  # held examples with one of the failing labels
    held_outside: int  # held examples with none of them
    unexplained: int = 0  # failing examples without any of the failing labels (left over)
    within: Cause | None = None  # a first condition this one holds under (mask causal, ...)
    labels_seen: int = 1  # distinct labels along the dimension, failing or held

    @property
    def precision(self) -> float:
        return self.failed / (self.failed + self.held_inside)

    @property
    def held_apart(self) -> int:
        """Held examples that the cause (both conditions, with ``within``) puts outside."""
        return self.held_outside + (self.within.held_apart if self.within else 0)


def _labels_of(key: ExampleKey, dimension: str) -> frozenset[str]:
    for d, found in key:
        if d == dimension:
            return found
    return frozenset()


def _order(values: Iterable[str], counts: Counter[str]) -> tuple[str, ...]:
    return tuple(sorted(values, key=lambda v: (-counts[v], v)))


LEFT_OVER = 0.1
"""At most this share of failing examples may stay outside a cause's labels, and only
those no label predicts well (a step of a multi-step example labelled by its first step)."""


def _cover(
    failed: Counter[ExampleKey], held: Counter[ExampleKey], dimension: str
) -> tuple[list[str], int]:
    """Labels along ``dimension`` that the failing examples have, chosen greedily,
    and how many failing examples have none of them.

    An example of several ranks carries each rank's label, and only some of
    them may be where it failed: taking every label of every failing example
    would blame a prefill that rode along with a failing decode. So labels
    are taken one at a time, each the one that best predicts failure (most
    failing examples per held example with it), until every failing example
    has one, or the few left (``LEFT_OVER``) have only labels that predict
    nothing.
    """
    held_with: Counter[str] = Counter()
    for key, n in held.items():
        for label in _labels_of(key, dimension):
            held_with[label] += n
    remaining = {key: n for key, n in failed.items() if _labels_of(key, dimension)}
    total = sum(remaining.values())
    chosen: list[str] = []
    while remaining:
        covers: Counter[str] = Counter()
        for key, n in remaining.items():
            for label in _labels_of(key, dimension):
                covers[label] += n
        label = max(covers, key=lambda v: (covers[v] / (covers[v] + held_with[v]), covers[v], v))
        left = sum(remaining.values())
        precise = covers[label] / (covers[label] + held_with[label]) >= MIN_PRECISION
        if chosen and not precise and left <= LEFT_OVER * total:
            return chosen, left
        chosen.append(label)
        remaining = {k: n for k, n in remaining.items() if label not in _labels_of(k, dimension)}
    return chosen, 0


def _along(failed: Counter[ExampleKey], held: Counter[ExampleKey], dimension: str) -> Cause | None:
    """The cause along one dimension, whatever its precision (``None``: no labels)."""
    failing, left = _cover(failed, held, dimension)
    if not failing:
        return None
    chosen = set(failing)
    failing_counts: Counter[str] = Counter()
    for key, n in failed.items():
        for label in _labels_of(key, dimension) & chosen:
            failing_counts[label] += n
    labelled = sum(n for key, n in failed.items() if _labels_of(key, dimension))
    inside = outside = 0
    other_counts: Counter[str] = Counter()
    for key, n in held.items():
        found = _labels_of(key, dimension)
        if not found:
            continue
        if found & chosen:
            inside += n
        else:
            outside += n
            for label in found:
                other_counts[label] += n
    seen = {label for key in (*failed, *held) for label in _labels_of(key, dimension)}
    return Cause(
        dimension,
        _order(failing, failing_counts),
        _order(other_counts, other_counts),
        labelled - left,
        inside,
        outside,
        unexplained=left,
        labels_seen=len(seen),
    )


SIGNIFICANCE = 0.01
"""The chance that labels drawn at random would separate as well, at most (after a
Bonferroni factor for the dimensions tried): a few examples always split somewhere."""


def chance_of(cause: Cause) -> float:
    """One-sided hypergeometric tail: the chance that ``cause.failed`` or more of the
    failing examples land inside by luck, with the inside and outside sizes fixed
    (Fisher's exact test)."""
    failing = cause.failed + cause.unexplained
    total = failing + cause.held_inside + cause.held_outside
    inside = cause.failed + cause.held_inside
    ways = math.comb(total, inside)
    tail = sum(
        math.comb(failing, k) * math.comb(total - failing, inside - k)
        for k in range(cause.failed, min(failing, inside) + 1)
    )
    return tail / ways


def _unlikely(cause: Cause) -> bool:
    """Below ``SIGNIFICANCE`` after two corrections: one for the dimensions tried, one for
    the label sets of that size the cover could have picked along this dimension (a
    dimension of many labels, such as a context's power of two, splits a few examples
    cleanly somewhere by luck)."""
    choices = math.comb(max(cause.labels_seen, len(cause.failing)), len(cause.failing))
    return chance_of(cause) * len(TRIAGE_DIMENSIONS) * choices <= SIGNIFICANCE


def _separates(cause: Cause | None) -> bool:
    return (
        cause is not None
        and cause.held_outside >= MIN_HELD_OUTSIDE
        and cause.precision >= MIN_PRECISION
        and _unlikely(cause)
    )


def _single(
    failed: Counter[ExampleKey], held: Counter[ExampleKey], skip: str | None = None
) -> Cause | None:
    best: Cause | None = None
    for dimension in TRIAGE_DIMENSIONS:
        if dimension == skip:
            continue
        cause = _along(failed, held, dimension)
        if cause is not None and _separates(cause) and (best is None or _rank(cause) > _rank(best)):
            best = cause
    return best


def _inside(examples: Counter[ExampleKey], dimension: str, chosen: set[str]) -> Counter[ExampleKey]:
    return Counter({k: n for k, n in examples.items() if _labels_of(k, dimension) & chosen})


def _better_pair(pair: Cause, best: Cause | None) -> bool:
    """A pair of conditions replaces one only when it is more precise and leaves at most
    half the held examples inside; pairs compete with each other by rank."""
    if best is None:
        return True
    if best.within is not None:
        return _rank(pair) > _rank(best)
    return pair.precision > best.precision and pair.held_inside <= best.held_inside // 2


def explain(failed: Counter[ExampleKey], held: Counter[ExampleKey]) -> Cause | None:
    """The dimension (or two) that best separates ``failed`` from ``held`` examples.

    Examples are counted once per distinct set of labels: hypothesis tries many
    variants of one failing example while it shrinks, and twenty copies of one
    example are one piece of evidence, not twenty.

    For each dimension, the failing labels are those the failing examples
    have (``_cover``); a held example is inside when it has one too. The
    best dimension has the highest precision (failures among the examples
    inside), then the most held examples outside, then the fewest failing
    labels. When held examples remain inside it, a second dimension is
    sought among them ("mask causal and batch kind decode": a mask bug a
    non-causal decode escapes); it is kept only if it is more precise and
    leaves at most half as many held examples inside. Without a single
    dimension, a pair is sought whose first condition is itself unlikely by
    chance. None
    is returned when nothing puts ``MIN_HELD_OUTSIDE`` held examples outside
    at ``MIN_PRECISION`` or better.
    """
    if not failed:
        return None
    failed, held = Counter(dict.fromkeys(failed, 1)), Counter(dict.fromkeys(held, 1))
    best = _single(failed, held)
    if best is not None and best.held_inside == 0:
        return best
    firsts = [best] if best is not None else [_along(failed, held, d) for d in TRIAGE_DIMENSIONS]
    for first in firsts:
        if first is None or not _separates_alone(first):
            continue
        chosen = set(first.failing)
        inside_failed = _inside(failed, first.dimension, chosen)
        inside_held = _inside(held, first.dimension, chosen)
        second = _single(inside_failed, inside_held, skip=first.dimension)
        if second is None:
            continue
        pair = Cause(
            second.dimension,
            second.failing,
            second.others,
            second.failed,
            second.held_inside,
            second.held_outside,
            unexplained=second.unexplained + first.unexplained,
            within=first,
            labels_seen=second.labels_seen,
        )
        if _better_pair(pair, best):
            best = pair
    return best


def _separates_alone(cause: Cause) -> bool:
    """A first condition of a pair: held examples outside it, and not there by chance."""
    return cause.held_outside >= MIN_HELD_OUTSIDE and _unlikely(cause)


def _rank(cause: Cause) -> tuple[float, int, int, bool, int]:
    """Precision, then held examples set apart; on a tie fewer labels (``soft-cap on``
    before three variant combinations), a coverage dimension (the words a run's coverage
    table uses) before the triage's own, then the order of ``TRIAGE_DIMENSIONS``."""
    return (
        cause.precision,
        cause.held_apart,
        -len(cause.failing),
        cause.dimension in DIMENSIONS,
        -TRIAGE_DIMENSIONS.index(cause.dimension),
    )


@dataclass
class Group:
    """Failures that share one explanation: a cause, or the property they failed."""

    failures: list[Any]  # report.FailureEntry, the representative first
    cause: Cause | None
    property_only: str | None = None  # the one test that failed, when no dimension separates
    held_elsewhere: int = 0  # held examples of the backend's other tests (property_only)
    every_example_failed: bool = False  # property_only: no example of that test held


def group_json(group: Group) -> dict[str, Any]:
    """A group as plain data: the dimensions it names, its labels, its tests, its line."""
    causes = [c for c in (group.cause.within if group.cause else None, group.cause) if c]
    return {
        "dimensions": [c.dimension for c in causes],
        "failing_labels": {c.dimension: list(c.failing) for c in causes},
        "property": group.property_only,
        "tests": [f.test for f in group.failures],
        "line": cause_line(group),
    }


def _function(test: str) -> str:
    return test.partition("[")[0]


def symptom(failure: Any) -> str:
    """What kind of check a failure broke: ``oracle`` for an output judged against the
    float64 oracle, else the test function (its own kind).

    Examples held by one kind of check say nothing about another: two wrong
    answers that agree hold "ranks together equal each alone" while failing
    the oracle. So evidence is pooled only among failures of one symptom.
    """
    if "EXCEEDS bound" in failure.detail or "vs oracle" in failure.detail:
        return "oracle"
    return _function(failure.test)


def group_failures(backend: str, failures: Sequence[Any], log: TriageLog) -> list[Group]:
    """``failures`` (one backend's, in run order) grouped by what explains them.

    Failures are split by symptom (``symptom``). Within one, the failing and
    held examples of all its tests are pooled: when one dimension explains
    them, they form one group. Otherwise each failed test is explained by
    its own examples, tests with the same explanation share a group, and
    tests no dimension explains are grouped by test function.
    """
    tests = log.tests(backend)

    def evidence_of(names: Iterable[str]) -> tuple[Counter[ExampleKey], Counter[ExampleKey]]:
        failed: Counter[ExampleKey] = Counter()
        held: Counter[ExampleKey] = Counter()
        for name in {_function(n) for n in names}:
            evidence = tests.get(name)
            if evidence is not None:
                failed.update(evidence.failed)
                held.update(evidence.held)
        return failed, held

    by_symptom: dict[str, list[Any]] = {}
    for failure in failures:
        by_symptom.setdefault(symptom(failure), []).append(failure)
    groups: dict[Any, Group] = {}
    for kind, members in by_symptom.items():
        pooled = explain(*evidence_of(f.test for f in members))
        if pooled is not None and len({_function(f.test) for f in members}) > 1:
            groups[(kind, pooled.dimension, pooled.failing)] = Group(list(members), pooled)
            continue
        for failure in members:
            cause = explain(*evidence_of([failure.test]))
            if cause is not None:
                key: Any = (kind, cause.dimension, cause.failing)
                group = groups.setdefault(key, Group([], cause))
            else:
                function = _function(failure.test)
                evidence = tests.get(function, TestEvidence())
                others = sum(sum(e.held.values()) for n, e in tests.items() if n != function)
                group = groups.setdefault(
                    ("test", function),
                    Group(
                        [],
                        None,
                        property_only=function,
                        held_elsewhere=others,
                        every_example_failed=not evidence.held and bool(evidence.failed),
                    ),
                )
            group.failures.append(failure)
    for group in groups.values():
        group.failures.sort(key=_simplest)  # the representative: the shortest scenario
    return sorted(groups.values(), key=lambda g: -len(g.failures))


def _simplest(failure: Any) -> tuple[bool, int]:
    return (not failure.scenario, len(failure.scenario))


def _labels_text(values: Sequence[str], limit: int = 4) -> str:
    shown = list(values[:limit])
    more = len(values) - len(shown)
    text = " or ".join(shown) if len(shown) <= 2 else ", ".join(shown[:-1]) + " or " + shown[-1]
    return text + (f" (+{more} more)" if more > 0 else "")


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _condition(cause: Cause) -> str:
    words = DIMENSION_WORDS.get(cause.dimension, cause.dimension)
    return f"{words} {_labels_text(cause.failing)}"


def _held_apart(cause: Cause) -> str:
    words = DIMENSION_WORDS.get(cause.dimension, cause.dimension)
    return f"every example with {words} {_labels_text(cause.others)} held ({cause.held_outside})"


def cause_line(group: Group) -> str:
    """The group's one-line explanation, with the counts it rests on."""
    count = _plural(len(group.failures), "failure")
    cause = group.cause
    if cause is not None:
        conditions = [cause.within, cause] if cause.within is not None else [cause]
        both = " and ".join(_condition(c) for c in conditions if c is not None)
        line = f"{count}, all with {both} ({_plural(cause.failed, 'failing example')}"
        if cause.unexplained:
            line += f"; {cause.unexplained} more without"
        line += "); " + "; ".join(_held_apart(c) for c in conditions if c is not None)
        if cause.held_inside:
            line += f"; {cause.held_inside} held with the failing labels too"
        return line
    test = group.property_only or "?"
    if group.every_example_failed:
        line = f"{count} in {test} alone: every example of it failed, whatever its shape"
    else:
        line = f"{count} in {test}: no recorded dimension separates its failing examples"
    if group.held_elsewhere:
        line += f"; {group.held_elsewhere} examples of the other properties held"
    return line
