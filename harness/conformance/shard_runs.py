"""Conformance in shards: each machine runs its share of the tests; the merge judges the whole.

``--shard K/N`` keeps shard K's share of the collected tests
(``harness.core.shards``: weighted by what each test cost in a measured run,
the same share on every machine, since every machine collects the same tests).
Under the derandomized ``ci`` profile each test draws the same examples in
any process, so the shards together run exactly the unsharded run's
examples. A shard judges no coverage promise (it saw part of the tests);
it writes its state (every test's verdict payload and the tallies an xdist
worker would send) into its coverage file, and ``merged_session`` rebuilds,
from all N, the session an unsharded run ends with: the verdict table,
failure entries in collection order, coverage totals and their promises.
An interpreted backend's budget is parted among the shards as among workers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from harness.conformance.options import ConformanceOptions
from harness.conformance.session import ConformanceSession
from harness.conformance.tally_json import (
    cost_from_json,
    cost_to_json,
    coverage_from_json,
    coverage_to_json,
    evidence_from_json,
    evidence_to_json,
)
from harness.conformance.workers import TestVerdict
from harness.core.shards import Shard, check_complete

STATE_VERSION = 1
TEST_SECONDS = {
    "test_each_rank_keeps_to_its_pages": 44.2,
    "test_pairwise_steps_match_oracle": 9.4,
    "test_stateful_steps": 8.5,
    "test_every_rank_matches_oracle": 7.0,
    "test_ranks_together_equal_each_alone": 6.7,
    "test_stale_block_table_entries_ignored": 6.6,
    "test_physical_page_order_is_irrelevant": 5.4,
    "test_per_rank_and_shared_layouts_agree": 5.0,
    "test_bind_rejects_caches_without_the_ranks_pages": 4.7,
    "test_second_run_is_bit_identical": 4.1,
    "test_only_mapped_slots_change": 3.8,
    "test_out_buffer_is_the_result": 2.2,
    "test_production_shapes_match_oracle": 1.8,
    "test_foreign_pages_rejected": 1.5,
    "test_instances_interleaved_match_oracle": 1.4,
}
"""What one test (each parametrization) cost under the ``ci`` profile: ``sdpa`` on an AMD EPYC
Zen 4, one process. Only the proportions matter: backends differ in speed, rarely in which
tests are long. A test not named costs ``OTHER_TEST_SECONDS``."""
OTHER_TEST_SECONDS = 0.5
OPTION_FIELDS = ("profile", "device", "time_limit", "examples", "interpreted_budget", "max_shrinks")
"""The options every shard of one run must share (their examples depend on them)."""


def collection_digest(nodeids: Sequence[str]) -> dict[str, Any]:
    """What the whole collection was: every shard of one run collects the same tests."""
    digest = hashlib.sha256("\n".join(nodeids).encode()).hexdigest()
    return {"tests": len(nodeids), "sha256": digest}


def expected_seconds(name: str) -> float:
    return TEST_SECONDS.get(name, OTHER_TEST_SECONDS)


def start_shard(run: ConformanceSession, config: Any, writes_coverage: bool) -> str | None:
    """Note the run's test selection (every shard of a run makes the same); why this run
    cannot be a shard (a replay, or no file to leave for the merge), or ``None``."""
    run.selection = {
        "-k": config.getoption("keyword", "") or "",
        "-m": config.getoption("markexpr", "") or "",
    }
    if run.replay is not None:
        return "--replay reruns one example: it takes no --shard"
    if not writes_coverage:
        return (
            "--shard needs --junitxml (or --coverage-json): the shard's files are what "
            "attn-harness merge combines"
        )
    return None


def take_share(run: ConformanceSession, items: list[Any]) -> list[Any]:
    """Shard's items of the whole collection ``items`` (in their order); records positions
    and the collection's digest first, so both describe the unsharded run."""
    shard = run.options.shard
    assert shard is not None
    run.positions = {item.nodeid: i for i, item in enumerate(items)}
    run.collection = collection_digest([item.nodeid for item in items])
    weights = [expected_seconds(getattr(item, "originalname", item.name)) for item in items]
    return [items[i] for i in shard.select(weights)]


