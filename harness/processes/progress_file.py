"""Progress as structured data: a child appends one JSON line per step to the file its
parent names in ``ATTN_HARNESS_PROGRESS``; the parent reads the last whole line.

What a person reads (a live line, a log) can change wording or wrap at any width; this
cannot, so a parent never parses a child's output to follow it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

PROGRESS_ENV = "ATTN_HARNESS_PROGRESS"
TAIL_BYTES = 4096  # a progress line is far shorter: the last whole one is always in here


@dataclass(frozen=True)
class Progress:
    """How far a child has got: ``done`` of ``total`` steps, and its own estimate."""

    done: int
    total: int
    left_s: float | None = None  # what the child itself expects the rest to take
    label: str = ""  # the step now running


def report_progress(done: int, total: int, *, left_s: float | None = None, label: str = "") -> None:
    """Append a line to the parent's progress file; nothing when no parent asked for one.

    Progress is a courtesy: a file that cannot be written is passed over, never an error.
    """
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        return
    record = {"done": done, "total": total, "left_s": left_s, "label": label}
    try:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
    except OSError:
        pass


def read_progress(path: Path) -> Progress | None:
    """The last whole line of ``path``; None before the child wrote one."""
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - TAIL_BYTES))
            tail = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in reversed(tail.split("\n")[:-1]):  # the part after the last newline is unfinished
        try:
            record = json.loads(line)
            return Progress(
                int(record["done"]),
                int(record["total"]),
                None if record.get("left_s") is None else float(record["left_s"]),
                str(record.get("label", "")),
            )
        except (ValueError, KeyError, TypeError):
            continue  # the cut first line of the tail, or one a crash left half written
    return None
