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
from harness.dist.group import INIT_ENV, PARENT_ENV
from harness.dist.group_watch import STARTUP_S, GroupWatch
from harness.dist.rendezvous import NodeLink, NodePlan
from harness.processes.supervisor import Child

COLLECTIVE_MARGIN_S = 30.0
"""gloo's own timeout is the watchdog's plus this: the watchdog, which can tell the hung rank
from those waiting on it, acts first."""


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


def _environment(rank: int, dp_size: int, plan: NodePlan, link: NodeLink) -> dict[str, str]:
    """torchrun's variables (ranks numbered across hosts), and the rendezvous to join."""
    local = plan.ranks(dp_size)
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank - local.start),
        WORLD_SIZE=str(dp_size),
        LOCAL_WORLD_SIZE=str(len(local)),
        GROUP_RANK=str(plan.node_rank),
    )
    env[INIT_ENV] = link.init_url()
    env[PARENT_ENV] = str(os.getpid())
    # this host's cores shared among its ranks, unless the caller chose
    env.setdefault("OMP_NUM_THREADS", str(max(1, usable_cpus() // len(local))))
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
    plan: NodePlan | None = None,
) -> Outcome:
    """Run this host's ranks of ``python -m MODULE worker_args`` to the end of the group's run.

    ``plan`` places this host among ``nnodes`` (default: one host runs every
    rank). Every way out (a failure on any host, Ctrl-C, SIGTERM, SIGHUP) kills
    every local rank's process group first; ranks also die with the launcher if
    it is killed. Raises ``RendezvousError`` when the store cannot be hosted or
    reached.
    """
    plan = plan or NodePlan()
    run_dir.mkdir(parents=True, exist_ok=True)
    # gloo's timeout covers joining too: it outlasts the startup allowance and the watchdog
    collective_timeout = max(timeout, STARTUP_S) + COLLECTIVE_MARGIN_S
    command = [
        *worker_command(worker_args, module),
        "--run-dir", str(run_dir),
        "--timeout", str(collective_timeout),
    ]  # fmt: skip
    started = time.monotonic()
    link = NodeLink(plan, dp_size, connect_s=max(timeout, STARTUP_S))
    ranks: dict[int, Child] = {}
    logs = []
    try:
        with _terminations_raise():
            try:
                for rank in plan.ranks(dp_size):
                    log = open(run_dir / f"rank{rank}.log", "wb")  # noqa: SIM115 - closed below
                    logs.append(log)
                    ranks[rank] = Child(
                        command,
                        env=_environment(rank, dp_size, plan, link),
                        stdout=None if (rank == 0 and echo_rank0) else log,
                        stderr=log,
                    )
                watch = GroupWatch(link, ranks, run_dir, timeout)
                failure = watch.run()
            except BaseException:
                _stop_all(ranks)
                raise
            finally:
                for log in logs:
                    log.close()
            survivors = _stop_all(ranks)
            failure, summary = watch.finish(failure)
    finally:
        link.close()
    seconds = time.monotonic() - started
    pids = [r.pid for r in ranks.values()]
    texts = {r: _tail(run_dir / f"rank{r}.log") for r in ranks}
    if survivors:
        message = f"processes still alive after the run: {survivors}"
        return Outcome(1, message, None, seconds, pids, survivors, logs=texts)
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


def _stop_all(ranks: dict[int, Child]) -> list[int]:
    """Stop every rank's process group (a rank's own children go with it); the pids whose
    group is still alive after that (none)."""
    for rank in ranks.values():
        rank.stop()
    return [r.pid for r in ranks.values() if r.group_alive()]


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
