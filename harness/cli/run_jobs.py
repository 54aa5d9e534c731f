"""The main job: conformance of every backend, the benchmarks, then the report, in one command.

Conformance draws are small and single-threaded, so the backends are checked
in parallel worker processes, one backend per process, as many at a time as
the machine has CPUs, the slowest first (longest-processing-time-first, so
the last to finish is a short one); on a machine with more CPUs than backends
each backend's run spreads its own tests over its share of them
(``conform --workers``). How slow a backend is comes from a probe:
one small mixed step, timed once warm (a Triton kernel interpreted on the
CPU takes 0.3 s, an eager FlexAttention 30 ms, the rest about 5 ms). The benchmarks
run after conformance, alone, so no conformance worker steals their cores.
Each step writes its files into the run folder as it finishes (a JUnit
file per backend, the results file, then the report), atomically, so an
interrupted run keeps what it completed and never a half-written file.

Every step is a subprocess of the installed ``attn-harness`` (``python -m
harness``): the same commands a user would type, and one backend's crash
or hang cannot take the others with it. Conformance workers run torch on one
thread (``OMP_NUM_THREADS=1`` unless set); the bench gets the environment
unchanged, so it times at the thread count a plain ``attn-harness bench``
would use here (``harness.core.threads.timing_threads``) and the two compare.

Progress has content, read as data: each step is a ``harness.processes``
child given a progress file, where ``conform`` writes its tests done (and its
own estimate of the rest) and ``bench`` its cases done, one JSON line each;
they give a heartbeat such as ``conformance: triton 12/49 (~4 min left), flex
30/49 (~2 min); 2 waiting``, at most ``WIDTH`` columns, shown as a live line
on a terminal and as a plain line every ``HEARTBEAT_S`` seconds without one.
Every step runs in a process group of its own, stopped as a whole on the
way out. ``closing_verdict`` composes the last line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from harness.processes.progress_file import Progress
from harness.processes.supervisor import Child

if TYPE_CHECKING:
    from harness.core.registry import BackendEntry

HEARTBEAT_S = 30.0  # a plain progress line this often without a terminal
LIVE_S = 1.0  # the live line's refresh on a terminal
WIDTH = 100  # progress lines, their "[   12 s] " prefix included, fit this many columns
STOP_GRACE_S = 10.0  # a stopped step's time to write what it has, before SIGKILL


@dataclass
class ConformanceJob:
    backend: str
    junit: Path
    log: Path
    started: float = 0.0
    seconds: float = 0.0
    code: int | None = None
    child: Child | None = field(default=None, repr=False)

    @property
    def verdict(self) -> str:
        """The closing line ``conform`` printed (its last line), or why there is none."""
        try:
            lines = self.log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        except OSError:
            lines = []
        closing = [line for line in lines if line.startswith("attn-harness conform:")]
        return closing[-1] if closing else f"exit {self.code}, no verdict (see {self.log})"


def file_stem(name: str) -> str:
    """A backend name as a file name: specs hold '/', ':' and '.'."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    return safe.strip("_") or "backend"


def probe_seconds(entry: BackendEntry, device: str) -> float:
    """Seconds of one small mixed step (decode and a 64-token chunk), timed once warm.

    A backend that cannot run the probe gets 0: it is started last, and its
    conformance run says why it failed.
    """
    from harness.numerics.latent import for_kind
    from harness.numerics.scenario import Scenario, backend_for, run_scenario

    scenario = Scenario(
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        page_size=16,
        context_lens=(300, 70),
        query_lens=(1, 64),
        device=device,
    )
    scenario = for_kind(entry.capabilities, scenario)

    def make(s: Scenario) -> Any:
        return backend_for(entry, s)

    try:
        run_scenario(make, scenario)
        started = time.perf_counter()
        run_scenario(make, scenario)
    except Exception:  # reported by the backend's own conformance run
        return 0.0
    return time.perf_counter() - started


def schedule(costs: Mapping[str, float]) -> list[str]:
    """Backend names in the order to start them: the slowest first (ties by name)."""
    return sorted(costs, key=lambda name: (-costs[name], name))


def harness_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "harness", *args]


def _child_env(*, one_thread: bool) -> dict[str, str]:
    """A step's environment: unbuffered output; one torch thread for conformance workers.

    The bench is left at the user's setting (or torch's default), as a plain
    ``attn-harness bench`` is, so their times compare.
    """
    env = dict(os.environ)
    if one_thread:
        env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


# -- progress with content -----------------------------------------------------------


