"""How a rank fails: the errors every rank raises together, and the report it leaves."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

from harness.core.exit_codes import EXIT_FAILED, EXIT_USAGE
from harness.dist.coordination import DPMetadataError
from harness.dist.progress import COLLECTIVE_PHASES, Heartbeat, Status, write_status


class GroupError(RuntimeError):
    """An error every rank raises together; ``culprit`` is the rank it is about."""

    def __init__(self, message: str, culprit: int | None = None) -> None:
        super().__init__(message)
        self.culprit = culprit


class UsageProblem(GroupError):
    """The run cannot start as asked (the backend, its claim): exit 2."""


class SetupFailed(GroupError):
    """A backend raised while being built or bound: a failure of the backend, exit 1."""


class StepCheckFailed(GroupError):
    """Rank 0 found a wrong output or a stray write."""


def kind_of(exc: BaseException, phase: str) -> str:
    """The status kind the launcher reads: who else raised it, and whether it is a cause."""
    if isinstance(exc, DPMetadataError):
        return "dp-metadata"
    if isinstance(exc, StepCheckFailed):
        return "check"
    if isinstance(exc, UsageProblem):
        return "usage"
    if isinstance(exc, SetupFailed):
        return "setup"
    if phase in COLLECTIVE_PHASES:
        return "collective"
    return "raised"


def culprit_of(exc: BaseException) -> int | None:
    if isinstance(exc, DPMetadataError | GroupError):
        return exc.culprit
    return None


def fail_rank(run_dir: Path | None, beat: Heartbeat, exc: BaseException) -> None:
    """Report how this rank failed (status file and stderr), then leave at once."""
    kind = kind_of(exc, beat.phase)
    text = f"{type(exc).__name__}: {exc}"
    status = Status(beat.rank, beat.step, beat.phase, kind, text, culprit_of(exc))
    write_status(run_dir, status)
    print(f"rank {beat.rank}: {text}", file=sys.stderr, flush=True)
    if kind in ("raised", "collective"):
        traceback.print_exc(file=sys.stderr)
    sys.stderr.flush()
    sys.stdout.flush()
    # no atexit, no destroy_process_group: either can wait on the ranks this one is leaving
    os._exit(EXIT_USAGE if kind == "usage" else EXIT_FAILED)
