"""One conformance run's options and what it has seen so far: the pytest plugin's state.

The plugin (``attn_harness_pytest``) builds one :class:`ConformanceSession`
per pytest run from that run's command line and keeps it in the run's
``config.stash``; nothing is held at module level, so two runs in one
process (``pytester``, ``attn-harness conform`` called in-process) each see
their own options. This module is the plugin's implementation: which
backends run, how each is sized, what coverage each reached, and the lines
the run ends with. It raises ``ValueError`` for bad options; the plugin turns
those into pytest usage errors.
"""

from __future__ import annotations

import math
import shlex
import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.conformance.options import ConformanceOptions, parse_replay


@dataclass
class ConformanceSession:
    """One run: its options, the backends it checks, the coverage and verdicts so far."""

    options: ConformanceOptions
    entries: list[Any] | None = None  # resolved lazily (registering backends imports torch)
    not_claiming: list[str] = field(default_factory=list)
    coverage: Any = None  # CoverageLog, made at the first example counted
    evidence: Any = None  # triage.TriageLog: every labelled example, held or failed
    cost: Any = None  # cost_budget.CostLedger of the interpreted backends, made when first asked
    tests_per_backend: dict[str, int] = field(default_factory=dict)  # counted at collection
    shrink_limit: float | None = None  # set for a run with an interpreted backend, unless asked
    verdicts: Any = None  # report.Verdicts
    reporter: Any = None  # the compact reporter, when the run uses it
    current_test: str | None = None  # the conformance test running now (coverage counts it)
    current_case: str = ""  # its parametrization, without the backend (the triage's ``case``)
    modules: dict[str, set[str]] = field(default_factory=dict)  # backend -> modules run
    deselected: bool = False
    replay: tuple[str, str | None, bytes | None] | None = None
    replay_held: bool = False  # the replayed example ran and passed: the fix held
    workers: int = 1  # processes sharing the run (an xdist worker's share of a budget: 1/N)
    positions: dict[str, int] = field(default_factory=dict)  # test id -> collection index
    examples_in_test: int = 0  # examples the running test has held (its report carries it)
    pool_note: str | None = None  # why hypothesis's constant pool could not be fixed
    collection: dict[str, Any] | None = None  # a shard's: the whole collection's digest
    selection: dict[str, str] = field(default_factory=dict)  # pytest's -k and -m, as given
    test_verdicts: list[dict[str, Any]] = field(default_factory=list)  # a shard's, to merge
    large_pools: dict[str, bool] | None = None  # merged shards: their machines' large-pool fit
    _profiles: dict[bool, Any] = field(default_factory=dict)
    _groups: tuple[int, list[Any]] | None = None  # (failures grouped, their groups)

    def __post_init__(self) -> None:
        from harness.conformance.report import Verdicts

        self.replay = parse_replay(self.options.replay)
        if self.verdicts is None:
            self.verdicts = Verdicts()

    # -- which backends, on which device, sized how -------------------------------------

    @property
    def device(self) -> str:
        return self.options.device

    def resolve_backends(self) -> None:
        """Load every ``--backend`` now, so a bad spec is an error before collection."""
        from harness.core.errors import BackendLoadError
        from harness.core.registry import default_registry

        entries = []
        for spec in self.options.specs:
            try:
                entries.append(default_registry().resolve(spec))
            except (BackendLoadError, KeyError) as exc:
                message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
                raise ValueError(f"--backend {spec}: {message}") from exc
            why = entries[-1].unavailable_on(self.device)
            if why:
                raise ValueError(f"--backend {spec}: unavailable here: {why}")
        self.entries = entries if self.options.specs else None

    def selected_entries(self) -> list[Any]:
        """The ``--backend`` entries; without one, every registered backend on the device.

        A registered backend that claims no such device here (a built-in whose
        optional package is not installed) is left out of a default run and
        named in the header, rather than failing it for checking nothing; asked
        for by name, it is a usage error saying why (``resolve_backends``).
        """
        if self.entries is None:
            from harness.core.registry import default_registry, split_by_device

            claiming, others = split_by_device(default_registry().entries(), self.device)
            self.entries = claiming
            self.not_claiming = [e.name for e in others]
        return list(self.entries)

    def profile(self) -> Any:
        """The ``harness.conformance.profiles.Profile`` chosen, with the run's overrides."""
        from harness.conformance.profiles import get_profile

        profile = get_profile(self.options.profile)
        if self.options.time_limit is not None:
            profile = replace(profile, example_time_limit_s=self.options.time_limit)
        if self.options.examples is not None:
            profile = profile.with_examples(self.options.examples)
        if self.options.interpreted_budget is not None:
            profile = replace(profile, interpreted_budget_s=self.options.interpreted_budget)
        if self.options.max_shrinks is not None:
            profile = profile.shrinking()
        return profile

    def default_examples(self) -> int:
        """Examples per property test of the chosen profile, before ``--examples``."""
        from harness.conformance.profiles import get_profile

        return int(get_profile(self.options.profile).settings.max_examples)

    def interpreted_here(self, entry: Any) -> bool:
        """Whether ``entry`` runs interpreted on the chosen device (it says so in its claim)."""
        return self.device in entry.capabilities.interpreted_devices

    def profile_for(self, entry: Any) -> Any:
        """The profile that sizes ``entry``'s draws: lighter where it runs interpreted."""
        interpreted = self.interpreted_here(entry)
        if interpreted not in self._profiles:
            profile = self.profile()
            self._profiles[interpreted] = profile.interpreted() if interpreted else profile
        return self._profiles[interpreted]

    def runs_interpreted(self) -> bool:
        """Whether a selected backend runs interpreted on the chosen device."""
        return any(self.interpreted_here(entry) for entry in self.selected_entries())

    def cost_ledger(self, entry: Any) -> Any:
        """The run's ``cost_budget.CostLedger`` where ``entry`` runs interpreted, else ``None``."""
        if not self.interpreted_here(entry):
            return None
        if self.cost is None:
            from harness.conformance.cost_budget import CostLedger

            shards = self.options.shard.count if self.options.shard is not None else 1
            budget = self.profile_for(entry).cost_budget_s / (self.workers * shards)
            tests = {b: math.ceil(n / self.workers) for b, n in self.tests_per_backend.items()}
            self.cost = CostLedger(budget, tests=tests)
        return self.cost

    def current_item(self) -> str:
        """The running test's shown name, its parameters included (a budget is per item)."""
        test = self.current_test or ""
        return f"{test}[{self.current_case}]" if self.current_case else test

    def not_checked_counts(self) -> dict[str, Counter[str]]:
        """Per backend, per test function: examples the cost budget left unchecked."""
        counts: dict[str, Counter[str]] = {}
        for skipped in self.cost.skipped if self.cost is not None else []:
            function = skipped.test.partition("[")[0]
            counts.setdefault(skipped.backend, Counter())[function] += 1
        return counts

    def unchecked_here(self, backend: str) -> list[Any]:
        """The running test's examples that the cost budget left unchecked."""
        item = self.current_item()
        return [n for n in self.cost.not_checked(backend) if n.test == item] if self.cost else []

    def nothing_affordable(self, backend: str) -> str | None:
        """Why the running test checked nothing, when the cost budget refused its every example."""
        item, left = self.current_item(), self.unchecked_here(backend)
        if not left or self.cost.checked_in(backend, item):
            return None
        cheapest = min(n.seconds for n in left)
        return (
            f"Skipped: not checked: none of its {len(left)} example(s) fit the interpreted "
            f"budget (its part: {self.cost.allowance(backend, item):.1f} s; the cheapest "
            f"about {cheapest:.0f} s)"
        )

    # -- what ran ----------------------------------------------------------------------

    def coverage_log(self) -> Any:
        """The run's ``harness.conformance.claim_coverage.CoverageLog``."""
        if self.coverage is None:
            from harness.conformance.claim_coverage import CoverageLog

            self.coverage = CoverageLog()
        return self.coverage

    def record_examples(self, backend: str, scenarios: list[Any], *, example: bool) -> None:
        if self.current_test is None:
            return  # outside a conformance test (the harness's unit tests call the checks)
        self.coverage_log().record(backend, self.current_test, scenarios, example=example)
        if example:
            self.examples_in_test += 1
            self.triage_log().held(backend, self.current_test, scenarios, self._case())
        if example and self.reporter is not None:
            self.reporter.example_held()

    def record_failed_example(self, backend: str, scenarios: list[Any]) -> None:
        """One example of the running test that failed: evidence for the triage."""
        if self.current_test is not None:
            self.triage_log().failed(backend, self.current_test, scenarios, self._case())

    def _case(self) -> dict[str, str] | None:
        return {"case": self.current_case} if self.current_case else None

    def triage_log(self) -> Any:
        """The run's ``harness.conformance.triage.TriageLog``."""
        if self.evidence is None:
            from harness.conformance.triage import TriageLog

            self.evidence = TriageLog()
        return self.evidence

    def record_run(self, backend: str, run: Any) -> None:
        if self.current_test is None:
            return
        self.coverage_log().record_stateful(backend, self.current_test, run)
        self.examples_in_test += 1
        if self.reporter is not None:
            self.reporter.example_held()

    def record_outcome(self, backend: str, module: str | None, test: str, outcome: str) -> None:
        if module is not None:
            self.modules.setdefault(backend, set()).add(module)
        if backend not in self.verdicts.outcomes:  # columns in the selected order, as they come
            from harness.conformance.workers import in_order

            self.verdicts.outcomes[backend] = {}
            names = [e.name for e in self.selected_entries()]
            self.verdicts.outcomes = in_order(self.verdicts.outcomes, names)
        self.verdicts.record(backend, test, outcome)

    def record_verdict(self, verdict: Any) -> None:
        """One finished test (``workers.TestVerdict``, from its report): its outcome, and
        its failure entry kept in collection order whichever process ran it."""
        from harness.conformance.report import FailureEntry

        self.record_outcome(verdict.backend, verdict.module, verdict.function, verdict.outcome)
        if self.options.shard is not None:
            self.test_verdicts.append(verdict.as_payload())
        if verdict.failure is not None:
            self.verdicts.add_failure(FailureEntry(**verdict.failure), verdict.position)

    def replay_blob(self) -> tuple[str, bytes] | None:
        """``(hypothesis version, blob)`` of the example ``--replay`` asks for, if any."""
        if self.replay is None or self.replay[2] is None:
            return None
        return self.replay[1] or "", self.replay[2]

    def replay_command(self, backend: str, token: str) -> str:
        """The one command that reruns ``token``'s example, with the Python that ran this one."""
        profile, device = self.options.profile, self.device
        if self.options.cli:
            launcher = (
                ["attn-harness"]
                if Path(sys.argv[0]).name == "attn-harness"
                else [sys.executable, "-m", "harness"]
            )
            args = [*launcher, "conform", "--backend", backend, "--profile", profile]
            args += [] if device == "cpu" else ["--device", device]
        else:
            args = [sys.executable, "-m", "pytest", "--pyargs", "suites.conformance"]
            args += ["-p", "attn_harness_pytest", "--backend", backend]
            args += ["--conformance-profile", profile]
            args += [] if device == "cpu" else ["--conformance-device", device]
        return shlex.join([*args, "--replay", token])

    def failure_groups(self) -> list[Any]:
        """The run's failures grouped by what explains them (``triage.group_failures``).

        Asked for by the verdict lines, the JUnit properties and the coverage
        file at the end of a run; grouped once per set of failures.
        """
        from harness.conformance.triage import group_failures

        seen = len(self.verdicts.failures)
        if self._groups is not None and self._groups[0] == seen:
            return self._groups[1]
        backends: dict[str, list[Any]] = {}
        for failure in self.verdicts.failures:
            backends.setdefault(failure.backend, []).append(failure)
        groups = [
            group
            for backend, failures in backends.items()
            for group in group_failures(backend, failures, self.triage_log())
        ]
        self._groups = (seen, groups)
        return groups

    def triage_lines(self) -> list[str]:
        """One line per group of failures: ``BACKEND: CAUSE`` (JUnit properties, logs)."""
        from harness.conformance.triage import cause_line

        return [f"{g.failures[0].backend}: {cause_line(g)}" for g in self.failure_groups()]
