"""What an interpreted backend's examples cost, and which ones a run can afford.

Under Triton's interpreter every kernel program runs as Python, one tile at
a time, so an example costs about (programs x tiles) times a per-kernel
constant: a kernel with more programs per step (split-KV decode, a grid per
query block) pays many times what the built-in ``triton`` backend pays for
the same draw. Sizing an interpreted run by example counts alone lets such a
kernel run for hours, and reports the harness's own sizing as the backend's
failure when a production-size draw overruns the per-example limit.

So an interpreted run is sized by cost. ``step_work`` counts a step's tiles
(programs x tiles, for any tiling: the per-kernel constant is fitted, not
assumed); a ``CostMeter`` fits seconds per tile on the backend's own first
examples of each test; ``CostLedger.admit`` lets an example run only when its
predicted cost fits what is left of the test's time budget. An example the
run cannot afford, or one that overran its deadline, is *not checked*: the
verdict table and the closing lines say how many, and what the largest would
have cost. It is never reported as the backend failing.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from harness.numerics.scenario import Scenario

QUERY_TILE = 16
KEY_TILE = 32
SHARE_MULTIPLE = 3.0
"""A test may spend this many equal parts of what is left of its backend's budget."""
MIN_STEP_TILES = 16
"""A stateful step this small is always taken: every run checks its small steps."""


def step_work(
    num_layers: int,
    num_heads: int,
    query_lens: Sequence[int],
    context_lens: Sequence[int],
    query_tile: int = QUERY_TILE,
) -> int:
    """Tiles one step costs an interpreted kernel: a launch per layer, then per head
    and sequence one tile per (query block x key block); a query block is
    ``query_tile`` tokens (``Capabilities.query_tile``: 1 for a decode-only kernel)."""
    tiles = sum(
        math.ceil(max(q, 1) / query_tile) * math.ceil(max(c, 1) / KEY_TILE)
        for q, c in zip(query_lens, context_lens, strict=True)
    )
    return num_layers * (1 + num_heads * tiles)


def scenarios_work(scenarios: Iterable[Scenario], query_tile: int = QUERY_TILE) -> int:
    """``step_work`` summed over an example's steps (every rank's, every layer's)."""
    return sum(
        step_work(s.num_layers, s.num_heads, s.query_lens, s.context_lens, query_tile)
        for s in scenarios
    )


@dataclass
class CostMeter:
    """Seconds an example takes, as ``fixed + per_tile * work``, fitted by least squares
    on the examples measured so far.

    Both parts matter: an interpreted example costs about a second however
    small (the oracle, the caches, Python's launch overhead) and then grows with
    its tiles, so a rate fitted through zero on the small first examples would
    predict a large one at many times its cost.
    """

    count: int = 0
    work: float = 0.0
    seconds: float = 0.0
    work_squared: float = 0.0
    work_seconds: float = 0.0

    def observe(self, work: int, seconds: float) -> None:
        self.count += 1
        self.work += work
        self.seconds += seconds
        self.work_squared += work * work
        self.work_seconds += work * seconds

    def fit(self) -> tuple[float, float] | None:
        """``(fixed, per_tile)``, both at least 0; ``None`` before any measurement."""
        if self.count == 0:
            return None
        mean_work, mean_seconds = self.work / self.count, self.seconds / self.count
        spread = self.work_squared / self.count - mean_work**2
        if self.count == 1 or spread <= 1e-9 * max(1.0, mean_work**2):
            return mean_seconds / 2, mean_seconds / 2 / max(mean_work, 1.0)  # one size seen
        per_tile = (self.work_seconds / self.count - mean_work * mean_seconds) / spread
        if per_tile < 0:
            return mean_seconds, 0.0
        fixed = mean_seconds - per_tile * mean_work
        if fixed < 0:
            return 0.0, self.work_seconds / self.work_squared
        return fixed, per_tile

    def predict(self, work: int) -> float | None:
        """Seconds ``work`` tiles would take; ``None`` before any measurement."""
        fitted = self.fit()
        return None if fitted is None else fitted[0] + fitted[1] * work


@dataclass(frozen=True)
class NotChecked:
    """One example an interpreted run did not check, and why."""

    backend: str
    test: str  # the test's shown name, parameters included
    seconds: float  # its predicted cost, or how long it ran before the deadline
    timed_out: bool  # it ran and overran the deadline (else: predicted over the budget)
    scenario: str
    kind: str = "example"  # or "stateful step": the state machine is cut step by step


