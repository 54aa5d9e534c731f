"""Which rank caused a failed run, and where: read from exit codes, beats and status files.

A failure shows on several ranks at once: the rank that raised, hung or
died, and the ranks whose collectives broke because of it. The judges below
are tried in order, most specific first, so the message names the cause and
not the collateral.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harness.dist.progress import Beat, Status

AGREED_KINDS = ("dp-metadata", "check", "setup", "usage")
"""Errors every rank raises together, from the same collective."""


@dataclass(frozen=True)
class RunFailure:
    """Why the run ended: exit code, message, the rank and 0-based step it is about."""

    code: int
    message: str
    rank: int | None = None
    step: int | None = None
    hung: bool = False


Statuses = Sequence[Status | None]
Codes = Sequence[int | None]
Beats = Sequence[Beat | None]


def diagnose_exit(statuses: Statuses, codes: Codes, beats: Beats) -> RunFailure:
    """A rank exited non-zero: the cause among every rank's status, exit code and beat."""
    judges: tuple[Callable[[Statuses, Codes, Beats], RunFailure | None], ...] = (
        _agreed_error, _killed, _raised, _stuck, _collateral,
    )  # fmt: skip
    for judge in judges:
        found = judge(statuses, codes, beats)
        if found is not None:
            return found
    rank = next(r for r, c in enumerate(codes) if c not in (None, 0))
    return RunFailure(1, f"rank {rank} exited with code {codes[rank]} without a report", rank)


def diagnose_stall(beats: Beats, codes: Codes, idle: float, timeout: float) -> RunFailure:
    """No rank moved for ``idle`` seconds: name the one stopped outside a collective."""
    where = ", ".join(f"rank {b.rank} at {b.where()}" for b in beats if b is not None)
    for rank, beat in enumerate(beats):
        if beat is None:
            message = f"rank {rank} never started: no sign of it for {idle:.0f} s"
            return RunFailure(1, message, rank, None, hung=True)
    for rank, code in enumerate(codes):
        if code == 0:
            message = (
                f"rank {rank} exited (code 0) before the group finished; the others waited "
                f"{idle:.0f} s: {where}"
            )
            return RunFailure(1, message, rank, None, hung=True)
    stuck = [b for b in beats if b is not None and not b.waiting]
    if not stuck:
        message = (
            f"every rank is waiting in a collective and none moved for {idle:.1f} s "
            f"(the timeout is {timeout:g} s): the ranks' collectives are out of step: {where}"
        )
        return RunFailure(1, message, None, None, hung=True)
    culprit = stuck[0]
    message = (
        f"rank {culprit.rank} hung at {culprit.where()}: no rank moved for {idle:.1f} s "
        f"(the timeout); {where}"
    )
    return RunFailure(1, message, culprit.rank, culprit.step, hung=True)


def _agreed_error(statuses: Statuses, codes: Codes, beats: Beats) -> RunFailure | None:
    """An error every rank raised together (bad DP metadata, a failed check, set-up)."""
    shared = [s for s in statuses if s is not None and s.kind in AGREED_KINDS]
    if not shared:
        return None
    cause = shared[0]
    agreed = sum(1 for s in statuses if s is not None and s.error == cause.error)
    message = f"{cause.error} (raised on {agreed} of {len(statuses)} ranks)"
    rank = cause.culprit if cause.culprit is not None else cause.rank
    return RunFailure(2 if cause.kind == "usage" else 1, message, rank, cause.step)


def _killed(statuses: Statuses, codes: Codes, beats: Beats) -> RunFailure | None:
    """A rank ended by a signal, with no report: its last beat says where it died."""
    for rank, code in enumerate(codes):
        if code is not None and code < 0 and statuses[rank] is None:
            beat = beats[rank]
            where = "before it started" if beat is None else f"at {beat.where()}"
            step = None if beat is None else beat.step
            name = signal.Signals(-code).name
            return RunFailure(1, f"rank {rank} was killed by {name} {where}", rank, step)
    return None


def _raised(statuses: Statuses, codes: Codes, beats: Beats) -> RunFailure | None:
    """A rank that raised outside a collective: the others' errors follow from it."""
    for status in statuses:
        if status is not None and not status.collateral:
            step = "before the first step" if status.step < 0 else f"at step {status.step + 1}"
            message = f"rank {status.rank} failed {step} ({status.phase}): {status.error}"
            return RunFailure(1, message, status.rank, status.step)
    return None


def _stuck(statuses: Statuses, codes: Codes, beats: Beats) -> RunFailure | None:
    """Only collective errors: the cause is a rank that never started, or one stuck outside."""
    for rank, beat in enumerate(beats):
        if beat is None and statuses[rank] is None:
            return RunFailure(
                1, f"rank {rank} never started; the others' collectives timed out", rank
            )
    for beat in beats:
        if beat is not None and not beat.waiting and statuses[beat.rank] is None:
            message = f"rank {beat.rank} hung at {beat.where()}: the others' collectives timed out"
            return RunFailure(1, message, beat.rank, beat.step, hung=True)
    return None


def _collateral(statuses: Statuses, codes: Codes, beats: Beats) -> RunFailure | None:
    """Nothing better known: the first collective error."""
    for status in statuses:
        if status is not None:
            message = f"rank {status.rank} failed at {status.phase}: {status.error}"
            return RunFailure(1, message, status.rank, status.step)
    return None
