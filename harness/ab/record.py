"""A finished comparison as the results document (``harness.results.pairs``)."""

from __future__ import annotations

import datetime
import math
from dataclasses import asdict
from typing import Any

from harness.ab.rounds import PairConfig, PairedCase
from harness.ab.sides import SideSpec
from harness.results.pairs import PairRecord


def case_json(case: PairedCase) -> dict[str, Any]:
    """One case's entry: statuses, verdict, the evidence, every round's samples."""
    evidence = case.evidence
    entry: dict[str, Any] = {
        "key": case.key,
        "workload": case.workload.name,
        "workload_version": case.workload.version,
        "case": case.spec.name,
        "spec": case.spec.to_json(),
        "verdict": case.verdict,
        "detail": case.detail,
        "base_status": case.base_status,
        "candidate_status": case.candidate_status,
        "errors": case.errors,
        "rounds": [r.to_json() for r in case.rounds],
    }
    if evidence is not None and evidence.rounds:
        low, high = evidence.interval()
        entry["evidence"] = {
            "rounds": evidence.rounds,
            "ratio": evidence.ratio,
            "low": low,
            "high": high if math.isfinite(high) else None,
            "sigma": evidence.sigma if math.isfinite(evidence.sigma) else None,
            "slower_llr": evidence.slower_llr,
            "faster_llr": evidence.faster_llr,
        }
    return entry


def make_record(
    *,
    cases: list[PairedCase],
    config: PairConfig,
    sides: dict[str, tuple[SideSpec, dict[str, Any]]],
    environment: dict[str, Any],
    timing: dict[str, Any],
    tool: dict[str, Any],
    wall_s: float,
    partial: bool = False,
    notes: list[str] | None = None,
) -> PairRecord:
    """The document of a finished (or cut short: ``partial``) comparison."""
    side_json = {label: {**spec.to_json(), **extra} for label, (spec, extra) in sides.items()}
    return PairRecord(
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        tool=tool,
        environment=environment,
        plan=asdict(config.plan),
        timing={
            **timing,
            "samples": config.samples,
            "warmup": config.warmup,
            "cold_cache": config.cold_cache,
        },
        base=side_json["base"],
        candidate=side_json["candidate"],
        cases=[case_json(c) for c in cases],
        wall_s=wall_s,
        partial=partial,
        notes=list(notes or []),
    )
