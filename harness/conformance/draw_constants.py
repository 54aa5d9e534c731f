"""Hypothesis's pool of source constants, made the same in every process of a run.

Hypothesis (6.131 on) sometimes draws a number found in the source of the
"local" modules imported so far (``64``, ``8192``, ``2**31`` from this
project's own code and the backend's: useful, they are its thresholds). Which
modules are imported when a test draws depends on which tests ran before
it in that process, so a derandomized ``ci`` test drew different examples
alone, after others, or in a pytest-xdist worker; and none from an installed
wheel (site-packages is not "local").

``freeze_pool`` replaces that moving pool with a fixed one: the constants of
every source file of this project's packages (read, not imported) and of
each selected backend's module. Every process of a run then draws the same
examples for a test whatever ran before it, and a checkout and a wheel
draw alike. It reaches into hypothesis internals (there is no setting for
this); on a hypothesis without them it changes nothing and says why.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

PACKAGES = ("harness", "reference_backends", "suites")
"""This project's packages: their sources give the pool whatever is installed where."""


def project_sources() -> list[Path]:
    """Every ``.py`` file of ``PACKAGES``, sorted (found on disk, nothing imported)."""
    files: set[Path] = set()
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        folders = (spec.submodule_search_locations or []) if spec is not None else []
        for folder in folders:
            files.update(Path(folder).rglob("*.py"))
    return sorted(files)


def module_sources(classes: Iterable[type]) -> list[Path]:
    """The source files of the modules defining ``classes`` (the selected backends)."""
    files = set()
    for cls in classes:
        module = sys.modules.get(cls.__module__)
        path = getattr(module, "__file__", None)
        if path and path.endswith(".py"):
            files.add(Path(path).resolve())
    return sorted(files)


def pool_of(files: Iterable[Path]) -> Any:
    """Hypothesis's ``Constants`` of these files (its cache of them on disk is reused)."""
    from hypothesis.internal.constants_ast import Constants, constants_from_module

    pool = Constants()
    for path in files:
        stand_in = types.ModuleType(f"_constants_of_{path.stem}")
        stand_in.__file__ = str(path)
        pool |= constants_from_module(stand_in)
    return pool


def freeze_pool(backend_classes: Iterable[type]) -> Callable[[], None] | str:
    """Make every draw of this process see one fixed pool; returns the undo, or why not."""
    try:
        from hypothesis.internal.conjecture import providers

        original = providers._get_local_constants
        pool = pool_of([*project_sources(), *module_sources(backend_classes)])
    except (ImportError, AttributeError) as exc:
        return f"hypothesis's constant pool left as it is ({type(exc).__name__}: {exc})"
    providers.CONSTANTS_CACHE.cache.clear()  # filtered views of the pool it had
    providers._get_local_constants = lambda: pool

    def undo() -> None:
        providers._get_local_constants = original
        providers.CONSTANTS_CACHE.cache.clear()

    return undo
