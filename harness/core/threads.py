"""torch's intra-op thread count: fixed for a block, one for small CPU steps, and the bench's.

Every bench run times at one rule (``timing_threads``), whether started on
its own (``attn-harness bench``) or by the main job (``attn-harness run``,
which passes its environment through unchanged for the bench), so a
main-job bench and a plain one on the same machine compare. Conformance and
``check`` run small steps on one thread (``small_step_threads``): their
speed is not measured, and a busy machine makes more threads slower.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def fixed_threads(threads: int | None) -> Iterator[int]:
    """Run with ``threads`` intra-op threads (default: the current count); restore after."""
    before = torch.get_num_threads()
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def small_step_threads() -> int | None:
    """Threads for checking small steps on the CPU: 1, unless ``OMP_NUM_THREADS`` is set.

    Conformance steps are small: intra-op threads save little on them, and on a
    machine whose cores are busy they oversubscribe it, which can make a run
    several times slower. ``None`` (leave torch's count) when the user chose one.
    """
    return None if "OMP_NUM_THREADS" in os.environ else 1


def timing_threads(requested: int | None = None) -> tuple[int, str]:
    """The intra-op threads a bench times at, and why (shown and stored with its results).

    ``--threads N`` first; else torch's count, which torch takes from
    ``OMP_NUM_THREADS`` when that is set, else its default (one per core).
    """
    if requested is not None:
        return requested, "--threads"
    if "OMP_NUM_THREADS" in os.environ:
        return torch.get_num_threads(), f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"
    return torch.get_num_threads(), "torch's default"
