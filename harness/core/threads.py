"""torch's intra-op thread count: fixed for a block, and one for small CPU steps."""

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
