"""The main job: conformance of every backend, the benchmarks, then the report, in one command.

Conformance draws are small and single-threaded, so the backends are checked
in parallel worker processes, one backend per process, as many at a time as
the machine has CPUs, the slowest first (longest-processing-time-first, so
the last to finish is a short one). How slow a backend is comes from a probe:
one small mixed step, timed once warm (a Triton kernel interpreted on the
CPU takes 0.3 s, an eager FlexAttention 30 ms, the rest about 5 ms). The benchmarks
run after conformance, alone, so no conformance worker steals their cores.
Each step writes its files into the run folder as it finishes (a JUnit
file per backend, the results file, then the report), atomically, so an
interrupted run keeps what it completed and never a half-written file.

Every step is a subprocess of the installed ``attn-harness`` (``python -m
harness``): the same commands a user would type, and one backend's crash
or hang cannot take the others with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.core.registry import BackendEntry

HEARTBEAT_S = 30.0


@dataclass
class ConformanceJob:
    backend: str
    junit: Path
    log: Path
    started: float = 0.0
    seconds: float = 0.0
    code: int | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

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


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_conformance_jobs(
    jobs: list[ConformanceJob],
    *,
    workers: int,
    profile: str,
    device: str,
    say: Callable[[str], None],
) -> None:
    """Run ``jobs`` at most ``workers`` at a time, saying each verdict as it arrives."""
    waiting = list(jobs)
    running: list[ConformanceJob] = []
    last_beat = time.monotonic()
    try:
        while waiting or running:
            while waiting and len(running) < workers:
                job = waiting.pop(0)
                handle = job.log.open("wb")
                job.started = time.monotonic()
                job.process = subprocess.Popen(
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
                    ),
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    env=_child_env(),
                )
                handle.close()
                running.append(job)
                say(f"conformance: {job.backend}: started")
            time.sleep(0.5)
            for job in list(running):
                assert job.process is not None
                code = job.process.poll()
                if code is None:
                    continue
                job.code, job.seconds = code, time.monotonic() - job.started
                running.remove(job)
                verdict = job.verdict.removeprefix("attn-harness conform: ")
                say(f"conformance: {job.backend}: {verdict}")
            if running and time.monotonic() - last_beat >= HEARTBEAT_S:
                last_beat = time.monotonic()
                busy = ", ".join(
                    f"{j.backend} {time.monotonic() - j.started:.0f} s" for j in running
                )
                say(f"conformance: running {busy}; {len(waiting)} waiting")
    finally:
        for job in running:
            if job.process is not None and job.process.poll() is None:
                job.process.terminate()
                job.process.wait()


def run_bench(
    backends: Sequence[str],
    workloads: Sequence[str],
    out: Path,
    log: Path,
    device: str,
    say: Callable[[str], None],
) -> int:
    """The benchmark workloads as ``attn-harness bench`` runs them; its table goes to ``log``."""
    args = ["bench", "--device", device, "--out", str(out)]
    for name in backends:
        args += ["--backend", name]
    for name in workloads:
        args += ["--workload", name]
    if not sys.stderr.isatty():
        args.append("--no-progress")
    started = time.monotonic()
    with log.open("wb") as handle:
        process = subprocess.Popen(
            harness_command(*args), stdout=handle, stderr=None, env=_child_env()
        )
        try:
            while process.poll() is None:
                try:
                    process.wait(timeout=HEARTBEAT_S)
                except subprocess.TimeoutExpired:
                    if not sys.stderr.isatty():
                        say(f"bench: running, {time.monotonic() - started:.0f} s")
        finally:
            if process.poll() is None:
                process.terminate()
                process.wait()
    return int(process.returncode)


def last_line(path: Path, prefix: str) -> str | None:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    found = [line for line in lines if line.startswith(prefix)]
    return found[-1] if found else None


def printer(stream: IO[str]) -> Callable[[str], None]:
    started = time.monotonic()

    def say(line: str) -> None:
        print(f"[{time.monotonic() - started:5.0f} s] {line}", file=stream, flush=True)

    return say
