"""argparse value types shared by every command line.

The ``attn-harness`` commands and the module entry points below the CLI layer
(the report's browser check, the GPU script, the dist worker) check their
numbers with these, so the same mistake gets the same one-line message and
exit status 2 everywhere.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def _number(text: str, kind: type[int] | type[float]) -> float:
    try:
        return kind(text)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {noun}, got {text!r}") from None


def at_least(low: int) -> Callable[[str], int]:
    """An integer ``>= low`` (``at_least(0)`` for counts that may be zero)."""

    def parse(text: str) -> int:
        value = int(_number(text, int))
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"  # argparse names the type in its messages
    return parse


positive_int = at_least(1)
"""An integer ``>= 1``: a count of steps, ranks, sequences, repeats."""


def positive_float(text: str) -> float:
    """A number ``> 0`` (NaN refused): a duration in seconds, a size factor."""
    value = _number(text, float)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def fraction(text: str) -> float:
    """A relative change such as 0.05 for 5%: ``> 0`` and below 10 (1000%)."""
    value = _number(text, float)
    if not 0.0 < value < 10.0:
        raise argparse.ArgumentTypeError(f"must be a fraction > 0 such as 0.05, got {text}")
    return value
