"""Baselines: several runs of one device class pooled in one file, written atomically.

A single run cannot show how much a case's ratio to its peer moves between
processes on the same machine; the gate needs that spread to tell a
regression from noise. So a baseline holds at least ``MIN_BASELINE_RUNS``
whole results documents (raw samples included), all of one device class,
and the gate recomputes everything from them.

Format (``attn-harness/baseline``, version 1)::

    {"schema": "attn-harness/baseline", "schema_version": 1,
     "device_class": "cpu-amd-epyc-2cpu", "created": "...", "command": [...],
     "runs": [<results document>, ...]}

A plain results file is also accepted wherever a baseline is read (one run,
no spread of its own).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.atomic_file import write_atomically
from harness.gate.device_class import device_class
from harness.results.store import SCHEMA_NAME, ResultsError, RunRecord, dumps, loads

BASELINE_SCHEMA = "attn-harness/baseline"
BASELINE_VERSION = 1
MIN_BASELINE_RUNS = 3


class BaselineError(ValueError):
    """A baseline cannot be made, read or used; the message says which and why."""


@dataclass
class Baseline:
    device_class: str
    runs: list[RunRecord]
    created: str = ""
    command: list[str] = field(default_factory=list)


def make_baseline(
    runs: Sequence[RunRecord], *, command: Sequence[str] = (), min_runs: int = MIN_BASELINE_RUNS
) -> Baseline:
    """Pool ``runs`` into a baseline; refuses too few runs, partial runs or shards (each
    lacks cases), or runs of different classes."""
    if len(runs) < min_runs:
        raise BaselineError(
            f"a baseline pools at least {min_runs} runs (got {len(runs)}): one run cannot "
            "show how much a case moves between processes"
        )
    partial = [i + 1 for i, r in enumerate(runs) if r.partial]
    if partial:
        raise BaselineError(
            f"run(s) {partial} are marked partial (cut short before their last case): "
            "a baseline pools finished runs only"
        )
    shards = [
        f"{i + 1} (shard {r.shard.get('index')}/{r.shard.get('count')})"
        for i, r in enumerate(runs)
        if r.shard
    ]
    if shards:
        raise BaselineError(
            f"run(s) {', '.join(shards)} hold one shard of a sweep each: merge the shards "
            "first (attn-harness merge), a baseline pools whole runs only"
        )
    classes = sorted({device_class(r.environment) for r in runs})
    if len(classes) > 1:
        raise BaselineError(f"runs of different device classes cannot be pooled: {classes}")
    created = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    return Baseline(classes[0], list(runs), created, list(command))


def baseline_text(baseline: Baseline) -> str:
    """The JSON text; each run is checked against the results schema first."""
    runs = [json.loads(dumps(run)) for run in baseline.runs]
    document = {
        "schema": BASELINE_SCHEMA,
        "schema_version": BASELINE_VERSION,
        "device_class": baseline.device_class,
        "created": baseline.created,
        "command": baseline.command,
        "runs": runs,
    }
    return json.dumps(document, indent=None, separators=(",", ":")) + "\n"


def save_baseline(baseline: Baseline, path: str | os.PathLike[str]) -> Path:
    """Write atomically (temporary file, then rename); creates the folder."""
    target = Path(path)
    text = baseline_text(baseline)
    target.parent.mkdir(parents=True, exist_ok=True)
    return write_atomically(target, text.encode("utf-8"))


def _runs_of(document: dict[str, Any], origin: str) -> list[RunRecord]:
    version = document.get("schema_version")
    if version != BASELINE_VERSION:
        raise BaselineError(
            f"{origin}: baseline schema_version {version!r} is not supported; "
            f"this attn-harness reads version {BASELINE_VERSION}"
        )
    runs = document.get("runs")
    if not isinstance(runs, list) or not runs:
        raise BaselineError(f"{origin}: a baseline needs a non-empty list 'runs'")
    try:
        return [loads(json.dumps(run), origin=f"{origin}: runs[{i}]") for i, run in enumerate(runs)]
    except ResultsError as exc:
        raise BaselineError(str(exc)) from None


def load_baseline(path: str | os.PathLike[str]) -> Baseline:
    """A baseline file, or a plain results file taken as a one-run baseline."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise BaselineError(f"{source}: cannot read: {reason}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(
            f"{source}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    if isinstance(document, dict) and document.get("schema") == BASELINE_SCHEMA:
        runs = _runs_of(document, str(source))
        stated = document.get("device_class")
        classes = sorted({device_class(r.environment) for r in runs})
        if classes != [stated]:
            raise BaselineError(
                f"{source}: device_class {stated!r} does not match its runs ({classes})"
            )
        return Baseline(
            str(stated), runs, str(document.get("created", "")), document.get("command", [])
        )
    if isinstance(document, dict) and document.get("schema") == SCHEMA_NAME:
        try:
            run = loads(text, origin=str(source))
        except ResultsError as exc:
            raise BaselineError(str(exc)) from None
        return Baseline(device_class(run.environment), [run], run.created)
    raise BaselineError(
        f"{source}: neither a baseline ({BASELINE_SCHEMA!r}) nor a results file ({SCHEMA_NAME!r})"
    )


def default_baseline_path(root: str | os.PathLike[str], device: str) -> Path:
    """Where the committed baseline of a device class lives."""
    return Path(root) / "baselines" / device / "baseline.json"
