"""A run's plan: which cases it runs, in what order, with which backends; shard K/N's share.

``run_order`` lists every case of the workloads (a case: one workload's case
spec, in the run's dtype); ``serving`` names the backends a case times. With
``BenchConfig.shard`` a run takes only its share (``planned``): the cases are
dealt whole (the peer and every backend of a case stay in one shard, since a
backend's ratio to its in-run peer is what a report and the gate compare) by
``harness.core.shards``, weighed by ``case_cost``, an estimate computed from
the case's spec and the run's settings, never from a measured time: every
machine running a shard must deal the same hands. ``sweep_header`` is what a
shard's results file says of the whole sweep, so that
``harness.results.merge`` can prove the shards cover it once and belong
together.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from harness.bench.workloads import CaseSpec, Workload
from harness.core.registry import BackendEntry

if TYPE_CHECKING:  # the runner imports this module
    from harness.bench.runner import BenchConfig

Planned = tuple[int, Workload, CaseSpec]
"""A case of the plan: its place in workload order, its workload, its spec."""

ORACLE_FLOPS_PER_S = 1e10
"""About the float64 oracle's rate on the CPU, which checks every case (``case_cost``)."""
INPUT_BYTES_PER_S = 1e9
"""About the rate a case's inputs and paged cache are built and copied at."""


def in_dtype(spec: CaseSpec, dtype: str | None) -> CaseSpec:
    """``spec`` in ``dtype``; a case so changed carries the dtype in its name (``ctx=512
    [bfloat16]``), so its records never pair with the case's own in a gate or report."""
    if dtype is None or dtype == spec.dtype:
        return spec
    return replace(spec, dtype=dtype, name=f"{spec.name} [{dtype}]")


def run_order(workloads: Sequence[Workload], config: BenchConfig) -> list[Planned]:
    """Every case of ``workloads`` in ``config.dtype``, with its place in workload order,
    in the order they run: with ``config.interleave`` the workloads' cases are taken
    in turn, so a run cut short holds some of each (its record keeps workload order)."""
    size = config.workload_size
    columns: list[list[Planned]] = []
    place = 0
    for workload in workloads:
        specs = workload.cases(size)
        columns.append(
            [(place + i, workload, in_dtype(spec, config.dtype)) for i, spec in enumerate(specs)]
        )
        place += len(specs)
    if not config.interleave:
        return [case for column in columns for case in column]
    rows = itertools.zip_longest(*columns)
    return [case for row in rows for case in row if case is not None]


def serving(backends: Sequence[BackendEntry], workload: Workload) -> list[BackendEntry]:
    """The backends of the attention ``workload`` times (MHA or MLA): another kind's are
    not asked, not even to say UNSUPPORTED."""
    return [b for b in backends if b.capabilities.kind == workload.attention]


def case_key(workload: Workload, spec: CaseSpec) -> str:
    """``workload@version/case``: a case's records' id up to ``::backend``."""
    return f"{workload.key}/{spec.name}"


def case_cost(spec: CaseSpec, timed: int, budget_s: float) -> float:
    """Rough seconds a case takes on a nominal machine: ``timed`` timings (the peer's and
    each backend's) each spending up to the budget, the oracle's check of its FLOPs and
    the building of its inputs. Only the ratios matter (they deal the shards), and they
    grow with the case's work, so a long case is not dealt beside many others."""
    work = spec.work()
    return timed * budget_s + work.flops / ORACLE_FLOPS_PER_S + work.bytes / INPUT_BYTES_PER_S


def planned(
    backends: Sequence[BackendEntry], workloads: Sequence[Workload], config: BenchConfig
) -> list[Planned]:
    """``run_order``, or with ``config.shard`` only that shard's cases of it (in run order)."""
    plan = run_order(workloads, config)
    if config.shard is None:
        return plan
    budget = config.timing.budget_s
    weights = [case_cost(spec, 1 + len(serving(backends, w)), budget) for _, w, spec in plan]
    return [plan[i] for i in config.shard.select(weights)]


def sweep_header(
    backends: Sequence[BackendEntry], workloads: Sequence[Workload], config: BenchConfig
) -> dict[str, Any] | None:
    """The results file's ``shard``: this shard, and the whole sweep's cases (in the order a
    run without ``--shard`` writes them) and backends; ``None`` for a run that is not a
    shard. ``ValueError`` when two cases share a key (a workload named twice)."""
    if config.shard is None:
        return None
    ordered = sorted(run_order(workloads, config), key=lambda planned: planned[0])
    keys = [case_key(workload, spec) for _, workload, spec in ordered]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"a sharded sweep runs each case once; named twice: {', '.join(twice)}")
    return {**config.shard.as_json(), "cases": keys, "backends": [b.name for b in backends]}
