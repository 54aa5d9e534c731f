"""The versioned results file: typed records, atomic save, strict load.

``schema.json`` beside this module is the format; ``docs/results-schema.md``
explains each field.
``save_results`` serialises and validates in memory first,
then writes a temporary file in the target's folder and renames it over the
target, so a failure at any point leaves either the old file or none, never
a partial one. ``load_results`` rejects, with a ``ResultsError`` that says
what and where, anything that is not valid JSON, not this schema, or another
schema version.

Statistics stored beside raw samples are informational: ``TimingRecord``
recomputes them from ``samples_ns`` on load.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core.atomic_file import write_atomically
from harness.results.statistics import DEFAULT_CONFIDENCE, Summary

if TYPE_CHECKING:  # reading a results file (report, gate) needs no torch
    from harness.bench.timing import Measurement

SCHEMA_NAME = "attn-harness/results"
SCHEMA_VERSION = 1
STATUSES = (
    "PASSED",
    "INCORRECT_NUMERICAL",
    "INCORRECT_SHAPE",
    "INCORRECT_TIMING",
    "REJECTED_VALID",
    "RUNTIME_ERROR",
    "TIMEOUT",
    "UNSUPPORTED",
)
FAILING_STATUSES = frozenset(STATUSES) - {"PASSED", "UNSUPPORTED"}


class ResultsError(ValueError):
    """A results file cannot be read or written; the message says which and why."""


@dataclass
class TimingRecord:
    """Raw samples of one timed callable and how they were taken."""

    samples_ns: list[int]
    warmup_ns: list[int]
    clock: str
    threads: int
    stop_reason: str
    flush_bytes: int = 0
    confidence: float = DEFAULT_CONFIDENCE

    @classmethod
    def from_measurement(cls, m: Measurement) -> TimingRecord:
        return cls(
            samples_ns=list(m.samples_ns),
            warmup_ns=list(m.warmup_ns),
            clock=m.clock,
            threads=m.threads,
            stop_reason=m.stop_reason,
            flush_bytes=m.flush_bytes,
            confidence=m.confidence,
        )

    def summary(self) -> Summary:
        return Summary.of(self.samples_ns, confidence=self.confidence)

    def to_json(self) -> dict[str, Any]:
        s = self.summary()
        return {
            "samples_ns": list(self.samples_ns),
            "warmup_ns": list(self.warmup_ns),
            "clock": self.clock,
            "threads": self.threads,
            "stop_reason": self.stop_reason,
            "flush_bytes": self.flush_bytes,
            "confidence": self.confidence,
            "median_ns": s.median,
            "iqr_ns": s.iqr,
            "ci_low_ns": s.ci_low,
            "ci_high_ns": s.ci_high,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TimingRecord:
        return cls(
            samples_ns=[int(x) for x in data["samples_ns"]],
            warmup_ns=[int(x) for x in data["warmup_ns"]],
            clock=data["clock"],
            threads=data["threads"],
            stop_reason=data["stop_reason"],
            flush_bytes=data["flush_bytes"],
            confidence=data["confidence"],
        )


def _timing_or_none(data: dict[str, Any] | None) -> TimingRecord | None:
    return None if data is None else TimingRecord.from_json(data)


@dataclass
class CaseRecord:
    """One (workload case, backend) result; ``role="peer"`` for the contiguous SDPA peer."""

    id: str
    role: str
    backend: str
    workload: str
    workload_version: int
    case: str
    spec: dict[str, Any]
    status: str
    backend_class: str | None = None
    error: str | None = None
    oracle: dict[str, Any] | None = None
    forward: TimingRecord | None = None
    prepare: TimingRecord | None = None
    peer: str | None = None
    metrics: dict[str, Any] | None = None
    flags: list[str] = field(default_factory=list)
    source: dict[str, Any] | None = None
    sdpa_kernel: str | None = None  # the SDPA kernel pinned for its check and timing
    timed_checks: dict[str, Any] | None = None  # what was checked of its timed calls

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    @property
    def valid(self) -> bool:
        """A time that counts: the case passed the oracle check and was timed."""
        return self.status == "PASSED" and self.forward is not None

    def to_json(self) -> dict[str, Any]:
        data = {
            "id": self.id,
            "role": self.role,
            "backend": self.backend,
            "backend_class": self.backend_class,
            "workload": self.workload,
            "workload_version": self.workload_version,
            "case": self.case,
            "spec": self.spec,
            "status": self.status,
            "error": self.error,
            "oracle": self.oracle,
            "forward": None if self.forward is None else self.forward.to_json(),
            "prepare": None if self.prepare is None else self.prepare.to_json(),
            "peer": self.peer,
            "metrics": self.metrics,
            "flags": list(self.flags),
        }
        if self.source is not None:
            data["source"] = self.source
        if self.sdpa_kernel is not None:  # only where pinned: other files are unchanged
            data["sdpa_kernel"] = self.sdpa_kernel
        if self.timed_checks is not None:
            data["timed_checks"] = self.timed_checks
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaseRecord:
        return cls(
            id=data["id"],
            role=data["role"],
            backend=data["backend"],
            backend_class=data.get("backend_class"),
            workload=data["workload"],
            workload_version=data["workload_version"],
            case=data["case"],
            spec=data["spec"],
            status=data["status"],
            error=data["error"],
            oracle=data["oracle"],
            forward=_timing_or_none(data["forward"]),
            prepare=_timing_or_none(data["prepare"]),
            peer=data["peer"],
            metrics=data["metrics"],
            flags=list(data["flags"]),
            source=data.get("source"),
            sdpa_kernel=data.get("sdpa_kernel"),
            timed_checks=data.get("timed_checks"),
        )


@dataclass
class RunRecord:
    """One benchmark run: environment, ceilings, timing setup, workloads and cases."""

    created: str
    tool: dict[str, Any]
    environment: dict[str, Any]
    ceilings: dict[str, Any]
    timing: dict[str, Any]
    workloads: list[dict[str, Any]]
    cases: list[CaseRecord]
    source: dict[str, Any] | None = None
    partial: bool = False  # the run stopped (or has not yet reached) its last case
    flags: list[str] = field(default_factory=list)  # the run's own warnings (cases have theirs)
    shard: dict[str, Any] | None = None  # a shard's place in its sweep (``bench --shard``)
    merged_from: list[dict[str, Any]] | None = None  # each shard's header (``results.merge``)

    def case(self, case_id: str) -> CaseRecord:
        for record in self.cases:
            if record.id == case_id:
                return record
        raise KeyError(f"no case {case_id!r} in this run")

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "schema": SCHEMA_NAME,
            "schema_version": SCHEMA_VERSION,
            "created": self.created,
            "tool": self.tool,
            "environment": self.environment,
            "ceilings": self.ceilings,
            "timing": self.timing,
            "workloads": self.workloads,
            "cases": [c.to_json() for c in self.cases],
        }
        if self.source is not None:
            data["source"] = self.source
        if self.partial:  # only when true: a finished run's file is unchanged
            data["partial"] = True
        if self.flags:
            data["flags"] = list(self.flags)
        if self.shard is not None:  # like partial: absent from a whole run's file
            data["shard"] = self.shard
        if self.merged_from is not None:
            data["merged_from"] = self.merged_from
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        return cls(
            created=data["created"],
            tool=data["tool"],
            environment=data["environment"],
            ceilings=data["ceilings"],
            timing=data["timing"],
            workloads=list(data["workloads"]),
            cases=[CaseRecord.from_json(c) for c in data["cases"]],
            source=data.get("source"),
            partial=bool(data.get("partial", False)),
            flags=list(data.get("flags", [])),
            shard=data.get("shard"),
            merged_from=data.get("merged_from"),
        )


# -- serialisation -------------------------------------------------------------------


def _finite(value: Any) -> Any:
    """A copy with non-finite floats as ``None``: JSON has no NaN or infinity."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The JSON Schema shipped with the package."""
    text = resources.files("harness.results").joinpath("schema.json").read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _where(path: Any) -> str:
    parts = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
    return parts.lstrip(".") or "(top level)"