def shard_state(run: ConformanceSession) -> dict[str, Any]:
    """The shard's part of the run as plain JSON: the coverage file's ``shard`` entry."""
    from harness.conformance.run_coverage import large_pool_fits

    shard = run.options.shard
    assert shard is not None
    entries = run.selected_entries()
    return {
        "version": STATE_VERSION,
        "shard": shard.as_json(),
        "collection": run.collection,
        "options": {name: getattr(run.options, name) for name in OPTION_FIELDS},
        "specs": list(run.options.specs),
        "backends": [e.name for e in entries],
        "not_claiming": list(run.not_claiming),
        "large_pools": {e.name: large_pool_fits(run, e) for e in entries},
        "deselected": run.deselected,
        "selection": run.selection,
        "modules": {name: sorted(mods) for name, mods in run.modules.items()},
        "pool_note": run.pool_note,
        "verdicts": list(run.test_verdicts),
        "coverage": coverage_to_json(run.coverage),
        "evidence": evidence_to_json(run.evidence),
        "cost": cost_to_json(run.cost),
    }


class ShardMismatch(ValueError):
    """The files are not the shards of one run (or not all of them)."""


def _one_run(states: Sequence[dict[str, Any]], names: Sequence[str]) -> None:
    """Every state is a shard of the same run, each shard once."""
    for state, name in zip(states, names, strict=True):
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ShardMismatch(f"{name}: not a conformance shard of this harness version")
    shards = [Shard.from_json(s["shard"]) for s in states]
    try:
        check_complete(shards, "conformance shard")
    except ValueError as exc:
        given = ", ".join(f"{n} (shard {s})" for n, s in zip(names, shards, strict=True))
        raise ShardMismatch(f"{exc} (given: {given})") from None
    first = states[0]
    for state, name in zip(states[1:], names[1:], strict=True):
        for key, what in (
            ("collection", "collected tests"),
            ("options", "options"),
            ("selection", "test selections (-k, -m)"),
            ("backends", "backends"),
        ):
            if state.get(key) != first.get(key):
                raise ShardMismatch(
                    f"{name} and {names[0]} are shards of different runs: their {what} differ"
                    f" ({_difference(state.get(key), first.get(key))})"
                )
    positions = [v["position"] for s in states for v in s["verdicts"]]
    if len(positions) != len(set(positions)):
        raise ShardMismatch("two shards ran the same test: they were not split from one run")


def _difference(theirs: Any, first: Any) -> str:
    """What differs: the keys of two option records, else both values."""
    if isinstance(theirs, dict) and isinstance(first, dict):
        keys = sorted(k for k in {*theirs, *first} if theirs.get(k) != first.get(k))
        return "; ".join(f"{k} {theirs.get(k)!r} against {first.get(k)!r}" for k in keys)
    return f"{theirs!r} against {first!r}"


def merged_session(states: Sequence[dict[str, Any]], names: Sequence[str]) -> ConformanceSession:
    """The session an unsharded run of these shards ends with (``ShardMismatch`` if they
    are not every shard of one run). The backends are loaded by their specs, so the
    promises are judged; each shard's machine said whether it could hold the large pool."""
    from harness.conformance.cost_budget import CostLedger
    from harness.conformance.workers import WorkerTallies, add_tallies
    from harness.core.registry import default_registry

    _one_run(states, names)
    first = states[0]
    options = ConformanceOptions(**first["options"], specs=tuple(first["specs"]), cli=True)
    run = ConformanceSession(options)
    registry = default_registry()
    try:
        if first["specs"]:
            run.entries = [registry.resolve(spec) for spec in first["specs"]]
        else:
            run.entries = [registry.resolve(name) for name in first["backends"]]
    except Exception as exc:
        raise ShardMismatch(
            f"the merge loads each backend to know what the profile promises it: {exc}"
        ) from None
    run.not_claiming = list(first["not_claiming"])
    run.large_pools = {name: bool(fits) for name, fits in first["large_pools"].items()}
    run.pool_note = next((s["pool_note"] for s in states if s["pool_note"]), None)
    payloads = sorted((v for s in states for v in s["verdicts"]), key=lambda v: v["position"])
    for payload in payloads:
        run.record_verdict(TestVerdict.from_payload(payload))
    for state in states:
        for name, modules in state["modules"].items():
            run.modules.setdefault(name, set()).update(modules)
        cost = cost_from_json(state["cost"])
        if cost is not None and run.cost is None:  # the budget of the whole run
            run.cost = CostLedger(sum(s["cost"]["budget_s"] for s in states if s["cost"]))
        add_tallies(
            run,
            WorkerTallies(
                coverage_from_json(state["coverage"]),
                evidence_from_json(state["evidence"]),
                cost,
                bool(state["deselected"]),
            ),
        )
    return run
