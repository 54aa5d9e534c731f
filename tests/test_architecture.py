"""The layout is the architecture: one package per subsystem, dependencies pointing down.

Reads every module of the project with ``ast``: the library (``harness/``),
the built-ins (``reference_backends/``), the suites (``suites/``) and the
pytest plugin (``attn_harness_pytest``). Imports inside functions count;
imports under ``if TYPE_CHECKING:`` do not, since they never run. Fails on
an import cycle anywhere, an import from a lower layer of the library into
a higher one, a library module importing anything outside the library, a
package outside it importing more than its row of ``OUTSIDE_THE_LIBRARY``
allows, or a top level that grows past its entry modules.
``docs/architecture.md`` draws the same layers.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "harness"

LAYERS = {
    "core": 0,
    "numerics": 1,
    "results": 1,
    "processes": 1,
    "conformance": 2,
    "bench": 2,
    "report": 3,
    "gate": 3,
    "dist": 3,
    "gpu": 3,
    "ab": 3,
    "cli": 4,
}
"""Each subsystem's layer: a module may import its own package and lower layers only."""

ENTRY_MODULES = {
    "__init__",
    "__main__",
    "backend_kit",
    "gpu_check",
    "contract",
    "errors",
}
"""Top-level modules: the public entry points (``harness.X``, ``python -m harness...``)."""

MAX_LINES = 600
"""No module of the project is longer: past it, a module holds more than one concept."""
MAX_CLASS_LINES = 300
"""No class of ``harness/`` is longer: past it, a class does more than one job."""
SOURCES = [
    *PACKAGE.rglob("*.py"),
    *(ROOT / "suites").rglob("*.py"),
    *(ROOT / "reference_backends").rglob("*.py"),
    ROOT / "attn_harness_pytest.py",
]
"""Every module the project ships: the library, the suites, the built-ins and the plugin."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


PROJECT = ("harness", "reference_backends", "suites", "attn_harness_pytest")
"""The project's top-level names: imports of anything else (torch, pytest) are not followed."""

OUTSIDE_THE_LIBRARY = {
    "reference_backends": {"harness.core", "reference_backends"},
    "attn_harness_pytest": {"harness.core", "harness.numerics", "harness.conformance"},
    "suites.conformance": {
        "harness.core",
        "harness.numerics",
        "harness.conformance",
        "attn_harness_pytest",
        "suites.conformance",
    },
    "suites.benchmarks": {
        "harness.core",
        "harness.numerics",
        "harness.results",
        "harness.bench",
        "suites.benchmarks",
    },
    "suites.mutants": {
        "harness.core",
        "harness.numerics",
        "harness.processes",
        "harness.conformance",
        "reference_backends",
        "suites.mutants",
    },
    "suites": set(),
}
"""What each package above the library may import. The built-ins are backends like any
other: they see the contract (``harness.core``) only. The library imports none of these: it
finds the suite's files (``harness.conformance.runner.suite_root``) and loads the built-ins
as entry points, by name."""


def _in_project(module: str) -> bool:
    return module.split(".")[0] in PROJECT


def runtime_imports(path: Path) -> set[str]:
    """Every project module this file imports at run time, at any depth."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking_block(child):
                for orelse in child.orelse:  # type: ignore[attr-defined]
                    visit(orelse)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if _in_project(a.name))
            elif isinstance(child, ast.ImportFrom) and _in_project(child.module or ""):
                found.add(str(child.module))
                found.update(f"{child.module}.{a.name}" for a in child.names)
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def import_graph(sources: list[Path] | None = None) -> dict[str, set[str]]:
    """Module -> the project modules it imports (all of ``SOURCES`` by default)."""
    modules = {module_name(p): p for p in (SOURCES if sources is None else sources)}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        # ``from harness.x import name`` names a module only when that module exists
        graph[name] = {m for m in runtime_imports(path) if m in modules and m != name}
    return graph


def library_graph() -> dict[str, set[str]]:
    """The import graph of ``harness/`` alone."""
    return import_graph(list(PACKAGE.rglob("*.py")))


def package_of(module: str) -> str:
    """``harness.core``, ``suites.mutants``, ``reference_backends``: the unit the rules name."""
    parts = module.split(".")
    if parts[0] == "harness":
        return ".".join(parts[:2]) if subsystem(module) is not None else "harness"
    if parts[0] == "suites" and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def imports_across_the_library_edge(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for a library module importing outside the library, or a package above it
    importing what its row of ``OUTSIDE_THE_LIBRARY`` does not allow."""
    wrong = []
    for source, targets in sorted(graph.items()):
        here = package_of(source)
        for target in sorted(targets):
            there = package_of(target)
            if source.startswith("harness"):
                if not target.startswith("harness"):
                    wrong.append(f"{source} -> {target} (the library imports outside itself)")
            elif there not in OUTSIDE_THE_LIBRARY.get(here, set()):
                wrong.append(f"{source} -> {target} ({here} may not import {there})")
    return wrong


