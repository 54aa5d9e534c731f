"""Joining the DP group: the torch.distributed backend, the device, dying with the parent."""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import sys

import torch
import torch.distributed as dist

PARENT_ENV = "ATTN_HARNESS_DIST_PARENT"
"""Set by the launcher to its pid: a rank whose launcher is gone ends itself."""
INIT_ENV = "ATTN_HARNESS_DIST_INIT"
"""The launcher's rendezvous (``store://HOST:PORT``); torchrun's ``env://`` when unset."""
GROUP_PREFIX = "group/"
"""The ranks' keys in the launcher's store (the launchers keep theirs under ``launch/``)."""


def dist_backend(choice: str, device: str, ranks_here: int) -> str:
    """NCCL where every rank of this host (``ranks_here``) has a GPU of its own, gloo
    otherwise. Across hosts every host must choose alike: hosts with fewer GPUs than
    ranks name ``--dist-backend``."""
    if choice != "auto":
        return choice
    return "nccl" if device == "cuda" and _gpus() >= ranks_here else "gloo"


def ranks_on_this_host(dp_size: int) -> int:
    """``LOCAL_WORLD_SIZE``, as the launcher and torchrun set it; else every rank is here."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", dp_size))


def local_index(rank: int) -> int:
    """``LOCAL_RANK``: this rank's place among its host's ranks (which GPU it takes)."""
    return int(os.environ.get("LOCAL_RANK", rank))


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def group_problem(choice: str, device: str, ranks_here: int) -> str | None:
    """Why this host's ranks cannot join as asked (checked before any starts), or None."""
    if device.startswith("cuda") and _gpus() == 0:
        return f"--device {device}: no CUDA device is visible"
    if dist_backend(choice, device, ranks_here) == "nccl":
        if device != "cuda":
            return f"NCCL needs --device cuda (one GPU per rank), not {device!r}"
        if _gpus() < ranks_here:
            return (
                f"NCCL needs a GPU per rank: {_gpus()} visible for this host's {ranks_here} ranks"
            )
    return None


def rank_device(device: str, index: int) -> str:
    """``cuda`` spreads a host's ranks (by ``local_index``) over its visible GPUs; ``cuda:N``
    or ``cpu`` is taken as given."""
    if device == "cuda" and _gpus() > 1:
        return f"cuda:{index % _gpus()}"
    return device


def join_group(choice: str, device: str, rank: int, dp_size: int, timeout: float) -> None:
    """``init_process_group`` through the launchers' store, or torchrun's ``env://``."""
    backend = dist_backend(choice, device, ranks_on_this_host(dp_size))
    if backend == "nccl":  # object collectives run on the current device
        torch.cuda.set_device(local_index(rank) % _gpus())
    patience = datetime.timedelta(seconds=timeout)
    init = os.environ.get(INIT_ENV, "env://")
    if not init.startswith("store://"):
        dist.init_process_group(
            backend, init_method=init, rank=rank, world_size=dp_size, timeout=patience
        )
        return
    host, _, port = init.removeprefix("store://").rpartition(":")
    store = dist.TCPStore(host.strip("[]"), int(port), is_master=False, timeout=patience)
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(GROUP_PREFIX, store),
        rank=rank,
        world_size=dp_size,
        timeout=patience,
    )


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this rank when its launcher dies, so none outlives it.

    The launcher kills its ranks itself on every way out it can see; this
    covers the one it cannot: being killed with SIGKILL. Under torchrun (no
    launcher pid in the environment) nothing changes.
    """
    parent = os.environ.get(PARENT_ENV)
    if parent is None or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != int(parent):  # the launcher died before the request took hold
        os._exit(1)
