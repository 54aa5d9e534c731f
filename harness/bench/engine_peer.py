"""The engine peer: an engine's production kernel, timed on the same pages in the same run.

The contiguous SDPA peer says what paging costs; it does not say whether a
backend is as fast as what an engine ships. Where an engine's production
kernel is a registered backend (``ENGINE_PEERS``: vLLM's CPU attention) and a run
includes it, every other backend of a case it passed gets a second ratio:
its forward median over the engine's (``ratio_to_engine``, with a bootstrap
interval), beside ``ratio_to_peer``. The engine is checked against the
oracle and timed like any backend; a case it did not pass gives no ratio.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from harness.results.statistics import bootstrap_ratio_ci

if TYPE_CHECKING:
    from harness.results.store import CaseRecord

ENGINE_PEERS = ("vllm-cpu",)
"""Registered backends that are an engine's production kernel; the first one a run includes
is its engine peer."""


def engine_in(records: Sequence[CaseRecord]) -> str | None:
    """The run's engine peer: the first of ``ENGINE_PEERS`` among its backends."""
    names = {r.backend for r in records if r.role == "backend"}
    return next((e for e in ENGINE_PEERS if e in names), None)


def add_engine_ratios(records: Sequence[CaseRecord], engine: str) -> None:
    """Each timed backend record's ``ratio_to_engine`` (and its interval) against ``engine``
    on the same case; ``None`` where the engine did not pass that case."""
    timed = {
        (r.workload, r.workload_version, r.case): r
        for r in records
        if r.backend == engine and r.valid  # valid: passed and timed
    }
    for record in records:
        if record.role != "backend" or record.backend == engine or record.metrics is None:
            continue
        assert record.forward is not None  # metrics come from a forward timing
        theirs = timed.get((record.workload, record.workload_version, record.case))
        ratio = ratio_ci = None
        if theirs is not None:
            ours, engine_time = record.forward, theirs.forward
            assert engine_time is not None
            ratio = ours.summary().median / engine_time.summary().median
            ratio_ci = list(bootstrap_ratio_ci(ours.samples_ns, engine_time.samples_ns))
        record.metrics.update(
            engine_peer=engine, ratio_to_engine=ratio, ratio_to_engine_ci=ratio_ci
        )
