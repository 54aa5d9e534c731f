"""Loading an engine's kernel files from its installed package, without the engine itself.

An engine's Triton kernels are plain Python files inside a large package
whose ``__init__`` imports the whole server (SGLang's pulls in FastAPI,
transformers, orjson, ...). The adapters need only the kernel files, so they
load those by path from the installed package, under the package's own
dotted names (so the files' imports of each other resolve), with the few
engine-internal modules the files import supplied by the adapter
(``provided``). The engine's code is never copied into this project.

Nothing stays in ``sys.modules`` afterwards: a user who imports the real
engine in the same process gets the real one.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any


class EngineMissing(ImportError):
    """The engine's package is not installed (or lacks the file an adapter loads)."""


def package_root(package: str) -> Path | None:
    """Where ``package`` is installed, found without importing it; ``None``: not installed."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def engine_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or ``None``."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def load_engine_files(
    package: str, modules: Sequence[str], provided: Mapping[str, ModuleType]
) -> dict[str, ModuleType]:
    """Load ``modules`` (dotted names inside ``package``, in order) from the installed files.

    ``provided`` maps dotted names the files import to modules the adapter
    built (stubs of engine internals, or engine files already loaded by path).
    Returns each loaded module by name.
    """
    root = package_root(package)
    if root is None:
        raise EngineMissing(f"{package} is not installed")
    saved = {name: sys.modules.get(name) for name in _names(package, modules, provided)}
    try:
        for name in saved:
            if name in provided:
                sys.modules[name] = provided[name]
            elif name not in modules:
                sys.modules[name] = _namespace(name)  # a parent package: nothing runs
        loaded = {}
        for name in modules:
            path = root.joinpath(*name.split(".")[1:]).with_suffix(".py")
            if not path.is_file():
                raise EngineMissing(f"{package} at {root} has no {path.relative_to(root)}")
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None
            assert spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            loaded[name] = module
        return loaded
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous


def stand_in(name: str, **names: Any) -> ModuleType:
    """A module ``name`` holding only ``names``: an engine internal as far as a kernel file
    reads it (a platform probe, a setting), so that the engine's own module never runs."""
    module = ModuleType(name)
    module.__dict__.update(names)
    return module


def _namespace(name: str) -> ModuleType:
    module = ModuleType(name)
    module.__path__ = []  # a package, so its children can be found in sys.modules
    return module


def _names(package: str, modules: Sequence[str], provided: Mapping[str, ModuleType]) -> list[str]:
    """Every dotted name the load touches, parents first."""
    names: list[str] = []
    for name in [*provided, *modules]:
        parts = name.split(".")
        if parts[0] != package:
            raise ValueError(f"{name} is not inside {package}")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix not in names:
                names.append(prefix)
    return names
