"""A run's records judged once every case is timed: metrics, ratios, flags, verdicts.

``case_metrics`` derives one record's rates, roofline fractions and ratio to its
peer from its forward samples; ``finish_run`` judges every record of the run against
the run's final ceilings: a time that cannot be the work fails
(``ceiling_evidence.impossible``), a rate above a ceiling is flagged and the ceiling
contradicted (``ceiling_evidence``), a timing that is not a result is flagged
unreliable (``harness.results.reliability``), and the engine peer's ratios are added.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.bench.ceiling_evidence import (
    contradiction_flag,
    contradictions,
    impossible,
    withhold,
)
from harness.bench.ceilings import RunCeilings, spread_flags
from harness.bench.engine_peer import add_engine_ratios, engine_in
from harness.bench.metrics import MEASUREMENT_ERROR, rates, roofline
from harness.bench.workloads import CaseSpec
from harness.results.reliability import UNRELIABLE, unreliable
from harness.results.statistics import bootstrap_ratio_ci
from harness.results.store import FAILING_STATUSES, CaseRecord, RunRecord, TimingRecord


def case_metrics(
    spec: CaseSpec,
    forward: TimingRecord,
    ceilings: RunCeilings,
    peer: TimingRecord | None,
) -> tuple[dict[str, Any], list[str]]:
    """Rates, roofline fractions and the ratio to the peer, from the forward median."""
    work = spec.work()
    seconds = forward.summary().median * 1e-9
    achieved = rates(work, seconds)
    used = ceilings.used
    roof = roofline(
        work,
        seconds,
        bandwidth=None if used is None else used.memory_bandwidth,
        flops=None if used is None else used.flops_for(spec.dtype),
    )
    ratio = ratio_ci = None
    if peer is not None:
        ratio = forward.summary().median / peer.summary().median
        ratio_ci = list(bootstrap_ratio_ci(forward.samples_ns, peer.samples_ns))
    metrics: dict[str, Any] = {
        "tokens": work.num_tokens,
        "flops": work.flops,
        "bytes": work.bytes,
        "arithmetic_intensity": work.arithmetic_intensity,
        "median_s": seconds,
        "tokens_per_s": achieved.tokens_per_s,
        "tflops": achieved.tflops,
        "gbps": achieved.gbps,
        "bandwidth_fraction": roof.bandwidth_fraction,
        "compute_fraction": roof.compute_fraction,
        "roofline_fraction": roof.roofline_fraction,
        "bound": roof.bound,
        "ceiling_source": None if used is None else used.source,
        "ratio_to_peer": ratio,
        "ratio_to_peer_ci": ratio_ci,
    }
    if roof.withheld:
        metrics["withheld"] = list(roof.withheld)
    return metrics, list(roof.flags)


def noisy_against(record: CaseRecord, peer: CaseRecord | None) -> str | None:
    """Why ``record``'s timing (with its ratio to ``peer``) is not a result, or ``None``."""
    if not record.valid or record.forward is None:
        return None
    metrics = record.metrics or {}
    peer_samples = (
        peer.forward.samples_ns if peer is not None and peer.valid and peer.forward else None
    )
    return unreliable(
        record.forward.samples_ns,
        peer_samples,
        metrics.get("ratio_to_peer"),
        metrics.get("ratio_to_peer_ci"),
    )


def finish_run(
    records: Sequence[CaseRecord], ceilings: RunCeilings, flags: list[str], cache_bytes: int = 0
) -> None:
    """Every timed record's metrics and flags against the run's final ceilings.

    A record whose time cannot be its work (``ceiling_evidence.impossible``; the caches
    hold ``cache_bytes``) fails first, ``INCORRECT_TIMING``. Each record's own rate
    above a ceiling is flagged; a ceiling any record
    exceeded is contradicted for the run, so every fraction against it is
    withheld (``harness.bench.ceiling_evidence``). With an engine's kernel among the
    backends, every other backend gets its ratio to it (``harness.bench.engine_peer``).
    The run's flags (``flags``, extended) name the contradicted ceilings and a large
    spread between probe rounds.
    """
    for record in records:
        if record.valid and record.forward is not None:
            spec = CaseSpec.from_json(record.spec)
            seconds = record.forward.summary().median * 1e-9
            why = impossible(spec.work(), seconds, spec.dtype, ceilings.used, cache_bytes)
            if why is not None:
                record.status, record.error, record.metrics = "INCORRECT_TIMING", why, None
    peers = {r.id: r for r in records if r.role == "peer" and r.valid}
    for record in records:
        if not record.valid or record.forward is None:
            continue
        peer = peers.get(record.peer or "")
        record.metrics, own = case_metrics(
            CaseSpec.from_json(record.spec),
            record.forward,
            ceilings,
            None if peer is None else peer.forward,
        )
        why = noisy_against(record, peer)
        kept = [f for f in record.flags if not f.startswith((MEASUREMENT_ERROR, UNRELIABLE))]
        record.flags = kept + own + ([why] if why else [])
    if engine_in(records) is not None:
        add_engine_ratios(records)
    rounds = len(ceilings.probes) if ceilings.used is ceilings.measured else 0
    for found in withhold(records, contradictions(records, ceilings.used)):
        flags.append(contradiction_flag(found, rounds))
    flags.extend(spread_flags(ceilings.spread()))


def failed(record: RunRecord) -> bool:
    """A run fails when any case failed, or when nothing at all passed."""
    statuses = [c.status for c in record.cases]
    return any(s in FAILING_STATUSES for s in statuses) or "PASSED" not in statuses