@dataclass(frozen=True)
class Done:
    """How far a step has got: ``done`` of ``total``, and its own estimate of the rest."""

    done: int
    total: int
    left_s: float | None = None  # seconds, as the step itself estimated them

    @classmethod
    def of(cls, progress: Progress | None) -> Done | None:
        """From what a step last wrote to its progress file, if anything."""
        return None if progress is None else cls(progress.done, progress.total, progress.left_s)

    def estimate(self, elapsed: float) -> str | None:
        """The step's estimate, else one from the pace so far (none before a quarter)."""
        from harness.conformance.progress import seconds_left

        seconds = self.left_s
        if seconds is None:
            seconds = seconds_left(elapsed, self.done, self.total)
        if seconds is None:
            return None
        return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.0f} min"


def _progress(job: ConformanceJob) -> Done | None:
    return None if job.child is None else Done.of(job.child.progress())


def _job_text(name: str, done: Done | None, elapsed: float, first: bool, detail: int) -> str:
    """One job in a heartbeat, at a level of detail: 2 all, 1 no estimate, 0 name cut too."""
    if detail == 0 and len(name) > 12:
        name = name[:11] + "~"
    if done is None:
        return f"{name} {elapsed:.0f} s"
    text = f"{name} {done.done}/{done.total}"
    left = done.estimate(elapsed) if detail == 2 else None
    return text + (f" (~{left}{' left' if first else ''})" if left else "")


def heartbeat(
    phase: str,
    running: Sequence[tuple[str, Done | None, float]],
    waiting: int = 0,
    width: int = WIDTH - 10,
) -> str:
    """``conformance: triton 12/49 (~4 min left), flex 30/49 (~2 min); 2 waiting``.

    ``running``: (name, progress or None, seconds running). Within ``width``
    columns: estimates are dropped first, then long names cut, then the last
    jobs counted as ``+N more``.
    """
    tail = f"; {waiting} waiting" if waiting else ""
    for detail in (2, 1, 0):
        jobs = [_job_text(n, d, e, i == 0, detail) for i, (n, d, e) in enumerate(running)]
        line = f"{phase}: {', '.join(jobs)}{tail}"
        if len(line) <= width:
            return line
    for keep in range(len(jobs) - 1, 0, -1):
        line = f"{phase}: {', '.join(jobs[:keep])}, +{len(jobs) - keep} more{tail}"
        if len(line) <= width:
            return line
    return line[: width - 3] + "..."


def run_conformance_jobs(
    jobs: list[ConformanceJob],
    *,
    workers: int,
    profile: str,
    device: str,
    say: Callable[[str], None],
    workers_per_job: int = 1,
    shard: str | None = None,
) -> None:
    """Run ``jobs`` at most ``workers`` at a time, saying each verdict as it arrives; each
    job spreads its tests over ``workers_per_job`` processes (``conform --workers``) and
    runs only ``shard``'s share of them (``K/N``) when given."""
    waiting = list(jobs)
    running: list[ConformanceJob] = []
    last_beat = time.monotonic()
    progress_dir = tempfile.TemporaryDirectory(prefix="attn-harness-run-")
    try:
        while waiting or running:
            while waiting and len(running) < workers:
                job = waiting.pop(0)
                handle = job.log.open("wb")
                job.started = time.monotonic()
                job.child = Child(
                    harness_command(
                        "conform",
                        "--backend",
                        job.backend,
                        "--profile",
                        profile,
                        "--device",
                        device,
                        "--junitxml",
                        str(job.junit),
                        "--workers",
                        str(workers_per_job),
                        *(["--shard", shard] if shard else []),
                    ),
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    env=_child_env(one_thread=True),
                    progress=Path(progress_dir.name) / f"{file_stem(job.backend)}.jsonl",
                )
                handle.close()
                running.append(job)
                say(f"conformance: {job.backend}: started")
            time.sleep(0.5)
            for job in list(running):
                assert job.child is not None
                code = job.child.poll()
                if code is None:
                    continue
                job.code, job.seconds = code, time.monotonic() - job.started
                running.remove(job)
                verdict = job.verdict.removeprefix("attn-harness conform: ")
                say(f"conformance: {job.backend}: {verdict}")
            live = _live(say)
            every = LIVE_S if live is not None else HEARTBEAT_S
            if running and time.monotonic() - last_beat >= every:
                last_beat = time.monotonic()
                now = time.monotonic()
                line = heartbeat(
                    "conformance",
                    [(j.backend, _progress(j), now - j.started) for j in running],
                    len(waiting),
                )
                (live or say)(line)
    finally:
        for job in running:
            if job.child is not None:
                job.child.stop(first=signal.SIGTERM, grace_s=STOP_GRACE_S)
        progress_dir.cleanup()