def subsystem(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for every import from a lower (or sibling) layer into a higher or other one."""
    wrong = []
    for source, targets in sorted(graph.items()):
        here = subsystem(source)
        if here is None:  # a top-level entry module composes anything
            continue
        for target in sorted(targets):
            there = subsystem(target)
            if there is None:
                if target != "harness":
                    wrong.append(f"{source} -> {target} (a top-level entry module)")
                continue
            if there != here and LAYERS[there] >= LAYERS[here]:
                wrong.append(f"{source} -> {target} (layer {LAYERS[here]} -> {LAYERS[there]})")
    return wrong


def test_no_import_cycle_anywhere_in_the_project():
    assert cycles(import_graph()) == []


def test_dependencies_point_down_and_nothing_imports_the_cli():
    assert upward_imports(library_graph()) == []


def test_every_package_imports_only_what_its_layer_allows():
    graph = import_graph()
    assert {package_of(m) for m in graph if not m.startswith("harness")} == set(OUTSIDE_THE_LIBRARY)
    assert imports_across_the_library_edge(graph) == []


def test_every_module_belongs_to_a_known_subsystem_or_is_an_entry_module():
    top = {p.stem for p in PACKAGE.glob("*.py")}
    assert top <= ENTRY_MODULES, top - ENTRY_MODULES
    assert len(list(PACKAGE.glob("*"))) - 1 <= 12 + len(LAYERS)  # files + packages (+ pycache)
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert packages == set(LAYERS)


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ROOT)) for p in SOURCES), ids=str)
def test_modules_stay_small(path):
    lines = len((ROOT / path).read_text().splitlines())
    assert lines <= MAX_LINES, f"{path}: {lines} lines (split it by concept)"


def test_classes_stay_small():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.name} ({size} lines)")
    assert not long, f"classes past {MAX_CLASS_LINES} lines (split them by job): {long}"


def test_the_checks_see_a_planted_cycle_and_an_upward_import():
    graph = {
        "harness.core.a": {"harness.numerics.b"},
        "harness.numerics.b": {"harness.core.a"},
        "harness.bench.c": {"harness.cli.main"},
    }
    assert cycles(graph) == [["harness.core.a", "harness.numerics.b"]]
    assert upward_imports(graph) == [
        "harness.bench.c -> harness.cli.main (layer 2 -> 4)",
        "harness.core.a -> harness.numerics.b (layer 0 -> 1)",
    ]
    beyond = {
        "harness.core.registry": {"reference_backends.sdpa"},
        "reference_backends.sdpa": {"harness.conformance.runner", "harness.core.contract"},
        "suites.mutants.kill_matrix": {"harness.conformance.runner"},
    }
    assert imports_across_the_library_edge(beyond) == [
        "harness.core.registry -> reference_backends.sdpa (the library imports outside itself)",
        "reference_backends.sdpa -> harness.conformance.runner "
        "(reference_backends may not import harness.conformance)",
    ]


def test_the_architecture_page_lists_every_module_of_every_package():
    """docs/architecture.md's table names each module in its package's row, and no other."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    rows = {
        line.split("|")[1].strip().strip("`"): line.split("|")[3]
        for line in page.splitlines()
        if line.startswith("| `harness/")
    }
    assert set(rows) == {f"harness/{name}/" for name in LAYERS}
    for package, cell in rows.items():
        listed = set(re.findall(r"`([a-z_][a-z0-9_]*(?:\.json)?)`", cell))
        actual = {
            p.name if p.suffix == ".json" else p.stem
            for p in (ROOT / package).iterdir()
            if p.suffix in (".py", ".json") and not p.stem.startswith("__")
        }
        assert listed == actual, f"{package}: missing {actual - listed}, stale {listed - actual}"


