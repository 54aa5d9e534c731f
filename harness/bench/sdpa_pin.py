"""Which SDPA kernel a timed call uses: chosen, pinned for the whole case, and recorded.

``torch.nn.functional.scaled_dot_product_attention`` picks a kernel per call
(flash, memory-efficient, cuDNN, math) by dtype, shapes, mask and version;
on sm90 with recent torch it may pick cuDNN attention, which builds a graph
per shape signature. A time whose kernel is unknown cannot be attributed, so
on CUDA the bench pins one: the first of ``PIN_ORDER`` that runs the case,
for its oracle check and its timing both, and stores its name in the case's
``sdpa_kernel``. cuDNN attention is left out of the order on purpose: its
per-shape graph builds would be timed as the backend's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TypeVar

PIN_ORDER = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
NO_KERNEL = ("No available kernel", "No viable backend")
"""How torch says the pinned kernel cannot run this call (CUDA's words, the CPU's)."""


def says_no_kernel(message: str | None) -> bool:
    return any(words in (message or "") for words in NO_KERNEL)


T = TypeVar("T")


@contextlib.contextmanager
def sdpa_pinned(name: str | None) -> Iterator[None]:
    """Only the SDPA kernel ``name`` (an ``SDPBackend`` member name) inside; None: torch's pick."""
    if name is None:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(getattr(SDPBackend, name)):
        yield


def first_kernel_that_runs(
    attempt: Callable[[], T], no_kernel: Callable[[T], bool], order: tuple[str, ...] = PIN_ORDER
) -> tuple[str, T]:
    """Run ``attempt`` under each kernel of ``order`` until one runs it; ``(kernel, result)``.

    ``no_kernel(result)`` says the attempt failed only because the pinned
    kernel cannot take the call (torch's "No available kernel"); any other
    outcome, passing or failing, is the case's result under that kernel.
    """
    if not order:
        raise ValueError("no SDPA kernel to try")
    result: T | None = None
    for name in order:
        with sdpa_pinned(name):
            result = attempt()
        if not no_kernel(result):
            return name, result
    assert result is not None
    return order[-1], result
