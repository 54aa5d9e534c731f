"""Exception types of the harness.

Every error a backend or the harness raises for bad input is a ``ValueError``,
so callers can catch one type; the subclasses let the
suites tell *why* something was rejected.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable


class Unsupported(ValueError):
    """A backend refuses a capability it does not have (dtype, page size, ...).

    Distinct from a wrong rejection (a plain ``ValueError`` on valid input).
    The suites draw only inside a backend's declared ``Capabilities``, so an
    ``Unsupported`` there fails, naming the claim it breaks; outside the
    claim (a backend that is not DP-aware asked for DP) it is a skip.
    """


class PropertyFailure(AssertionError):
    """A conformance property does not hold; the message is the report."""


class MetadataError(ValueError):
    """Attention metadata is malformed; the message names the field."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class ForeignPageError(MetadataError):
    """Metadata names a page or slot outside this DP rank's page range."""


class CacheBindingError(ValueError):
    """KV cache tensors disagree with the backend's geometry or DP range."""


class BackendLoadError(ValueError):
    """A backend spec or entry point cannot be loaded as a backend class."""


class SpecWithoutClass(BackendLoadError, KeyError):
    """A file or module given as a backend name, without ``:Class``.

    To the registry it is an unknown name, so it is a ``KeyError`` as the
    contract says of every unknown name; it is also a ``BackendLoadError``,
    whose message says what was meant and which classes the file holds.
    """

    __str__ = BaseException.__str__  # the message as written, not KeyError's repr of it


class OutOfPages(RuntimeError):
    """A DP rank's page range has no free page left for an allocation."""


def raised_at(exc: BaseException, keep: Callable[[str], bool]) -> str:
    """`` (at FILE:LINE: SOURCE)``: the deepest frame ``exc`` passed through whose file
    ``keep`` accepts (the backend's own code), so a one-line error says where to look;
    ``""`` when no frame is kept."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if keep(f.filename)]
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {last.filename}:{last.lineno}: {last.line})"
