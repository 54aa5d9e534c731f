"""Start the ranks, watch them, and end the whole group when one fails, hangs or dies.

gloo's timeout covers collectives only, and a rank killed outright says
nothing, so the launcher is the watchdog: each rank runs in a session of its
own; the launcher polls exit codes and the ranks' beat files; when a rank
exits non-zero, or no rank has moved for ``timeout`` seconds, it kills every
rank's process group, reaps them, checks by process id that nothing is left,
and names the rank and the step that caused it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.dist.progress import Beat, Status, read_beat, read_status, read_summary

POLL_S = 0.05
GRACE_S = 2.0
"""After the first rank fails, how long the others get to fail on their own (and say why)."""
COLLECTIVE_MARGIN_S = 30.0
"""gloo's own timeout is the watchdog's plus this: the watchdog, which can tell the hung rank
from those waiting on it, acts first."""
STARTUP_S = 180.0
"""How long ranks may take to import torch and join before the stall timeout applies."""


@dataclass
class Outcome:
    """How a run ended: ``exit_code`` 0 passed, 1 failed, 2 could not run as asked."""

    exit_code: int
    message: str
    summary: dict[str, Any] | None
    seconds: float
    pids: list[int]
    survivors: list[int] = field(default_factory=list)
    failed_rank: int | None = None
    failed_step: int | None = None
    logs: dict[int, str] = field(default_factory=dict)


def worker_command(worker_args: Sequence[str], module: str = "harness.dist.worker") -> list[str]:
    return [sys.executable, "-m", module, *worker_args]


def _environment(rank: int, dp_size: int, run_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(dp_size),
        LOCAL_WORLD_SIZE=str(dp_size),
        ATTN_HARNESS_DIST_INIT=f"file://{run_dir / 'store'}",
    )
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // dp_size)))
    return env


def launch(
    worker_args: Sequence[str],
    dp_size: int,
    run_dir: Path,
    *,
    timeout: float,
    echo_rank0: bool = True,
    module: str = "harness.dist.worker",
) -> Outcome:
    """Run ``dp_size`` ranks of ``python -m MODULE worker_args`` to the end."""
    run_dir.mkdir(parents=True, exist_ok=True)
    command = [
        *worker_command(worker_args, module),
        "--run-dir", str(run_dir),
        "--timeout", str(timeout + COLLECTIVE_MARGIN_S),
    ]  # fmt: skip
    started = time.monotonic()
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for rank in range(dp_size):
            log = open(run_dir / f"rank{rank}.log", "wb")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    command,
                    env=_environment(rank, dp_size, run_dir),
                    stdout=None if (rank == 0 and echo_rank0) else log,
                    stderr=log,
                    start_new_session=True,  # its own process group: killed as one
                )
            )
        failure = _watch(procs, run_dir, timeout)
    except BaseException:
        _kill_all(procs)
        raise
    finally:
        for log in logs:
            log.close()
    survivors = _kill_all(procs)
    seconds = time.monotonic() - started
    pids = [p.pid for p in procs]
    texts = {r: _tail(run_dir / f"rank{r}.log") for r in range(dp_size)}
    if survivors:
        message = f"processes still alive after the run: {survivors}"
        return Outcome(1, message, None, seconds, pids, survivors, logs=texts)
    if failure is None:
        return Outcome(0, "passed", read_summary(run_dir), seconds, pids, logs=texts)
    code, message, failed_rank, failed_step = failure
    summary = read_summary(run_dir)
    return Outcome(code, message, summary, seconds, pids, [], failed_rank, failed_step, texts)


Failure = tuple[int, str, int | None, int | None]


def _watch(procs: list[subprocess.Popen[bytes]], run_dir: Path, timeout: float) -> Failure | None:
    """Poll until every rank exits 0 (None) or the run must end (the failure)."""
    dp_size = len(procs)
    last_change = time.monotonic()
    seen: list[tuple[int, str] | None] = [None] * dp_size
    while True:
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return None
        if any(c not in (None, 0) for c in codes):
            return _first_failure(procs, run_dir)
        now = time.monotonic()
        beats = [read_beat(run_dir, r) for r in range(dp_size)]
        marks = [None if b is None else (b.step, b.phase) for b in beats]
        if marks != seen:
            seen, last_change = marks, now
        started = all(b is not None and b.phase not in ("init", "setup") for b in beats)
        if now - last_change > (timeout if started else max(timeout, STARTUP_S)):
            return _stall(beats, now - last_change)
        time.sleep(POLL_S)


def _stall(beats: list[Beat | None], idle: float) -> Failure:
    """Name the hung ranks: those stopped outside a collective, else the furthest behind."""
    stuck = [b for b in beats if b is not None and not b.waiting]
    missing = [r for r, b in enumerate(beats) if b is None]
    if missing:
        rank = missing[0]
        return 1, f"rank {rank} never started: no sign of it for {idle:.0f} s", rank, None
    if not stuck:
        known = [b for b in beats if b is not None]
        stuck = [min(known, key=lambda b: (b.step, b.rank))]
    culprit = stuck[0]
    others = ", ".join(f"rank {b.rank} at {b.where()}" for b in beats if b is not None)
    return (
        1,
        f"rank {culprit.rank} hung at {culprit.where()}: no rank moved for {idle:.1f} s "
        f"(the timeout); {others}",
        culprit.rank,
        culprit.step,
    )


def _first_failure(procs: list[subprocess.Popen[bytes]], run_dir: Path) -> Failure:
    """Give the others a moment to say why, then pick the cause, not the collateral."""
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(POLL_S)
    statuses = [read_status(run_dir, r) for r in range(len(procs))]
    codes = [p.poll() for p in procs]
    beats = [read_beat(run_dir, r) for r in range(len(procs))]
    for judge in (_agreed_error, _killed, _raised, _stuck, _collateral):
        found = judge(statuses, codes, beats)
        if found is not None:
            return found
    rank = next(r for r, c in enumerate(codes) if c not in (None, 0))
    return 1, f"rank {rank} exited with code {codes[rank]} without a report", rank, None


Statuses = list[Status | None]
Codes = list[int | None]
Beats = list[Beat | None]


def _agreed_error(statuses: Statuses, codes: Codes, beats: Beats) -> Failure | None:
    """An error every rank raised together (bad DP metadata, a failed check, a usage error)."""
    shared = [s for s in statuses if s is not None and s.kind in ("dp-metadata", "check", "usage")]
    if not shared:
        return None
    cause = shared[0]
    agreed = sum(1 for s in statuses if s is not None and s.error == cause.error)
    message = f"{cause.error} (raised on {agreed} of {len(statuses)} ranks)"
    return (2 if cause.kind == "usage" else 1), message, cause.rank, cause.step


def _killed(statuses: Statuses, codes: Codes, beats: Beats) -> Failure | None:
    """A rank ended by a signal, with no report: its last beat says where it died."""
    for rank, code in enumerate(codes):
        if code is not None and code < 0 and statuses[rank] is None:
            beat = beats[rank]
            where = "before it started" if beat is None else f"at {beat.where()}"
            step = None if beat is None else beat.step
            return 1, f"rank {rank} was killed by {signal.Signals(-code).name} {where}", rank, step
    return None


def _raised(statuses: Statuses, codes: Codes, beats: Beats) -> Failure | None:
    """A rank that raised outside a collective: the cause, the others' errors follow from it."""
    for status in statuses:
        if status is not None and not status.collateral:
            step = "before the first step" if status.step < 0 else f"at step {status.step + 1}"
            message = f"rank {status.rank} failed {step} ({status.phase}): {status.error}"
            return 1, message, status.rank, status.step
    return None


