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

ENGINE_PEERS = ("vllm-cpu", "vllm-cpu-mla")
"""Registered backends that are an engine's production kernel (MHA, then MLA); the first one a
run includes that passed a case is that case's engine peer."""


def engines_in(records: Sequence[CaseRecord]) -> list[str]:
    """The run's engine peers: those of ``ENGINE_PEERS`` among its backends, in that order."""
    names = {r.backend for r in records if r.role == "backend"}
    return [e for e in ENGINE_PEERS if e in names]


def engine_in(records: Sequence[CaseRecord]) -> str | None:
    """The run's engine peer: the first of ``ENGINE_PEERS`` among its backends."""
    return next(iter(engines_in(records)), None)


def add_engine_ratios(records: Sequence[CaseRecord]) -> None:
    """Each timed backend record's ``ratio_to_engine`` (and its interval) against its case's
    engine peer (an MHA case's ``vllm-cpu``, an MLA case's ``vllm-cpu-mla``); ``None``
    where no engine passed that case."""
    timed: dict[tuple[str, int, str], CaseRecord] = {}
    for name in reversed(ENGINE_PEERS):  # the first in ENGINE_PEERS wins a case
        timed |= {
            (r.workload, r.workload_version, r.case): r
            for r in records
            if r.backend == name and r.valid  # valid: passed and timed
        }
    run_engine = engine_in(records)
    for record in records:
        if record.role != "backend" or record.backend in ENGINE_PEERS or record.metrics is None:
            continue
        assert record.forward is not None  # metrics come from a forward timing
        theirs = timed.get((record.workload, record.workload_version, record.case))
        engine = theirs.backend if theirs is not None else run_engine
        ratio = ratio_ci = None
        if theirs is not None:
            ours, engine_time = record.forward, theirs.forward
            assert engine_time is not None
            ratio = ours.summary().median / engine_time.summary().median
            ratio_ci = list(bootstrap_ratio_ci(ours.samples_ns, engine_time.samples_ns))
        record.metrics.update(
            engine_peer=engine, ratio_to_engine=ratio, ratio_to_engine_ci=ratio_ci
        )
