"""The environment fingerprint stored with every run: what produced these numbers.

Two runs compare only if their fingerprints do: python, torch, triton,
device and driver, CPU model, thread count, and the git commit (with a
dirty flag) of the harness checkout. Nothing here imports triton (reading
its installed version is enough) or needs a GPU; every probe that can fail
(git, nvidia-smi) gives ``None`` instead of an error.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run(args: list[str], cwd: Path | None = None) -> str | None:
    try:
        done = subprocess.run(
            args, cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def git_state(path: Path = REPO_ROOT) -> dict[str, Any]:
    """Commit sha and dirty flag (tracked files changed) of the checkout at ``path``.

    Only when ``path`` is the top of a work tree: an installed copy inside
    some other repository's tree (a venv in a checkout) reports no commit.
    """
    top = _run(["git", "rev-parse", "--show-toplevel"], cwd=path)
    sha = _run(["git", "rev-parse", "HEAD"], cwd=path)
    if sha is None or top is None or Path(top).resolve() != path.resolve():
        return {"sha": None, "dirty": None}
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=path)
    return {"sha": sha, "dirty": None if status is None else bool(status)}


def cpus_allowed() -> int | None:
    """CPUs this process may run on (its affinity mask), which a container or ``taskset``
    can make fewer than ``cpu_count``; ``None`` where the OS does not say."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def usable_cpus() -> int:
    """CPUs to share out among worker processes: the affinity mask, else the CPU count."""
    return cpus_allowed() or os.cpu_count() or 1


def _gpu(device: str) -> dict[str, Any]:
    dev = torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    driver = _run(
        ["nvidia-smi", f"--id={index}", "--query-gpu=driver_version", "--format=csv,noheader"]
    )
    return {
        "device_name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "memory_bytes": int(props.total_memory),
        "l2_cache_bytes": int(getattr(props, "L2_cache_size", 0)) or None,
        "multiprocessors": int(props.multi_processor_count),
        "driver": driver,
        "cuda_runtime": torch.version.cuda,
    }


def fingerprint(device: str = "cpu", *, threads: int | None = None) -> dict[str, Any]:
    """Everything that decides what a timing means, as JSON-ready values."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "numpy": _version("numpy"),
        "attn_harness": _version("attn-harness"),
        "platform": platform.platform(),
        "hostname": platform.node(),
        "device": torch.device(device).type,
        "device_name": cpu_model(),
        "driver": None,
        "cuda_runtime": None,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_allowed": cpus_allowed(),
        "threads": threads if threads is not None else torch.get_num_threads(),
        "git": git_state(),
    }
    if torch.device(device).type == "cuda":
        info.update(_gpu(device))
    return info
