"""The prepared GPU run: environment, conformance, graph-mode check and benchmarks, in one call.

    PYTHONPATH=. python3 -m harness.gpu OUT_DIR [--backend NAME ...] [--quick] [--archive F]
        [--pair-rev REV]

Made for a lent GPU machine (torch 2.11+, triton, nothing installable, the
project not installed) whose time is short and counted: the whole run stays
under ``FULL_TOTAL_S`` (``--quick``: ``QUICK_TOTAL_S``), every step is a
subprocess with this checkout on ``PYTHONPATH`` and the pytest plugin loaded
with ``-p``, under its own time limit (cut to what the total leaves), so one
hung or slow step cannot eat the lease. Steps, in order:

1. environment (in this process): python, torch, CUDA, cuDNN, which SDPA
   kernels are enabled, triton; then the backends asked for (default
   ``DEFAULT_BACKENDS``, and each of ``ENGINE_BACKENDS`` whose engine is
   installed) are looked up, and one that is not registered or
   cannot be imported is skipped with a line saying why;
2. conformance on CUDA (``ci`` profile, ``kill`` with ``--quick``), one
   pytest run per backend (``conformance-NAME``), its tests spread over up to
   ``GPU_CONFORMANCE_WORKERS`` pytest-xdist processes, each with an equal share
   of the time left to conformance (time one leaves unused passes on), the
   production-shape tests first, since they are what a GPU run is for. At
   its limit a run gets SIGINT, so pytest still writes the JUnit report of
   what ran. Where SDPA may pick cuDNN attention, ``sdpa`` runs once more
   with it off (``conformance-sdpa-no-cudnn``, kill profile), so a failure
   only cuDNN shows is told apart;
3. the graph-mode check (``harness.gpu.graph_check``): no host synchronisation
   in ``forward``, and a CUDA-graph replay that matches eager and the oracle;
4. benchmarks (``harness.gpu.bench_step``): the GPU sizes of ``targets``
   (the optimized backends' speed targets), ``decode-sweep`` and
   ``prefill-sweep`` (no prefill sweep with ``--quick``), every backend
   beside the contiguous SDPA peer, each case checked against the oracle
   first, the peer's and ``sdpa``'s SDPA kernel pinned and recorded per
   case. Cases of the two workloads alternate and the results file is
   rewritten after each one, so a step cut short keeps every case it
   finished. The bench measures the device ceilings (copy bandwidth, bf16
   matmul) first and stores them;
5. with ``--pair-rev REV`` only: each backend against itself at git
   revision ``REV`` in alternating rounds (``harness.gpu.pair_step``:
   ``attn-harness ab`` on the decode sweep, ``pair-NAME``), the run's total
   budget grown by each step's limit.

Logs, the JUnit reports, the graph check's JSON and the results JSON go to
``OUT_DIR`` (made absolute); the summary is printed last, built from
whatever files exist, so a step that failed or ran out of time still leaves
the others' results. ``--archive FILE`` also packs ``OUT_DIR`` into one
``.tar.gz``, for bringing a run back as a single file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.gpu.bench_step import bench_command
from harness.gpu.pair_step import PAIR_LIMIT_S, pair_command, pair_lines
from harness.processes import supervisor

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BACKENDS = ("triton", "sdpa", "flex")
ENGINE_BACKENDS = ("sglang-triton", "vllm-triton")
"""Engines' kernels, run by default only where their engine is installed (the peers a
kernel author compares with on the GPU)."""
FULL_TOTAL_S, QUICK_TOTAL_S = 450.0, 220.0  # the lease's budget is 15 min, tries included
RESERVE_S = 10.0  # kept back from every step for the summary
MIN_STEP_S = 20.0  # a step with less than this left is skipped, not started
INTERRUPT_GRACE_S = 15.0  # after SIGINT, how long a step gets to write its reports


@dataclass(frozen=True)
class Limits:
    conformance: float
    graph: float
    bench: float


FULL_LIMITS = Limits(conformance=170.0, graph=70.0, bench=170.0)
QUICK_LIMITS = Limits(conformance=70.0, graph=45.0, bench=80.0)


@dataclass
class StepResult:
    name: str
    rc: int | None  # None: not run
    seconds: float = 0.0
    limit: float = 0.0
    note: str = ""

    @property
    def timed_out(self) -> bool:
        return self.rc == 124


class Clock:
    """The run's total budget: each step gets its own limit or what is left, whichever is less."""

    def __init__(self, total: float) -> None:
        self.total = total
        self.start = time.monotonic()

    def left(self) -> float:
        return self.total - (time.monotonic() - self.start)

    def limit(self, wanted: float) -> float:
        return min(wanted, self.left() - RESERVE_S)