@dataclass
class CostLedger:
    """One run's costs per backend and per test, and the examples it left unchecked.

    A backend's budget is shared by its tests: each test, when it first asks,
    may spend up to ``SHARE_MULTIPLE`` equal parts of what the tests before it
    left (costs are uneven: most rejection tests need a second, an oracle test
    on production shapes a minute), so a cheap test's unused seconds go to the
    costly ones after it, and no test takes what the rest need.
    """

    budget_s: float  # seconds of examples one backend's run may spend, all its tests together
    tests: dict[str, int] = field(default_factory=dict)  # per backend: its tests in the run
    allowances: dict[tuple[str, str], float] = field(default_factory=dict)
    meters: dict[tuple[str, str], CostMeter] = field(default_factory=dict)
    spent: dict[tuple[str, str], float] = field(default_factory=dict)
    checked: dict[tuple[str, str], int] = field(default_factory=dict)
    skipped: list[NotChecked] = field(default_factory=list)
    failing: set[tuple[str, str]] = field(default_factory=set)  # tests that have failed
    step_caps: dict[tuple[str, str], float] = field(default_factory=dict)

    def _meter(self, backend: str, test: str) -> CostMeter:
        """The test's own meter once it has two examples; before, the backend's."""
        own = self.meters.get((backend, test))
        if own is not None and own.count >= 2:
            return own
        return self.meters.setdefault((backend, ""), CostMeter())

    def allowance(self, backend: str, test: str) -> float:
        """The test's part of its backend's budget, fixed when the test first asks."""
        key = (backend, test)
        if key not in self.allowances:
            spent = sum(v for (b, _), v in self.spent.items() if b == backend)
            started = sum(1 for b, _ in self.allowances if b == backend)
            waiting = max(1, self.tests.get(backend, 1) - started)
            left = max(0.0, self.budget_s - spent)
            self.allowances[key] = min(left, SHARE_MULTIPLE * left / waiting)
        return self.allowances[key]

    def left(self, backend: str, test: str) -> float:
        return self.allowance(backend, test) - self.spent.get((backend, test), 0.0)

    def deadline_s(self, backend: str, test: str) -> float:
        """How long the next example may run: what is left of the test's part, never
        under a quarter of it (an example as cheap as predicted finishes well inside);
        no limit of its own once the test has failed."""
        if (backend, test) in self.failing:
            return math.inf
        return max(self.left(backend, test), self.allowance(backend, test) / 4)

    def failed(self, backend: str, test: str) -> None:
        """The test has failed: from now on every example runs, so hypothesis's shrinking
        and its replay of the failure see the same outcome as the first run (an example
        refused on replay would pass, and hypothesis would report the test as flaky)."""
        self.failing.add((backend, test))

    def step_cap(self, backend: str, test: str, steps: int) -> float:
        """The most tiles one stateful step may have: fixed at the test's start, so a
        step's admission depends only on its own draw, never on the clock (hypothesis
        replays a run's prefix and requires the same draws from it).

        It is the largest step whose predicted cost fits the test's part spread over
        ``steps``, the most steps the test can take; at least ``MIN_STEP_TILES``.
        """
        key = (backend, test)
        if key not in self.step_caps:
            fitted = self._meter(backend, test).fit()
            share = self.allowance(backend, test) / max(steps, 1)
            if fitted is None or fitted[1] == 0:
                cap = math.inf
            else:
                cap = max(MIN_STEP_TILES, (share - fitted[0]) / fitted[1])
            self.step_caps[key] = cap
        return self.step_caps[key]

    def admit(
        self, backend: str, test: str, work: int, scenario: str, kind: str = "example"
    ) -> bool:
        """Whether an example of ``work`` tiles fits what is left of the test's budget.

        The first example a backend ever runs has no prediction and runs; one
        refused is recorded as not checked, with its predicted cost.
        """
        left = self.left(backend, test)  # fixes the test's part at its first example
        predicted = self._meter(backend, test).predict(work)
        if predicted is None or predicted <= left or (backend, test) in self.failing:
            return True
        self.skipped.append(NotChecked(backend, test, predicted, False, scenario, kind))
        return False

    def charge(self, backend: str, test: str, work: int, seconds: float) -> None:
        """An example ran to the end in ``seconds``: spend them, and fit the meters on them."""
        key = (backend, test)
        self.spent[key] = self.spent.get(key, 0.0) + seconds
        self.checked[key] = self.checked.get(key, 0) + 1
        self.meters.setdefault(key, CostMeter()).observe(work, seconds)
        self.meters.setdefault((backend, ""), CostMeter()).observe(work, seconds)

    def spend(self, backend: str, test: str, seconds: float) -> None:
        """A failing example (or a shrinking step) took ``seconds``: they come out of the
        budget, so a failing run's shrinking leaves the tests after it less, and the run's
        wall time stays bounded; they teach no meter (a failure may stop early)."""
        key = (backend, test)
        self.spent[key] = self.spent.get(key, 0.0) + seconds

    def overran(self, backend: str, test: str, work: int, seconds: float, scenario: str) -> None:
        """An example hit its deadline: not checked; what it cost so far teaches the meters."""
        key = (backend, test)
        self.spent[key] = self.spent.get(key, 0.0) + seconds
        self.meters.setdefault(key, CostMeter()).observe(work, seconds)
        self.meters.setdefault((backend, ""), CostMeter()).observe(work, seconds)
        self.skipped.append(NotChecked(backend, test, seconds, True, scenario))

    def merge(self, other: CostLedger) -> None:
        """Add what another process spent and left unchecked (a conformance worker, which
        had its share of the budget) to this ledger, which holds the run's whole budget."""
        for key, seconds in other.spent.items():
            self.spent[key] = self.spent.get(key, 0.0) + seconds
        for key, count in other.checked.items():
            self.checked[key] = self.checked.get(key, 0) + count
        self.skipped.extend(other.skipped)
        self.failing |= other.failing

    def for_test(self, backend: str, test: str) -> TestCosts:
        """This ledger as one test of one backend sees it."""
        return TestCosts(self, backend, test)

    def checked_in(self, backend: str, test: str) -> int:
        return self.checked.get((backend, test), 0)

    def not_checked(self, backend: str) -> list[NotChecked]:
        return [n for n in self.skipped if n.backend == backend]

    def summary_lines(self, profile: str) -> list[str]:
        """One line per backend that left examples unchecked: how many, the costliest."""
        lines = []
        for backend in sorted({n.backend for n in self.skipped}):
            left = self.not_checked(backend)
            worst = max(left, key=lambda n: n.seconds)
            overran = sum(n.timed_out for n in left)
            ran_out = f", {overran} of them stopped at their deadline" if overran else ""
            kinds = Counter(n.kind for n in left)
            what = " and ".join(f"{count} {kind}(s)" for kind, count in sorted(kinds.items()))
            lines.append(
                f"attn-harness: {what} of {backend!r} not checked: over the {profile} "
                f"profile's {self.budget_s:g} s of examples for the run{ran_out}; "
                f"the costliest, {worst.seconds:.0f} s in {worst.test}: {worst.scenario}"
            )
        return lines


