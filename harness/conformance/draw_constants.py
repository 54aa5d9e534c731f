"""Hypothesis's pool of source constants, replaced by one fixed pool of kernel boundaries.

Hypothesis (6.131 on) sometimes draws a number found in the source of the
"local" modules imported so far. Which modules are imported when a test
draws depends on which tests ran before it in that process, so a
derandomized ``ci`` test drew different examples alone, after others, or in a
pytest-xdist worker; none from an installed wheel (site-packages is not
"local"); and different ones after any edit that added or removed a number
anywhere in the imported code, a docstring's example included.

``freeze_pool`` replaces that moving pool with ``kernel_boundaries()``: the
numbers attention kernels break at (powers of two and their neighbours,
block and split sizes, the finite sentinels and the low-precision maxima),
written here once. Every process of a run then draws the same examples for
a test whatever ran before it and whatever the sources say: a run's draws
depend on the test, its profile and the hypothesis version alone. It
reaches into hypothesis internals (there is no setting for this); on a
hypothesis without them it changes nothing and says why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

POWER_OF_TWO_NEIGHBOURS = frozenset(n for k in range(16) for n in (2**k - 1, 2**k, 2**k + 1))
"""1 .. 65537 as 2^k - 1, 2^k, 2^k + 1: page and block sizes, split boundaries (256 keys),
tile edges, the int16 limit (32768); hypothesis's own pool starts at 2^16."""
KERNEL_FLOATS = frozenset(
    {
        -1e4,
        -3e4,
        -5e4,
        -1e9,
        -1e30,
        -3.4e38,  # finite "minus infinity" sentinels kernels start a running max at
        448.0,
        57344.0,
        65504.0,  # fp8 e4m3, fp8 e5m2 and fp16 maxima
        30.0,
        50.0,  # the soft-caps models ship with
    }
)
"""Finite sentinels, low-precision maxima and common soft-caps."""


def kernel_boundaries() -> Any:
    """The fixed pool as hypothesis's ``Constants`` (signed: offsets go both ways)."""
    from hypothesis.internal.constants_ast import Constants

    integers = set(POWER_OF_TWO_NEIGHBOURS) | {-n for n in POWER_OF_TWO_NEIGHBOURS}
    floats = set(KERNEL_FLOATS) | {-x for x in KERNEL_FLOATS}
    return Constants(integers=integers, floats=floats)


def freeze_pool() -> Callable[[], None] | str:
    """Make every draw of this process see the fixed pool; returns the undo, or why not."""
    try:
        from hypothesis.internal.conjecture import providers

        original = providers._get_local_constants
        pool = kernel_boundaries()
    except (ImportError, AttributeError) as exc:
        return f"hypothesis's constant pool left as it is ({type(exc).__name__}: {exc})"
    providers.CONSTANTS_CACHE.cache.clear()  # filtered views of the pool it had
    providers._get_local_constants = lambda: pool

    def undo() -> None:
        providers._get_local_constants = original
        providers.CONSTANTS_CACHE.cache.clear()

    return undo