def _pythonpath() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


def _run(name: str, command: list[str], out: Path, timeout: float) -> StepResult:
    """Run one step, its output teed to ``OUT_DIR/<name>.log``.

    At ``timeout`` the step's process group gets SIGINT (pytest then writes
    its reports of what ran), and SIGKILL ``INTERRUPT_GRACE_S`` later if it
    is still there; such a step's exit code is 124.
    """
    with open(out / f"{name}.log", "w") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        done = supervisor.run(
            command,
            timeout_s=timeout,
            first=signal.SIGINT,
            grace_s=INTERRUPT_GRACE_S,
            interruptible=True,  # SIGINT reaches pytest even from a background shell
            cwd=ROOT,
            env=_pythonpath(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        if done.timed_out:
            log.write(f"\n[gpu_check] {name} stopped after {timeout:.0f} s\n")
    return StepResult(name, 124 if done.timed_out else done.code, done.seconds, timeout)


def _environment(out: Path) -> str:
    import torch

    lines = [f"python {sys.version.split()[0]}, torch {torch.__version__}"]
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        lines.append(
            f"device {props.name}, {props.total_memory / 2**30:.0f} GiB, "
            f"{props.multi_processor_count} SMs, sm_{props.major}{props.minor}, "
            f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
        )
    else:
        lines.append("no CUDA device visible")
    sdpa = torch.backends.cuda
    flags = {
        "flash": sdpa.flash_sdp_enabled(),
        "mem_efficient": sdpa.mem_efficient_sdp_enabled(),
        "cudnn": getattr(sdpa, "cudnn_sdp_enabled", lambda: None)(),
        "math": sdpa.math_sdp_enabled(),
    }
    available = getattr(sdpa, "is_flash_attention_available", None)
    built = f", flash kernels built: {available()}" if available is not None else ""
    lines.append(
        "SDPA enabled: "
        + ", ".join(f"{k} {'on' if v else 'off'}" for k, v in flags.items())
        + built
    )
    try:
        import triton

        lines.append(f"triton {triton.__version__}")
    except ImportError:
        lines.append("triton not installed")
    text = "\n".join(lines)
    (out / "environment.txt").write_text(text + "\n")
    return text


def default_backends() -> list[str]:
    """``DEFAULT_BACKENDS``, and the engine kernels that claim CUDA here (installed)."""
    from harness.core.registry import default_registry

    registry = default_registry()
    engines = [n for n in ENGINE_BACKENDS if "cuda" in registry.resolve(n).capabilities.devices]
    return [*DEFAULT_BACKENDS, *engines]


def available_backends(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(names to run, lines about those skipped)``: unknown or unloadable ones are skipped."""
    from harness.core.registry import default_registry

    registry = default_registry()
    found: list[str] = []
    skipped: list[str] = []
    for name in names:
        try:
            with contextlib.redirect_stdout(sys.stderr):
                registry.resolve(name)
        except KeyError as exc:
            message = exc.args[0] if exc.args else str(exc)
            skipped.append(f"skip {name}: not registered ({message})")
            continue
        except Exception as exc:  # BackendLoadError, or its module fails to import
            skipped.append(f"skip {name}: cannot be loaded ({type(exc).__name__}: {exc})")
            continue
        found.append(name)
    return found, skipped


# -- conformance -------------------------------------------------------------------


def _conformance_modules() -> list[str]:
    """The suite's test modules, production shapes first (a run cut short has them)."""
    folder = ROOT / "suites" / "conformance"
    names = sorted(p.stem for p in folder.glob("test_*.py"))
    names.sort(key=lambda n: n != "test_production_shapes")
    return [f"suites.conformance.{n}" for n in names]


def _shrink_limit_supported() -> bool:
    try:
        from hypothesis.internal.conjecture import engine
    except ImportError:
        return False
    return hasattr(engine, "MAX_SHRINKING_SECONDS")


def file_label(backend: str) -> str:
    """A backend name or spec as a file-name part (a spec may hold ``/`` and ``:``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", backend).strip("_") or "backend"


def conformance_command(
    out: Path,
    backend: str,
    profile: str,
    *,
    label: str | None = None,
    cudnn_off: bool = False,
    device: str = "cuda",
    workers: int = 1,
) -> list[str]:
    """One backend's conformance run, its JUnit report ``conformance-LABEL.xml`` in ``out``.

    ``cudnn_off`` loads ``harness.gpu.sdpa_cudnn_off``: SDPA without cuDNN attention;
    ``workers`` pytest-xdist processes share the tests (the float64 oracle runs on the
    CPU beside the kernel, so the machine's cores are the run's speed).
    """
    command = [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        *_conformance_modules(),
        "-q",
        "-p",
        "attn_harness_pytest",
        "-p",
        "no:cacheprovider",
        "--conformance-device",
        device,
        "--conformance-profile",
        profile,
        "--example-time-limit",
        "60",
        f"--junitxml={out / f'conformance-{file_label(label or backend)}.xml'}",
        "--backend",
        backend,
    ]
    if cudnn_off:
        command += ["-p", "harness.gpu.sdpa_cudnn_off"]
    if workers > 1:  # `load` hands tests out in order: production shapes still come first
        command += ["-p", "xdist", "-n", str(workers), "--dist", "load"]
    if _shrink_limit_supported():  # a failure's shrinking must not eat the step
        command += ["--shrink-time-limit", "20"]
    return command


def _conformance_counts(report: Path) -> dict[str, Counter[str]]:
    """Per backend, the JUnit report's passed / failed / skipped tests; ``{}`` if unreadable."""
    counts: dict[str, Counter[str]] = {}
    if not report.exists():
        return counts
    try:
        cases = list(ET.parse(report).iter("testcase"))
    except ET.ParseError:
        return counts
    for case in cases:
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        backend = props.get("backend") or "(no backend)"
        outcome = (
            "failed"
            if case.find("failure") is not None or case.find("error") is not None
            else "skipped"
            if case.find("skipped") is not None
            else "passed"
        )
        counts.setdefault(backend, Counter())[outcome] += 1
    return counts


# -- the summary -------------------------------------------------------------------


def _step_line(step: StepResult) -> str:
    if step.rc is None:
        return f"not run ({step.note})"
    state = f"stopped at its {step.limit:.0f} s limit" if step.timed_out else f"exit {step.rc}"
    return f"{state}, {step.seconds:.0f} s"


def _graph_lines(path: Path) -> list[str]:
    if not path.exists():
        return ["  no graph-check.json; see graph-check.log"]
    try:
        data = json.loads(path.read_text())
        return [f"  {b['status']} {b['backend']}: {b['reason']}" for b in data["backends"]]
    except (ValueError, KeyError, TypeError) as exc:
        return [f"  graph-check.json unreadable: {exc}"]


def _bench_text(path: Path) -> str:
    if not path.exists():
        return "  no results file; see bench.log"
    from harness.bench.table import render
    from harness.results.store import ResultsError, load_results

    try:
        record = load_results(path)
    except (ResultsError, OSError) as exc:
        return f"  results file unreadable: {exc}"
    if not record.partial:
        return render(record)
    cut = "  PARTIAL: the step stopped before its last case (bench.log); the cases shown are whole"
    return f"{cut}\n{render(record)}"


def summary(
    out: Path,
    env_text: str,
    skipped: Sequence[str],
    conformance: Sequence[tuple[str, StepResult]],
    steps: Sequence[StepResult],
    profile: str,
    device: str = "cuda",
) -> str:
    """The report printed last, read back from the files in ``out``.

    ``steps``: the graph check, the bench, then any paired steps (``pair-LABEL``).
    """
    graph, bench, *pairs = steps
    lines = [env_text, *skipped, "", f"conformance ({profile} profile, {device}):"]
    for backend, step in conformance:
        lines.append(f"  {backend}: {_step_line(step)}")
        report = out / f"conformance-{file_label(backend)}.xml"
        for name, counts in sorted(_conformance_counts(report).items()):
            lines.append(
                f"    {name:12} passed {counts['passed']:3}  failed {counts['failed']:3}  "
                f"skipped {counts['skipped']:3}"
            )
    if not conformance:
        lines.append("  not run (no backend to check)")
    lines += ["", f"graph-mode check ({device}): {_step_line(graph)}"]
    lines += _graph_lines(out / "graph-check.json")
    bench_file = out / f"bench-{device}.json"
    lines += ["", f"bench ({device}): {_step_line(bench)}", _bench_text(bench_file)]
    for pair in pairs:
        lines += ["", f"{pair.name} ({device}): {_step_line(pair)}"]
        lines += pair_lines(out / f"{pair.name}.json")
    lines += ["", f"{'step':28} {'result':36} log"]
    for step in [s for _, s in conformance] + list(steps):
        lines.append(f"{step.name:28} {_step_line(step):36} {step.name}.log")
    return "\n".join(lines)


def archive(out: Path, target: Path) -> Path:
    """``out`` packed into ``target`` (``.tar.gz``), written beside it first, then renamed."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    skip = {partial.resolve(), target.resolve()}  # the archive may be asked for inside out

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if (out.parent / info.name).resolve() in skip else info

    with tarfile.open(partial, "w:gz") as tar:
        tar.add(out, arcname=out.name, filter=keep)
    partial.replace(target)
    return target


# -- the run -----------------------------------------------------------------------


CUDNN_OFF_LABEL = "sdpa-no-cudnn"


@dataclass(frozen=True)
class ConformanceRun:
    label: str  # the summary's name for it and its files' (conformance-LABEL.xml/.log)
    backend: str
    profile: str
    cudnn_off: bool = False
    device: str = "cuda"

    def command(self, out: Path) -> list[str]:
        return conformance_command(
            out,
            self.backend,
            self.profile,
            label=self.label,
            cudnn_off=self.cudnn_off,
            device=self.device,
            workers=conformance_workers(),
        )


GPU_CONFORMANCE_WORKERS = 4
"""At most this many conformance processes share one GPU (each holds a CUDA context)."""


def conformance_workers() -> int:
    """Workers for a conformance run here: up to ``GPU_CONFORMANCE_WORKERS``, one per usable
    CPU, and one where pytest-xdist is not installed."""
    from harness.bench.environment import usable_cpus
    from harness.conformance.workers import xdist_available

    if not xdist_available():
        return 1
    return max(1, min(GPU_CONFORMANCE_WORKERS, usable_cpus()))


def conformance_runs(
    backends: Sequence[str], profile: str, cudnn_on: bool, device: str = "cuda"
) -> list[ConformanceRun]:
    """One run per backend; then, where torch may pick cuDNN attention, ``sdpa`` again
    without it (kill profile), so a cuDNN-only failure is told apart from sdpa's own."""
    runs = [ConformanceRun(b, b, profile, device=device) for b in backends]
    if cudnn_on and "sdpa" in backends:
        runs.append(ConformanceRun(CUDNN_OFF_LABEL, "sdpa", "kill", True, device))
    return runs


def cudnn_attention_on() -> bool:
    """Whether SDPA may pick cuDNN attention here (a CUDA device, cuDNN, the flag on)."""
    import torch

    if not torch.cuda.is_available() or not torch.backends.cudnn.is_available():
        return False
    return bool(getattr(torch.backends.cuda, "cudnn_sdp_enabled", lambda: False)())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for logs and results")
    parser.add_argument(
        "--backend",
        action="append",
        default=[],
        help=f"registered name or spec (repeatable; default: {', '.join(DEFAULT_BACKENDS)}, "
        f"and {', '.join(ENGINE_BACKENDS)} where installed)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"kill profile, decode sweep only, under {QUICK_TOTAL_S:.0f} s in all",
    )
    parser.add_argument(
        "--archive", type=Path, metavar="FILE", help="also pack OUT_DIR into this .tar.gz"
    )
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cuda (default); cpu: a rehearsal of every step on the CPU (CPU workload sizes, "
        "no capture)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        metavar="S",
        help=f"the total time budget in seconds (default {FULL_TOTAL_S:.0f}, "
        f"--quick {QUICK_TOTAL_S:.0f})",
    )
    parser.add_argument(
        "--pair-rev",
        metavar="REV",
        help="also time each backend against itself at this git revision (attn-harness ab, "
        f"the decode sweep; {PAIR_LIMIT_S:.0f} s a backend, added to the budget)",
    )
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()  # steps run from the checkout, not from here
    out.mkdir(parents=True, exist_ok=True)
    backends, skipped = available_backends(args.backend or default_backends())
    default_total = QUICK_TOTAL_S if args.quick else FULL_TOTAL_S
    if args.pair_rev:
        default_total += PAIR_LIMIT_S * len(backends)
    clock = Clock(args.budget if args.budget is not None else default_total)
    limits = QUICK_LIMITS if args.quick else FULL_LIMITS
    env_text = _environment(out)
    print(env_text, flush=True)
    for line in skipped:
        print(line, flush=True)
    profile = "kill" if args.quick else "ci"
    # the speed targets' two cases (decode 64 x 8192, causal prefill 8 x 4096) beside the sweeps
    workloads = ["targets", "decode-sweep"] + ([] if args.quick else ["prefill-sweep"])

    def step(name: str, wanted: float, build: Any) -> StepResult:
        if not backends:
            return StepResult(name, None, note="no backend to check")
        limit = clock.limit(wanted)
        if limit < MIN_STEP_S:
            return StepResult(name, None, note=f"out of time ({clock.left():.0f} s left)")
        print(f"[gpu_check] {name} (limit {limit:.0f} s)", flush=True)
        return _run(name, build(limit), out, limit)

    conformance: list[tuple[str, StepResult]] = []
    conformance_end = time.monotonic() + limits.conformance
    cuda = args.device == "cuda"
    runs = conformance_runs(backends, profile, cuda and cudnn_attention_on(), args.device)
    for index, run in enumerate(runs):
        share = (conformance_end - time.monotonic()) / (len(runs) - index)
        name = f"conformance-{file_label(run.label)}"
        conformance.append((run.label, step(name, share, lambda _, r=run: r.command(out))))
    graph = step(
        "graph-check",
        limits.graph,
        lambda _: [
            sys.executable,
            "-m",
            "harness.gpu.graph_check",
            "--json",
            str(out / "graph-check.json"),
            "--device",
            args.device,
            *[arg for b in backends for arg in ("--backend", b)],
        ],
    )
    bench = step(
        "bench",
        limits.bench,
        lambda limit: bench_command(out, backends, workloads, limit, args.device),
    )
    pairs = [
        step(
            f"pair-{file_label(b)}",
            PAIR_LIMIT_S,
            lambda limit, b=b: pair_command(
                out, b, file_label(b), args.pair_rev, limit, args.device
            ),
        )
        for b in (backends if args.pair_rev else [])
    ]
    print()
    print(
        summary(out, env_text, skipped, conformance, [graph, bench, *pairs], profile, args.device)
    )
    if args.archive is not None:
        print(f"archive: {archive(out, args.archive.resolve())}")
    steps = [s for _, s in conformance] + [graph, bench, *pairs]
    return 0 if backends and all(s.rc == 0 for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
