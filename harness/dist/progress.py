"""What ranks tell their launcher through files: where each one is, and how it ended.

Each rank rewrites ``rank<R>.beat.json`` (step and phase) as it moves, and
writes ``rank<R>.status.json`` once if it fails. The launcher reads them to
tell a hung rank (stuck outside a collective) from the ranks waiting on it
(inside one), and a root cause from its collateral errors. Files, not a
socket: they survive the rank, and a killed rank's last beat says where it died.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.core.atomic_file import write_json_atomically

COLLECTIVE_PHASES = frozenset({"exchange", "gather", "verdict", "barrier", "init", "join"})
"""Phases in which a rank waits for the others: a stall there is not its own fault."""


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class Beat:
    rank: int
    step: int  # 0-based, -1 before the first step; shown counting from 1
    phase: str
    pid: int

    @property
    def waiting(self) -> bool:
        return self.phase in COLLECTIVE_PHASES

    def where(self) -> str:
        step = "before the first step" if self.step < 0 else f"step {self.step + 1}"
        return f"{step} ({self.phase})"


class Heartbeat:
    """One rank's beat file; ``beat`` is cheap enough to call at every phase."""

    def __init__(self, run_dir: Path | None, rank: int) -> None:
        self.path = None if run_dir is None else run_dir / f"rank{rank}.beat.json"
        self.rank = rank
        self.step = -1
        self.phase = "init"

    def beat(self, step: int, phase: str) -> None:
        self.step, self.phase = step, phase
        if self.path is not None:
            write_json_atomically(self.path, asdict(Beat(self.rank, step, phase, os.getpid())))


def read_beat(run_dir: Path, rank: int) -> Beat | None:
    data = read_json(run_dir / f"rank{rank}.beat.json")
    if data is None:
        return None
    return Beat(int(data["rank"]), int(data["step"]), str(data["phase"]), int(data["pid"]))


@dataclass(frozen=True)
class Status:
    """How a rank failed. ``kind``: raised, collective, dp-metadata, check, setup, usage.

    ``culprit`` is the rank an error shared by the group is about (a bad count's
    sender, the rank whose output was wrong), where that is known.
    """

    rank: int
    step: int
    phase: str
    kind: str
    error: str
    culprit: int | None = None

    @property
    def collateral(self) -> bool:
        """An error from waiting on another rank (its collective broke), not a cause."""
        return self.kind == "collective"


def write_status(run_dir: Path | None, status: Status) -> None:
    if run_dir is not None:
        write_json_atomically(run_dir / f"rank{status.rank}.status.json", asdict(status))


def read_status(run_dir: Path, rank: int) -> Status | None:
    data = read_json(run_dir / f"rank{rank}.status.json")
    if data is None:
        return None
    fields = {k: data[k] for k in ("rank", "step", "phase", "kind", "error")}
    return Status(**fields, culprit=data.get("culprit"))


def write_summary(run_dir: Path | None, summary: dict[str, Any]) -> None:
    if run_dir is not None:
        write_json_atomically(run_dir / "summary.json", summary)


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    return read_json(run_dir / "summary.json")