def validate_document(data: object, *, origin: str = "results") -> None:
    """Raise ``ResultsError`` unless ``data`` is a version-1 results document.

    The version is checked first, so an old or newer file gets that answer,
    not a list of field errors. The full check needs ``jsonschema``; where it
    is not installed (the GPU machine allows no installs) the typed parse in
    ``RunRecord.from_json`` still catches missing fields.
    """
    if not isinstance(data, dict):
        raise ResultsError(f"{origin}: expected a JSON object, got {type(data).__name__}")
    if data.get("schema") != SCHEMA_NAME:
        raise ResultsError(
            f"{origin}: not an attn-harness results file "
            f"(field 'schema' is {data.get('schema')!r}, expected {SCHEMA_NAME!r})"
        )
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ResultsError(
            f"{origin}: schema_version {version!r} is not supported; "
            f"this attn-harness reads version {SCHEMA_VERSION}"
        )
    try:
        import jsonschema
    except ImportError:
        return
    validator = jsonschema.Draft202012Validator(schema())
    errors = list(validator.iter_errors(data))
    if errors:
        # best_match descends into oneOf branches: "'flops' is a required property",
        # not "... is not valid under any of the given schemas"
        first = jsonschema.exceptions.best_match(errors)
        assert first is not None
        more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
        raise ResultsError(f"{origin}: {_where(first.absolute_path)}: {first.message}{more}")


def dumps(record: RunRecord) -> str:
    """The JSON text of ``record``, checked against the schema."""
    data = _finite(record.to_json())
    try:
        text = json.dumps(data, indent=1, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ResultsError(f"cannot serialise results: {exc}") from exc
    validate_document(json.loads(text), origin="results to be written")
    return text + "\n"


def save_results(record: RunRecord, path: str | os.PathLike[str]) -> Path:
    """Write ``record`` to ``path`` atomically: the old file or the new one, never a part."""
    target = Path(path)
    text = dumps(record)  # everything that can fail on content fails before any write
    write_atomically(target, text, durable=True)
    return target


def loads(text: str, *, origin: str = "results") -> RunRecord:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultsError(
            f"{origin}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    validate_document(data, origin=origin)
    try:
        return RunRecord.from_json(data)
    except KeyError as exc:
        raise ResultsError(f"{origin}: missing field {exc.args[0]!r}") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise ResultsError(f"{origin}: malformed field: {exc}") from None


def load_results(path: str | os.PathLike[str]) -> RunRecord:
    """Read and validate a results file; ``ResultsError`` on any problem."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise ResultsError(f"{source}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ResultsError(f"{source}: not a text (UTF-8) file") from None
    return loads(text, origin=str(source))
