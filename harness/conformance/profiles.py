"""Conformance profiles: how many examples, how large, and where failures are remembered.

* ``ci`` — derandomized (the same examples every run, so a failure replays
  by rerunning), bounded, no deadline, no example database.
* ``thorough`` — random, ten times the examples, larger shapes; failing
  examples are saved outside the repository and replayed first next time.
* ``kill`` — a lighter ``ci`` without shrinking, for mutation testing, where
  only "was it caught" matters and a minimal example is not needed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from harness.conformance.plugin_names import PROFILE_NAMES, cache_root
from harness.conformance.production_shapes import CostLimit
from harness.conformance.strategies import CI_BUDGET, THOROUGH_BUDGET, Budget

INTERPRETED_SHARE = 8  # an interpreted backend gets one example in this many
INTERPRETED_BUDGET = Budget(
    max_seqs=3,
    max_context=24,
    max_layers=2,
    max_heads=8,
    production=CostLimit(cache_elements=2**22, work=2**25),
)
"""Plain draws an interpreter runs in about a second; production shapes still reach
split-KV contexts past 256 keys, query tiles past 128 and long decode contexts."""

_SLOW_CHECKS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


@dataclass(frozen=True)
class Profile:
    name: str
    settings: settings
    budget: Budget
    stateful_steps: int  # rules per stateful run, each ending in a forward step
    stateful_examples: int  # stateful runs
    production_examples: int  # per regime, in test_production_shapes
    example_time_limit_s: float = 300.0  # one example past this fails, naming its shape
    enforces_coverage: bool = True  # a claimed value never checked fails the run
    interpreted_budget_s: float = 150.0  # seconds of examples an interpreted backend's run spends
    cost_budget_s: float | None = None  # set on the interpreted profile: examples cut by cost

    def with_examples(self, examples: int) -> Profile:
        """The profile with ``examples`` per property test; production and stateful scale along.

        Production shapes never drop to none. Fewer examples than the profile's
        own cannot promise to reach every claimed value, so coverage is then
        reported but not required.
        """
        default = self.settings.max_examples
        return replace(
            self,
            settings=settings(self.settings, max_examples=examples),
            production_examples=max(1, round(self.production_examples * examples / default)),
            stateful_examples=max(1, round(self.stateful_examples * examples / default)),
            enforces_coverage=self.enforces_coverage and examples >= default,
        )

    def shrinking(self) -> Profile:
        """The profile with hypothesis's shrink phase: ``--max-shrinks`` asks for shrinks,
        which the ``kill`` profile otherwise leaves out. Which examples fail does not change
        (shrinking starts after the first failure), only how small the reported one is."""
        phases = tuple(p for p in Phase if p in self.settings.phases or p is Phase.shrink)
        return replace(self, settings=settings(self.settings, phases=phases))

    def interpreted(self) -> Profile:
        """The profile for a backend that runs interpreted on the chosen device.

        An interpreter costs milliseconds per kernel program, so such a backend
        gets ``1 / INTERPRETED_SHARE`` of the examples (never none of any kind)
        and the smaller ``INTERPRETED_BUDGET``; coverage is reported, not required.
        Its examples also share ``interpreted_budget_s`` seconds, parted among
        its tests: an example whose predicted cost does not fit what is left of
        its test's part is not checked (``harness.conformance.cost_budget``), so
        a kernel with many programs per step gets the same bounded wall time as
        a cheap one. Hypothesis's explain phase is left out: it reruns the
        minimal failing example with each part varied, seconds apiece here, and
        the triage already says what separates failing examples from held ones.
        """
        fewer = self.with_examples(self.scaled_examples(self.settings.max_examples))
        phases = tuple(p for p in fewer.settings.phases if p is not Phase.explain)
        return replace(
            fewer,
            settings=settings(fewer.settings, phases=phases),
            name=f"{self.name} (interpreted)",
            budget=replace(INTERPRETED_BUDGET, max_dp_size=self.budget.max_dp_size),
            stateful_steps=max(3, self.stateful_steps // 2),
            enforces_coverage=False,
            cost_budget_s=self.interpreted_budget_s,
        )

    @staticmethod
    def scaled_examples(examples: int) -> int:
        """An interpreted backend's share of ``examples``: at least one."""
        return max(1, -(-examples // INTERPRETED_SHARE))


def example_database_dir() -> Path:
    """Where the ``thorough`` profile keeps failing examples (under ``cache_root()``)."""
    return cache_root() / "hypothesis"


def get_profile(name: str) -> Profile:
    if name not in PROFILE_NAMES:
        raise ValueError(
            f"unknown conformance profile {name!r}; choose from {', '.join(PROFILE_NAMES)}"
        )
    common = settings(deadline=None, print_blob=True, suppress_health_check=_SLOW_CHECKS)
    if name == "thorough":
        database = DirectoryBasedExampleDatabase(str(example_database_dir()))
        thorough = settings(common, max_examples=1000, derandomize=False, database=database)
        return Profile(
            name,
            thorough,
            THOROUGH_BUDGET,
            stateful_steps=50,
            stateful_examples=300,
            production_examples=100,
            interpreted_budget_s=2000.0,
        )
    if name == "kill":  # only "was it caught" matters: fewer examples, no shrinking
        phases = tuple(p for p in Phase if p is not Phase.shrink)
        quick = settings(common, max_examples=20, derandomize=True, database=None, phases=phases)
        return Profile(
            name,
            quick,
            CI_BUDGET,
            stateful_steps=10,
            stateful_examples=10,
            production_examples=6,
            enforces_coverage=False,
        )
    bounded = settings(common, max_examples=100, derandomize=True, database=None)
    return Profile(
        name,
        bounded,
        CI_BUDGET,
        stateful_steps=20,
        stateful_examples=40,
        production_examples=12,
    )
