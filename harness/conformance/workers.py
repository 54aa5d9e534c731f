"""Conformance on every core: the suite's tests spread over pytest-xdist worker processes.

``attn-harness conform --workers N`` runs the suite under pytest-xdist
(``-n N --dist worksteal``). Each worker collects the whole suite, runs its
share of the tests with its own ``ConformanceSession``, and the controller
(the process the user started) prints the one header, live line and verdict.
What the user sees must not depend on N, so the controller's session is
filled from two channels:

- **each test's report** carries the test's verdict payload (backend,
  property, outcome, its failure entry, its position in the collection):
  a verdict reaches the controller as soon as the test ends, and a test
  whose worker crashed is still counted;
- **each worker's tallies** (coverage, the triage's evidence, an interpreted
  backend's cost ledger) travel once, when the worker finishes, in xdist's
  ``workeroutput``, and are added to the controller's.

Failures are kept in collection order and backends in their selected order,
so the table, the failure entries and the coverage file read the same with
one worker or sixteen. A replay runs in one process (``--replay`` forces
one worker). Under the derandomized ``ci`` profile every test draws the same
examples in any process, so verdicts and coverage totals do not change with
N; an interpreted backend's examples are chosen by their measured cost
(``cost_budget``) in every run, so each worker gets ``1/N`` of the budget
and of the tests it is parted among.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

REPORT_ATTRIBUTE = "attn_harness"
"""The attribute of a test report holding its verdict payload (xdist serialises it)."""
WORKEROUTPUT_KEY = "attn_harness_tallies"
"""The key of a worker's tallies in xdist's ``workeroutput``."""


LONGEST_FIRST = (
    "test_each_rank_keeps_to_its_pages",
    "test_pairwise_steps_match_oracle",
    "test_production_shapes_match_oracle",
)
"""Tests that take longest for most backends (every rank stepped, a few dozen production
steps): they start first, so the workers do not end waiting on one of them."""


def longest_first(names: list[str]) -> list[int]:
    """The order to run tests named ``names`` in: ``LONGEST_FIRST`` ones first, else as given.

    Which examples a test draws does not depend on the order (the ``ci``
    profile derandomizes each test by its own name); only the wall time does,
    since no worker can split one test.
    """
    return sorted(range(len(names)), key=lambda i: (names[i] not in LONGEST_FIRST, i))


def xdist_available() -> bool:
    try:
        import xdist  # noqa: F401
    except ImportError:
        return False
    return True


def xdist_arguments(workers: int) -> list[str]:
    """pytest arguments that spread the run over ``workers`` processes (none for one).

    ``-p xdist`` loads the plugin by its entry-point name, which works with
    plugin autoloading off (the isolated run) and is a no-op when it is on.
    ``worksteal`` hands an idle worker half of a busy one's queue, which
    suits tests whose costs differ a hundredfold.
    """
    if workers <= 1:
        return []
    return ["-p", "xdist", "-n", str(workers), "--dist", "worksteal"]


def is_worker(config: Any) -> bool:
    """Whether this pytest process is an xdist worker."""
    return hasattr(config, "workerinput")


def is_controller(config: Any) -> bool:
    """Whether this pytest process hands tests to xdist workers (and runs none itself)."""
    distributing = getattr(config.option, "dist", "no") != "no"
    return distributing and bool(getattr(config.option, "numprocesses", None))


def worker_count(config: Any) -> int:
    """How many workers share the run, as a worker sees it (1 outside xdist)."""
    workerinput = getattr(config, "workerinput", None)
    return int(workerinput.get("workercount", 1)) if workerinput else 1


# -- one test's verdict, carried by its report ---------------------------------------------


@dataclass(frozen=True)
class TestVerdict:
    """What the controller records of one finished conformance test."""

    backend: str
    module: str | None
    function: str
    outcome: str
    position: int  # the test's index in the collection (the same in every worker)
    examples: int  # examples it held (the live line's count)
    failure: dict[str, str] | None = None  # ``report.Failure`` as a dict

    def as_payload(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> TestVerdict:
        return cls(**payload)


def verdict_of(report: Any) -> TestVerdict | None:
    """The verdict a test's report carries (``None``: not a counted conformance report)."""
    payload = getattr(report, REPORT_ATTRIBUTE, None)
    return TestVerdict.from_payload(payload) if isinstance(payload, dict) else None


def backend_in_nodeid(nodeid: str, backends: Iterable[str]) -> str | None:
    """The backend a test id names in its parameters (``test_x[triton-...]``)."""
    params = nodeid.rpartition("[")[2]
    for name in sorted(backends, key=len, reverse=True):  # "triton" inside "sglang-triton"
        if params == f"{name}]" or params.startswith(f"{name}-"):
            return name
    return None


# -- what a worker tallied over its tests, sent once at its end -----------------------------


@dataclass
class WorkerTallies:
    coverage: Any  # claim_coverage.CoverageLog or None
    evidence: Any  # triage_evidence.TriageLog or None
    cost: Any  # cost_budget.CostLedger or None
    deselected: bool
    collection: dict[str, Any] | None = None  # a shard's worker: the whole collection's digest


def pack_tallies(session: Any) -> bytes:
    """The worker's tallies as bytes for ``workeroutput`` (both ends run this code)."""
    tallies = WorkerTallies(
        session.coverage, session.evidence, session.cost, session.deselected, session.collection
    )
    return pickle.dumps(tallies)


def unpack_tallies(data: bytes) -> WorkerTallies:
    tallies = pickle.loads(data)  # written by this run's own workers: trusted
    if not isinstance(tallies, WorkerTallies):
        raise TypeError(f"a worker sent {type(tallies).__name__}, not its tallies")
    return tallies


def in_order(by_backend: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """``by_backend`` with its keys in the order of ``names`` (the selected backends)."""

    def position(name: str) -> int:
        return names.index(name) if name in names else len(names)

    return {name: by_backend[name] for name in sorted(by_backend, key=position)}


def add_tallies(session: Any, tallies: WorkerTallies) -> None:
    """A worker's coverage, triage evidence and cost ledger, added to the controller's
    ``session`` (whose ledger holds the whole budget: each worker had ``1/N`` of it)."""
    if tallies.coverage is not None:
        session.coverage_log().merge(tallies.coverage)
        names = [e.name for e in session.selected_entries()]
        session.coverage.backends = in_order(session.coverage.backends, names)
    if tallies.evidence is not None:
        session.triage_log().merge(tallies.evidence)
    if tallies.cost is not None:
        if session.cost is None:
            from harness.conformance.cost_budget import CostLedger

            session.cost = CostLedger(tallies.cost.budget_s * session.workers)
        session.cost.merge(tallies.cost)
    session.deselected = session.deselected or tallies.deselected
    session.collection = session.collection or tallies.collection
