"""A conformance run's tallies as plain JSON, and back: what a shard hands to the merge.

A shard ends in a file, not in a worker's pipe, and a file may come from
another machine and outlive the code that wrote it; so the tallies travel as
JSON of plain values (no pickle: loading a file must not run code), and the
merge rebuilds exactly the objects an xdist controller adds up. Only what
adding up needs is kept: counts, labels, spent seconds, examples left
unchecked.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from harness.conformance.claim_coverage import BackendCoverage, CoverageLog, StatefulRun
from harness.conformance.cost_budget import CostLedger, NotChecked
from harness.conformance.triage_evidence import TestEvidence, TriageLog


def coverage_to_json(log: CoverageLog | None) -> dict[str, Any] | None:
    if log is None:
        return None
    return {
        name: {
            "examples": dict(cover.examples),
            "by_test": {
                test: {dim: dict(counts) for dim, counts in dims.items()}
                for test, dims in cover.by_test.items()
            },
            "stateful": [
                {"steps": run.steps, "reached": sorted(run.reached), "skipped": dict(run.skipped)}
                for run in cover.stateful
            ],
        }
        for name, cover in log.backends.items()
    }


def coverage_from_json(data: dict[str, Any] | None) -> CoverageLog | None:
    if data is None:
        return None
    log = CoverageLog()
    for name, cover in data.items():
        log.backends[name] = BackendCoverage(
            examples=Counter(cover["examples"]),
            by_test={
                test: {dim: Counter(counts) for dim, counts in dims.items()}
                for test, dims in cover["by_test"].items()
            },
            stateful=[
                StatefulRun(run["steps"], set(run["reached"]), Counter(run["skipped"]))
                for run in cover["stateful"]
            ],
        )
    return log


def _key_to_json(key: Any) -> list[Any]:
    return [[dimension, sorted(labels)] for dimension, labels in key]


def _key_from_json(data: list[Any]) -> tuple[tuple[str, frozenset[str]], ...]:
    return tuple((dimension, frozenset(labels)) for dimension, labels in data)


def evidence_to_json(log: TriageLog | None) -> dict[str, Any] | None:
    if log is None:
        return None
    return {
        backend: {
            test: {
                "held": [[_key_to_json(k), n] for k, n in evidence.held.items()],
                "failed": [[_key_to_json(k), n] for k, n in evidence.failed.items()],
            }
            for test, evidence in tests.items()
        }
        for backend, tests in log.backends.items()
    }


def evidence_from_json(data: dict[str, Any] | None) -> TriageLog | None:
    if data is None:
        return None
    log = TriageLog()
    for backend, tests in data.items():
        for test, evidence in tests.items():
            log.backends.setdefault(backend, {})[test] = TestEvidence(
                held=Counter({_key_from_json(k): n for k, n in evidence["held"]}),
                failed=Counter({_key_from_json(k): n for k, n in evidence["failed"]}),
            )
    return log


def cost_to_json(ledger: CostLedger | None) -> dict[str, Any] | None:
    if ledger is None:
        return None
    return {
        "budget_s": ledger.budget_s,
        "spent": [[b, t, s] for (b, t), s in ledger.spent.items()],
        "checked": [[b, t, n] for (b, t), n in ledger.checked.items()],
        "skipped": [
            [n.backend, n.test, n.seconds, n.timed_out, n.scenario, n.kind] for n in ledger.skipped
        ],
        "failing": sorted([b, t] for b, t in ledger.failing),
    }


def cost_from_json(data: dict[str, Any] | None) -> CostLedger | None:
    if data is None:
        return None
    return CostLedger(
        float(data["budget_s"]),
        spent={(b, t): float(s) for b, t, s in data["spent"]},
        checked={(b, t): int(n) for b, t, n in data["checked"]},
        skipped=[NotChecked(*row) for row in data["skipped"]],
        failing={(b, t) for b, t in data["failing"]},
    )