@dataclass(frozen=True)
class TestCosts:
    """One test's share of a ``CostLedger``: what the suite's checks and the stateful
    machine call around each example (or each step)."""

    ledger: CostLedger
    backend: str
    test: str

    def admit(self, work: int, scenario: str, kind: str = "example") -> bool:
        return self.ledger.admit(self.backend, self.test, work, scenario, kind)

    def admit_step(self, work: int, scenario: str, steps: int) -> bool:
        """Whether a stateful step of ``work`` tiles is taken (``CostLedger.step_cap``)."""
        if work <= self.ledger.step_cap(self.backend, self.test, steps):
            return True
        predicted = self.ledger._meter(self.backend, self.test).predict(work) or 0.0
        self.ledger.skipped.append(
            NotChecked(self.backend, self.test, predicted, False, scenario, "stateful step")
        )
        return False

    def failed(self) -> None:
        self.ledger.failed(self.backend, self.test)

    def deadline_s(self) -> float:
        return self.ledger.deadline_s(self.backend, self.test)

    def charge(self, work: int, seconds: float) -> None:
        self.ledger.charge(self.backend, self.test, work, seconds)

    def spend(self, seconds: float) -> None:
        self.ledger.spend(self.backend, self.test, seconds)

    def overran(self, work: int, seconds: float, scenario: str) -> None:
        self.ledger.overran(self.backend, self.test, work, seconds, scenario)
