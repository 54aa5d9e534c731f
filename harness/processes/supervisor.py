"""One way to run a child process: in a process group of its own, so that stopping it
stops everything it started too (pytest-xdist workers, compile jobs, a rank's helpers).

``Child`` starts, waits, reads progress and stops; ``run`` is a child run to the end
under a time limit. Stopping sends one signal to the whole group (SIGINT lets pytest
write its reports, SIGTERM lets a program clean up), SIGKILL to whatever is left after a
grace period, and sweeps the group until nothing of it is alive.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from harness.processes.progress_file import PROGRESS_ENV, Progress, read_progress

SWEEP_S = 5.0  # how long stragglers of a stopped group are killed again before giving up
POLL_S = 0.05


def _default_sigint() -> None:
    """In the child before it starts: SIGINT back to its default action.

    A program started in the background by a non-interactive shell inherits
    SIGINT ignored, and Python then installs no KeyboardInterrupt handler: the
    child would ignore the interrupt meant to make it write its reports.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Child:
    """A running child process, the leader of its own process group."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        progress: Path | None = None,
        interruptible: bool = False,
        **popen: Any,
    ) -> None:
        """``progress``: the file the child's progress lines go to (``progress_file``);
        ``interruptible``: SIGINT raises KeyboardInterrupt in it even when this process
        ignores SIGINT; ``popen``: ``cwd``, ``stdin``, ``stdout``, ``stderr``, ``text``."""
        environment = dict(os.environ if env is None else env)
        environment.pop(PROGRESS_ENV, None)  # a grandchild never writes into our parent's file
        if progress is not None:
            environment[PROGRESS_ENV] = str(progress)
        self.progress_path = progress
        self.process: subprocess.Popen[Any] = subprocess.Popen(
            list(command),
            env=environment,
            start_new_session=True,
            preexec_fn=_default_sigint if interruptible else None,
            **popen,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit status, or None when the child is still running after ``timeout``."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def progress(self) -> Progress | None:
        """The child's last progress line, if it was given a file and wrote one."""
        return None if self.progress_path is None else read_progress(self.progress_path)

    def signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def group_alive(self) -> bool:
        """Whether anything (the child or what it started) is left in its group."""
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def stop(self, *, first: signal.Signals = signal.SIGKILL, grace_s: float = 0.0) -> int:
        """Stop the child and its whole group; its exit status.

        ``first`` goes to the group; what is still running ``grace_s`` later gets
        SIGKILL; then the group is swept (a child's children may outlive it) for up to
        ``SWEEP_S``. A child that has already exited only has its group swept.
        """
        if self.process.poll() is None:
            self.signal_group(first)
            if first is not signal.SIGKILL and self.wait(grace_s) is None:
                self.signal_group(signal.SIGKILL)
        code = self.process.wait()
        deadline = time.monotonic() + SWEEP_S
        while self.group_alive() and time.monotonic() < deadline:
            self.signal_group(signal.SIGKILL)
            time.sleep(POLL_S)
        return code

    def __enter__(self) -> Child:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


@dataclass(frozen=True)
class Finished:
    """How a child run to the end ended."""

    code: int
    timed_out: bool
    seconds: float


def run(
    command: Sequence[str],
    *,
    timeout_s: float | None = None,
    first: signal.Signals = signal.SIGINT,
    grace_s: float = 10.0,
    **child: Any,
) -> Finished:
    """Run ``command`` to the end, or stop it ``timeout_s`` in (``first``, then SIGKILL
    ``grace_s`` later); its group is stopped on every way out, Ctrl-C included."""
    started = time.monotonic()
    with Child(command, **child) as running:
        code = running.wait(timeout_s)
        timed_out = code is None
        if code is None:
            code = running.stop(first=first, grace_s=grace_s)
    return Finished(code, timed_out, time.monotonic() - started)