def _stuck(statuses: Statuses, codes: Codes, beats: Beats) -> Failure | None:
    """Only collective errors: the cause is a rank stuck outside a collective."""
    for beat in beats:
        if beat is not None and not beat.waiting and statuses[beat.rank] is None:
            message = f"rank {beat.rank} hung at {beat.where()}: the others' collectives timed out"
            return 1, message, beat.rank, beat.step
    return None


def _collateral(statuses: Statuses, codes: Codes, beats: Beats) -> Failure | None:
    """Nothing better known: the first collective error."""
    for status in statuses:
        if status is not None:
            message = f"rank {status.rank} failed at {status.phase}: {status.error}"
            return 1, message, status.rank, status.step
    return None


def _kill_all(procs: list[subprocess.Popen[bytes]]) -> list[int]:
    """SIGKILL every rank's process group, reap, and return the pids still alive (none)."""
    for proc in procs:
        if proc.poll() is None:
            _killpg(proc.pid)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    deadline = time.monotonic() + 5.0
    while True:
        alive = [p.pid for p in procs if _group_alive(p.pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        for pid in alive:  # a rank's own children (compile workers, ...) go with it
            _killpg(pid)
        time.sleep(POLL_S)


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    """Whether any process (the rank or a child) is left in the rank's process group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
