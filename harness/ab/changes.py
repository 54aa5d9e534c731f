"""Which built-in backends changed since a revision: what CI's paired gate compares.

Both sides of ``attn-harness ab`` run this checkout's kit (``harness``), so
only a backend's own files can differ between them: the module defining its
class, the project modules it imports at any depth (read from their source
with ``ast``, not imported), and the data files those modules name (the
``compiled`` backend's ``csrc/paged_attention.cpp``). A backend none of whose
files differ between the base revision and this checkout cannot have become
slower, and pairing it would only spend minutes and risk a false alarm.

``python -m harness.ab.changes [--base REV] NAME ...`` prints ``base
COMMIT`` (or ``base none`` in a repository of one commit), then ``changed
NAME: FILES`` or ``unchanged NAME`` for each backend (the ``ab`` nox session
reads it).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from harness.ab.sides import PROJECT_ROOT, SideError, resolve_revision, run_git

KIT_PACKAGE = "harness"  # the same on both sides: never a backend's own file


def base_revision(root: Path = PROJECT_ROOT) -> str | None:
    """The commit this checkout is based on: its merge-base with main when HEAD is off main,
    else ``HEAD~1``; None in a repository with a single commit (nothing to compare)."""
    head = run_git("rev-parse", "HEAD", cwd=root)
    for main in ("origin/main", "main"):
        try:
            fork = run_git("merge-base", "HEAD", main, cwd=root)
        except SideError:
            continue
        if fork != head:
            return fork
        break
    try:
        return resolve_revision("HEAD~1", cwd=root)
    except SideError:
        return None


def changed_files(base: str, root: Path = PROJECT_ROOT) -> set[str]:
    """Tracked files that differ between ``base`` and this working tree (committed or not),
    as paths relative to the repository's root."""
    listed = run_git("diff", "--name-only", base, "--", cwd=root)
    return {line for line in listed.splitlines() if line}


def _module_file(name: str, root: Path) -> Path | None:
    """The source file of project module ``name`` (None: outside the project, or the kit)."""
    if name.split(".")[0] == KIT_PACKAGE:
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = Path(spec.origin).resolve() if spec and spec.origin else None
    if origin is None or origin.suffix != ".py" or not origin.is_relative_to(root):
        return None
    if "site-packages" in origin.parts:  # an environment kept inside the checkout (.venv)
        return None
    return origin


def _imported_modules(path: Path, package: str, root: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of its code, relative imports resolved.

    ``from pkg import mod`` counts as importing ``pkg.mod`` alone, not ``pkg``'s
    ``__init__`` (which only gathers names): otherwise every backend imported
    through its package would depend on every other backend's module.
    """
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names = [f"{base}.{alias.name}" for alias in node.names]
            modules = [name for name in names if _module_file(name, root) is not None]
            found.update(modules)
            if len(modules) < len(names):
                found.add(base)
    return found


def _named_data_files(path: Path) -> set[Path]:
    """Non-Python files beside or below ``path`` whose name its source mentions."""
    text = path.read_text()
    folder = path.parent
    return {
        data
        for data in folder.rglob("*")
        if data.is_file()
        and data.suffix not in (".py", ".pyc")
        and "__pycache__" not in data.parts
        and data.name in text
    }


def backend_sources(module: str, root: Path = PROJECT_ROOT) -> set[str]:
    """The project files module ``module``'s backend runs: it, what it imports, what they name."""
    root = root.resolve()
    seen: set[Path] = set()
    pending = [module]
    while pending:
        name = pending.pop()
        path = _module_file(name, root)
        if path is None or path in seen:
            continue
        seen.add(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        pending.extend(_imported_modules(path, package, root))
    files = set(seen)
    for path in seen:
        files |= _named_data_files(path)
    return {str(path.relative_to(root)) for path in files}


def changed_backends(
    modules: dict[str, str], base: str, root: Path = PROJECT_ROOT
) -> dict[str, list[str]]:
    """Backend name -> its files that differ from ``base``, for those that changed.

    ``modules`` maps each backend's name to the module defining its class.
    """
    changed = changed_files(base, root)
    found: dict[str, list[str]] = {}
    for name, module in modules.items():
        differing = sorted(backend_sources(module, root) & changed)
        if differing:
            found[name] = differing
    return found


def backend_modules(names: Iterable[str]) -> dict[str, str]:
    """Each backend name or spec -> the module defining its class (through the registry)."""
    from harness.core.registry import BackendRegistry

    registry = BackendRegistry()
    return {name: registry.resolve(name).cls.__module__ for name in names}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.ab.changes", description=__doc__.split("\n", 1)[0]
    )
    parser.add_argument("--base", default=None, help="the base revision (default: see above)")
    parser.add_argument("names", nargs="+", metavar="NAME", help="built-in backends to look at")
    args = parser.parse_args(argv)
    try:
        base = resolve_revision(args.base) if args.base else base_revision()
    except SideError as exc:
        print(f"python -m harness.ab.changes: {exc}", file=sys.stderr)
        return 2
    if base is None:
        print("base none: a single commit, nothing to compare with")
        return 0
    print(f"base {base}")
    changed = changed_backends(backend_modules(args.names), base)
    for name in args.names:
        if name in changed:
            print(f"changed {name}: {', '.join(changed[name])}")
        else:
            print(f"unchanged {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