def _module_level_mutables(path: Path) -> list[str]:
    """Names bound at module level to a list, dict or set (display, comprehension or call)."""
    mutable_calls = {"list", "dict", "set", "defaultdict", "OrderedDict", "Counter"}
    found = []
    for node in ast.parse(path.read_text()).body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        call = isinstance(value, ast.Call) and getattr(value.func, "id", "") in mutable_calls
        displays = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)
        if isinstance(value, displays) or call:
            found += [ast.unparse(t) for t in targets if ast.unparse(t) != "__all__"]
    return found


def test_the_plugin_keeps_no_module_level_mutable_state(tmp_path):
    """A run's state lives in its config.stash (harness.conformance.session), not the module."""
    assert _module_level_mutables(ROOT / "attn_harness_pytest.py") == []
    probe = tmp_path / "probe.py"  # the detector finds what it is meant to find
    probe.write_text("A = 1\n_STATE: dict[str, int] = {}\nB = [x for x in ()]\n__all__ = ['A']\n")
    assert _module_level_mutables(probe) == ["_STATE", "B"]


REPEAT_LINES = 6
"""No run of this many code lines stands twice in the product (library, built-ins, plugin)."""
PRODUCT = [
    *PACKAGE.rglob("*.py"),
    *(ROOT / "reference_backends").rglob("*.py"),
    ROOT / "attn_harness_pytest.py",
]
_LIST_ITEM = re.compile(r"^\*{0,2}[A-Za-z_][\w.]*(\s*:\s*[^=]+?)?(\s*=\s*.+?)?,$")
"""One parameter, argument or imported name on its own line (``name: type = default,``):
the contract's constructor signature and keyword calls repeat by design, not by copying."""


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """Each line that carries code, white space folded: no blank, comment, import, lone
    punctuation or list item."""
    kept = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = " ".join(line.split())
        skipped = text.startswith(("#", "import ", "from ")) or not re.search(r"\w", text)
        if not skipped and not _LIST_ITEM.match(text):
            kept.append((number, text))
    return kept


def repeated_runs(paths: list[Path], root: Path = ROOT, size: int = REPEAT_LINES) -> list[str]:
    """``a.py:10 ~ b.py:40`` for every run of ``size`` code lines that stands twice."""
    first: dict[tuple[str, ...], str] = {}
    found = []
    for path in paths:
        lines = _code_lines(path)
        for start in range(len(lines) - size + 1):
            run = tuple(text for _, text in lines[start : start + size])
            place = f"{path.relative_to(root)}:{lines[start][0]}"
            if run in first:
                found.append(f"{first[run]} ~ {place}")
            else:
                first[run] = place
    return found


def test_no_run_of_six_code_lines_stands_twice_in_the_product():
    repeats = repeated_runs(PRODUCT)
    assert not repeats, f"the same {REPEAT_LINES} lines in two places (share them): {repeats}"


def test_the_repeat_check_sees_a_copied_block_and_not_a_signature(tmp_path):
    body = "".join(f"    total = total * {i} + step({i})\n" for i in range(6))
    signature = "".join(f"    name_{i}: int = {i},\n" for i in range(8))
    first = tmp_path / "first.py"
    second = tmp_path / "second.py"
    first.write_text(f"def f(\n{signature}):\n{body}")
    second.write_text(f"def g(\n{signature}):\n    # copied\n\n{body}")
    assert repeated_runs([first, second], root=tmp_path) == ["first.py:11 ~ second.py:13"]