def run_bench(
    backends: Sequence[str],
    workloads: Sequence[str],
    out: Path,
    log: Path,
    device: str,
    say: Callable[[str], None],
    shard: str | None = None,
) -> int:
    """The benchmark workloads as ``attn-harness bench`` runs them (``shard``'s share of the
    cases, when given); its output goes to ``log``.

    Its table, its progress and any backend's prints land in ``log``; the
    heartbeat reads the case count from the bench's progress file. A results file left by an
    earlier run is removed first, so the closing verdict never reads a stale one.
    """
    from harness.core.threads import timing_threads

    threads, why = timing_threads()
    say(f"bench: torch threads {threads} ({why}), as attn-harness bench on its own times here")
    args = ["bench", "--device", device, "--out", str(out)]
    for name in backends:
        args += ["--backend", name]
    for name in workloads:
        args += ["--workload", name]
    if shard:
        args += ["--shard", shard]
    out.unlink(missing_ok=True)
    started = last_beat = time.monotonic()
    with log.open("wb") as handle, tempfile.TemporaryDirectory(prefix="attn-harness-run-") as tmp:
        child = Child(
            harness_command(*args),
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=_child_env(one_thread=False),
            progress=Path(tmp) / "bench.jsonl",
        )
        try:
            while child.wait(timeout=0.5) is None:
                live = _live(say)
                every = LIVE_S if live is not None else HEARTBEAT_S
                if time.monotonic() - last_beat >= every:
                    last_beat = time.monotonic()
                    elapsed = last_beat - started
                    done = Done.of(child.progress())
                    line = (
                        heartbeat("bench", [("cases", done, elapsed)])
                        if done is not None
                        else f"bench: running, {elapsed:.0f} s"
                    )
                    (live or say)(line)
        finally:
            code = child.stop(first=signal.SIGTERM, grace_s=STOP_GRACE_S)
    return int(code)


def bench_summary(results: Path, log: Path, code: int) -> str:
    """``passed (100 PASSED, 20 UNSUPPORTED), 3 flags: ...`` from the results file, or why none.

    The flags counted are every flag the results file holds (the run's and each
    case's), as ``attn-harness bench`` counts them on its own closing line.
    """
    from harness.bench.table import bench_verdict
    from harness.results.store import ResultsError, load_results

    try:
        verdict = bench_verdict(load_results(results))
    except (ResultsError, OSError):
        said = last_line(log, "attn-harness bench:") or last_line(log, "bench:")
        why = f": {said}" if said else f" (see {log})"
        return f"FAILED: no results (exit {code}){why}"
    if code != 0 and verdict.startswith("passed"):
        verdict += f" (exit {code})"
    return verdict


def closing_verdict(failed: Sequence[str], bench_code: int | None, results: Path, log: Path) -> str:
    """The main job's last line: conformance, then the bench with its flags counted.

    ``failed``: backends whose conformance failed; ``bench_code``: the bench's
    exit code, ``None`` when the bench did not run (``--no-bench``).
    """
    line = "main job: " + (
        f"conformance FAILED for {', '.join(failed)}" if failed else "conformance passed"
    )
    if bench_code is not None:
        line += f"; bench {bench_summary(results, log, bench_code)}"
    return line


def last_line(path: Path, prefix: str) -> str | None:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    found = [line for line in lines if line.startswith(prefix)]
    return found[-1] if found else None


class Printer:
    """Lines prefixed with the seconds since the job started; a live line on a terminal.

    ``live(text)`` redraws one transient line in place (only on a terminal);
    the next ordinary line replaces it.
    """

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.started = time.monotonic()
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self._live_shown = False

    def _prefix(self) -> str:
        return f"[{time.monotonic() - self.started:5.0f} s] "

    def __call__(self, line: str) -> None:
        if self._live_shown:
            self.stream.write("\r\x1b[K")
            self._live_shown = False
        print(f"{self._prefix()}{line}", file=self.stream, flush=True)

    def live(self, line: str) -> None:
        if not self.tty:
            return
        self.stream.write(f"\r\x1b[K{(self._prefix() + line)[:WIDTH]}")
        self.stream.flush()
        self._live_shown = True


def _live(say: Callable[[str], None]) -> Callable[[str], None] | None:
    """``say``'s live line, when it is a ``Printer`` on a terminal."""
    return say.live if isinstance(say, Printer) and say.tty else None


def printer(stream: IO[str]) -> Printer:
    return Printer(stream)
