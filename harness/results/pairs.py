"""The paired-comparison document: every round's raw samples, the plan, the verdicts.

Written by ``attn-harness ab --out FILE`` (atomically) and read by
``report`` (the paired-ratio figure) and ``load_pair``. Its ``schema``
field tells it from a benchmark run's results file. Each round keeps both
sides' raw samples and which side went first, so a reader recomputes every
per-round ratio (``round_log_ratio``) instead of trusting a summary.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.core.atomic_file import write_atomically

PAIR_SCHEMA = "attn-harness-ab/1"
PLAN_FIELDS = frozenset({"threshold", "alpha", "beta", "min_rounds", "max_rounds", "sigma_floor"})


class PairRecordError(ValueError):
    """A file is not a readable paired-comparison document; the message says why."""


@dataclass
class PairRecord:
    """One paired comparison, as written to and read from its file."""

    created: str
    tool: dict[str, Any]
    environment: dict[str, Any]
    plan: dict[str, Any]
    timing: dict[str, Any]
    base: dict[str, Any]
    candidate: dict[str, Any]
    cases: list[dict[str, Any]]
    wall_s: float = 0.0
    partial: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def threshold(self) -> float:
        return float(self.plan["threshold"])

    def to_json(self) -> dict[str, Any]:
        return {"schema": PAIR_SCHEMA, **asdict(self)}


def round_log_ratio(base_ns: Sequence[int], candidate_ns: Sequence[int]) -> float:
    """One round's unit: ``log(median candidate / median base)``."""
    return math.log(statistics.median(candidate_ns) / statistics.median(base_ns))


def rounds_log_ratios(entry: dict[str, Any]) -> list[float]:
    """A case entry's per-round log-ratios, recomputed from its raw samples."""
    return [round_log_ratio(r["base_ns"], r["candidate_ns"]) for r in entry.get("rounds", [])]


def save_pair(record: PairRecord, path: str | os.PathLike[str]) -> Path:
    return write_atomically(path, json.dumps(record.to_json(), indent=1) + "\n")


def is_pair_document(document: object) -> bool:
    return isinstance(document, dict) and document.get("schema") == PAIR_SCHEMA


def pair_from_json(document: object, origin: str = "the document") -> PairRecord:
    if not is_pair_document(document):
        raise PairRecordError(f"{origin} is not a paired comparison (schema {PAIR_SCHEMA!r})")
    assert isinstance(document, dict)
    fields = {k: v for k, v in document.items() if k != "schema"}
    try:
        record = PairRecord(**fields)
    except TypeError as exc:
        raise PairRecordError(f"{origin}: {exc}") from exc
    if not isinstance(record.plan, dict) or not set(record.plan) >= PLAN_FIELDS:
        raise PairRecordError(f"{origin}: its plan lacks {sorted(PLAN_FIELDS)}")
    for entry in record.cases:
        for part in ("key", "verdict", "rounds"):
            if part not in entry:
                raise PairRecordError(f"{origin}: a case has no {part!r}")
    return record


def load_pair(path: str | os.PathLike[str]) -> PairRecord:
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PairRecordError(f"{path}: {exc}") from exc
    return pair_from_json(document, str(path))
