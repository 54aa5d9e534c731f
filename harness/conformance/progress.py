"""How far a conformance run has got: a live line on a terminal, plain lines without one.

A run of the whole suite takes minutes to an hour; a log that says nothing
for twenty minutes reads as a hang. On a terminal one transient line shows
the running test and its examples; without one (a log file, CI) a line
like ``[  120 s] reference: 12/49 tests done, about 3 min left`` is printed
every ``PLAIN_EVERY_S`` seconds (``--progress-every``), from a timer thread, so a long test still
shows the run is alive. Those lines are for people: a program following
the run (the main job) reads the progress file ``conform`` writes beside
them (``harness.processes.progress_file``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
from typing import IO, Any

from harness.core import text_table

PLAIN_EVERY_S = 30.0


def eta_text(seconds: float) -> str:
    """``about 40 s left`` / ``about 3 min left``, rounded as a person would say it."""
    if seconds < 60:
        return f"about {max(5, round(seconds / 5) * 5):.0f} s left"
    return f"about {round(seconds / 60):.0f} min left"


def seconds_left(elapsed: float, done: int, total: int) -> float | None:
    """The rest at the pace so far, once a quarter of the tests are done.

    Tests differ in cost a hundredfold (a rejection test takes a second, a
    stateful one minutes), so a pace read from the first few tests is noise: it
    said 51 minutes for a run that ended a minute later.
    """
    if not 0 < done < total or done * 4 < total:
        return None
    return elapsed / done * (total - done)


def time_left(elapsed: float, done: int, total: int) -> str | None:
    seconds = seconds_left(elapsed, done, total)
    return None if seconds is None else eta_text(seconds)


def progress_line(elapsed: float, who: str, done: int, total: int, running: str = "") -> str:
    """One plain progress line: elapsed time, tests done of total, an estimate of the rest."""
    line = f"[{elapsed:5.0f} s] {who}: {done}/{total} tests done"
    left = time_left(elapsed, done, total)
    if left:
        line += ", " + left
    if running:
        line += f" (now {running})"
    return line


def _terminal_stream() -> IO[str]:
    """A duplicate of the process's stdout, which pytest's capture of fd 1 does not swallow."""
    return os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)


class PlainProgress:
    """Periodic plain progress lines, for logs and CI."""

    def __init__(
        self,
        who: str,
        every_s: float = PLAIN_EVERY_S,
        stream: IO[str] | None = None,
        width: int | None = None,
    ):
        self.who = who or "conformance"
        self.every_s = every_s
        self.width = width  # fit each line to it (COLUMNS asked); None: whole lines
        self.started = time.monotonic()
        self.done = self.total = 0
        self.running = ""
        self._own_stream = stream is None
        self._stream = stream if stream is not None else _terminal_stream()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._tick, name="conform-progress", daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.every_s):
            self.print_line()

    def print_line(self) -> None:
        with self._lock:
            line = progress_line(
                time.monotonic() - self.started, self.who, self.done, self.total, self.running
            )
            parts = [line] if self.width is None else text_table.wrapped(line, self.width)
            print("\n".join(parts), file=self._stream, flush=True)

    def start_test(self, done: int, total: int, label: str) -> None:
        with self._lock:
            self.done, self.total, self.running = done, total, label

    def example_held(self) -> None:
        """Examples are not counted in plain lines (they would be stale between prints)."""

    def add_examples(self, count: int) -> None:
        """Not counted either (see ``example_held``)."""

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self._own_stream:
            self._stream.close()


class LiveLine:
    """One transient line on the terminal: the running test and its examples so far.

    It writes to a duplicate of the terminal's file descriptor taken before
    any test runs, so pytest's output capture (which redirects fd 1 during a
    test) does not swallow it. Silent under ``CI`` or without a terminal.
    """

    def __init__(self, per_test: bool = True) -> None:
        from rich.console import Console
        from rich.progress import (
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self._stream: IO[str] | None = _terminal_stream()
        console = Console(file=self._stream, force_terminal=True)
        self._progress: Any = Progress(
            SpinnerColumn(),
            TextColumn("[{task.completed}/{task.total}]"),
            TextColumn("{task.description}"),
            TextColumn("{task.fields[examples]} held"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[left]}"),
            console=console,
            transient=True,
        )
        self._task: Any = self._progress.add_task("starting", total=0, examples=0, left="")
        self._started = time.monotonic()
        self._per_test = per_test  # count the running test's examples (else the run's so far)
        self._progress.start()

    def start_test(self, done: int, total: int, label: str) -> None:
        if self._progress is not None:
            left = time_left(time.monotonic() - self._started, done, total) or ""
            self._progress.update(
                self._task, completed=done, total=total, description=label, left=left
            )
            if self._per_test:
                self._progress.update(self._task, examples=0)

    def example_held(self) -> None:
        self.add_examples(1)

    def add_examples(self, count: int) -> None:
        if self._progress is not None:
            examples = self._progress.tasks[0].fields["examples"]
            self._progress.update(self._task, examples=examples + count)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._stream is not None:
            self._stream.close()
            self._stream = None


def progress_display(
    who: str,
    quiet: bool,
    every_s: float = PLAIN_EVERY_S,
    width: int | None = None,
    per_test: bool = True,
) -> Any:
    """The live line on a terminal; plain periodic lines when ``quiet`` (no terminal, CI),
    fitted to ``width`` when one is asked for. ``per_test=False`` (tests spread over
    workers, which report examples only when a test ends): the run's examples so far.
    Without rich (an optional dependency, ``attn-harness[live]``) a terminal gets the
    plain lines too."""
    if quiet or importlib.util.find_spec("rich") is None:  # rich is optional: plain lines
        return PlainProgress(who, every_s, width=width)
    return LiveLine(per_test)
