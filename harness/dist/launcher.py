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
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.bench.environment import usable_cpus
from harness.dist.diagnosis import RunFailure, diagnose_exit, diagnose_stall
from harness.dist.group import INIT_ENV, PARENT_ENV
from harness.dist.progress import read_beat, read_status, read_summary
from harness.processes.supervisor import Child

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
    hung: bool = False
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
    )
    env[INIT_ENV] = f"file://{run_dir / 'store'}"
    env[PARENT_ENV] = str(os.getpid())
    # the machine's cores shared among the ranks, unless the caller chose
    env.setdefault("OMP_NUM_THREADS", str(max(1, usable_cpus() // dp_size)))
    return env


class Terminated(Exception):
    """SIGTERM or SIGHUP reached the launcher: end the ranks, then leave."""


@contextlib.contextmanager
def _terminations_raise() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into an exception, so the ranks are killed on the way out."""

    def handler(signum: int, frame: object) -> None:
        raise Terminated(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def launch(
    worker_args: Sequence[str],
    dp_size: int,
    run_dir: Path,
    *,
    timeout: float,
    echo_rank0: bool = True,
    module: str = "harness.dist.worker",
) -> Outcome:
    """Run ``dp_size`` ranks of ``python -m MODULE worker_args`` to the end.

    Every way out (a failure, Ctrl-C, SIGTERM, SIGHUP) kills every rank's
    process group first; ranks also die with the launcher if it is killed.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    # gloo's timeout covers joining too: it outlasts the startup allowance and the watchdog
    collective_timeout = max(timeout, STARTUP_S) + COLLECTIVE_MARGIN_S
    command = [
        *worker_command(worker_args, module),
        "--run-dir", str(run_dir),
        "--timeout", str(collective_timeout),
    ]  # fmt: skip
    started = time.monotonic()
    ranks: list[Child] = []
    logs = []
    with _terminations_raise():
        try:
            for rank in range(dp_size):
                log = open(run_dir / f"rank{rank}.log", "wb")  # noqa: SIM115 - closed below
                logs.append(log)
                ranks.append(
                    Child(
                        command,
                        env=_environment(rank, dp_size, run_dir),
                        stdout=None if (rank == 0 and echo_rank0) else log,
                        stderr=log,
                    )
                )
            failure = _watch(ranks, run_dir, timeout)
        except BaseException:
            _stop_all(ranks)
            raise
        finally:
            for log in logs:
                log.close()
        survivors = _stop_all(ranks)
    seconds = time.monotonic() - started
    pids = [r.pid for r in ranks]
    texts = {r: _tail(run_dir / f"rank{r}.log") for r in range(dp_size)}
    if survivors:
        message = f"processes still alive after the run: {survivors}"
        return Outcome(1, message, None, seconds, pids, survivors, logs=texts)
    summary = read_summary(run_dir)
    if failure is None:
        return Outcome(0, "passed", summary, seconds, pids, logs=texts)
    return Outcome(
        failure.code,
        failure.message,
        summary,
        seconds,
        pids,
        [],
        failure.rank,
        failure.step,
        failure.hung,
        texts,
    )


def _watch(procs: list[Child], run_dir: Path, timeout: float) -> RunFailure | None:
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
            return diagnose_stall(beats, codes, now - last_change, timeout)
        time.sleep(POLL_S)


def _first_failure(procs: list[Child], run_dir: Path) -> RunFailure:
    """Give the others a moment to say why, then pick the cause, not the collateral."""
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(POLL_S)
    ranks = range(len(procs))
    return diagnose_exit(
        [read_status(run_dir, r) for r in ranks],
        [p.poll() for p in procs],
        [read_beat(run_dir, r) for r in ranks],
    )


def _stop_all(ranks: list[Child]) -> list[int]:
    """Stop every rank's process group (a rank's own children go with it); the pids whose
    group is still alive after that (none)."""
    for rank in ranks:
        rank.stop()
    return [r.pid for r in ranks if r.group_alive()]


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
