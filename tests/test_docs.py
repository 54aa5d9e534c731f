"""The user documentation in docs/: its code runs, its links resolve, it stays in the repository.

* The Python blocks of docs/write-a-backend.md and docs/contract.md run in
  order, in a temporary folder: a block whose first line is a comment naming
  a file (``# my_backend.py``) is written as that file, every other block is
  executed, and what a block prints must match the ``# ...`` comment under
  each ``print``. The backend each file defines then passes the quick oracle
  check (``attn-harness check``) in every case.
* Every ``attn-harness`` / ``python -m harness`` line of a shell block in docs/
  parses with the real command-line parser.
* Every usage line quoted in a code block of README.md or docs/ (a command
  followed by ``[...]`` options, continuation lines joined) names exactly the
  options that the command's ``--help`` prints today, taken in-process from
  ``harness.cli.main.build_parser`` (and ``harness.gpu.check.main`` for the GPU
  script): none missing, none extra.
* Every relative Markdown link in docs/*.md, README.md and reports/README.md
  names a file of the repository (and, into docs/, a heading that exists).
* No doc in docs/ names DESIGN.md or a path outside the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import re
import shlex
from pathlib import Path

import pytest

import harness.core.registry
from harness.conformance.check_matrix import run_quick_check
from harness.core.registry import BackendRegistry
from tools.doc_blocks import FENCE, code_blocks, named_file

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
DOC_FILES = sorted(DOCS.glob("*.md"))
LINKED_FILES = [*DOC_FILES, ROOT / "README.md", ROOT / "reports" / "README.md"]

BACKEND_CLASS = re.compile(r"^class (\w+)\b", re.MULTILINE)
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
EXTERNAL = ("http://", "https://", "mailto:")


def expected_output(block: str) -> list[str]:
    """The ``# ...`` comment lines right under each ``print(...)`` line of ``block``."""
    lines = block.splitlines()
    expected = []
    for line, following in itertools.pairwise(lines):
        comment = following.strip()
        if line.strip().startswith("print(") and comment.startswith("# "):
            expected.append(comment[2:])
    return expected


def run_doc(doc: Path, folder: Path) -> dict[str, Path]:
    """Write the doc's file blocks into ``folder`` and run its other blocks there, in order."""
    files: dict[str, Path] = {}
    namespace: dict[str, object] = {"__name__": f"docs_{doc.stem.replace('-', '_')}"}
    blocks = code_blocks(doc, "python")
    assert blocks, f"{doc.name} has no Python blocks"
    for number, block in enumerate(blocks, start=1):
        name = named_file(block)
        if name is not None:
            files[name] = folder / name
            files[name].write_text(block)
            continue
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(block, f"{doc.name}, Python block {number}", "exec"), namespace)
        expected = expected_output(block)
        if expected:
            assert printed.getvalue().splitlines() == expected, f"{doc.name} block {number}"
    return files


def assert_backend_passes_quick_check(path: Path) -> None:
    classes = BACKEND_CLASS.findall(path.read_text())
    assert classes, f"{path.name} defines no class"
    entry = harness.core.registry.default_registry().resolve(f"{path}:{classes[0]}")
    results = run_quick_check(entry)
    assert results, "the quick check ran no case"
    failures = [r for r in results if r.status != "PASSED"]
    assert not failures, failures[:3]


@pytest.fixture
def doc_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh registry and an empty current folder, as a reader starting out has."""
    monkeypatch.setattr(harness.core.registry, "_DEFAULT", BackendRegistry())
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_guide_runs_and_its_backend_passes_the_quick_check(doc_folder: Path) -> None:
    files = run_doc(DOCS / "write-a-backend.md", doc_folder)
    assert list(files) == ["my_backend.py"]
    assert_backend_passes_quick_check(files["my_backend.py"])


def test_contract_examples_run_and_the_minimal_backend_passes_the_quick_check(
    doc_folder: Path,
) -> None:
    files = run_doc(DOCS / "contract.md", doc_folder)
    assert list(files) == ["minimal_backend.py"]
    assert_backend_passes_quick_check(files["minimal_backend.py"])


def test_mla_example_runs_and_its_backend_passes_the_quick_check(doc_folder: Path) -> None:
    files = run_doc(DOCS / "mla.md", doc_folder)
    assert list(files) == ["my_mla.py"]
    assert_backend_passes_quick_check(files["my_mla.py"])


def test_guide_code_uses_only_public_names() -> None:
    for block in code_blocks(DOCS / "write-a-backend.md", "python"):
        private = [n for n in re.findall(r"(?<!\w)_\w+", block) if not n.endswith("__")]
        assert not private, f"write-a-backend.md uses private names: {private}"


def _shell_commands() -> list[tuple[str, str]]:
    commands = []
    for doc in DOC_FILES:
        for block in code_blocks(doc, "bash"):
            for line in block.splitlines():
                line = line.split(" #", 1)[0].strip()
                if line.startswith(("attn-harness ", "python -m harness ")):
                    commands.append((doc.name, line))
    return commands


@pytest.mark.parametrize(("doc", "command"), _shell_commands())
def test_shell_commands_parse(doc: str, command: str) -> None:
    from harness.cli.main import build_parser

    words = shlex.split(command)
    args = words[1:] if words[0] == "attn-harness" else words[3:]
    try:
        build_parser().parse_args(args)
    except SystemExit as exc:  # argparse's answer to a bad command line
        pytest.fail(f"{doc}: `{command}` does not parse (exit {exc.code})")


USAGE_FILES = [ROOT / "README.md", *DOC_FILES]
USAGE_START = re.compile(
    r"(?:usage: )?(?:attn-harness|python3? -m harness(?:\.gpu)?"
    r"|PYTHONPATH=\S+ python3? -m harness\.gpu) "
)
FLAG = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


def _usage_lines() -> list[tuple[str, str]]:
    """Every usage line in a code block: a command followed by ``[...]``, continuations joined."""
    lines = []
    for path in USAGE_FILES:
        for _, body in FENCE.findall(path.read_text()):
            joined = re.sub(r"\n[ \t]+(?=[\[-])", " ", body)
            for line in joined.splitlines():
                line = line.split(" #", 1)[0].strip()
                if USAGE_START.match(line) and "[" in line:
                    lines.append((path.name, line.removeprefix("usage: ")))
    return lines


def _help_options(help_text: str) -> list[tuple[str, ...]]:
    """The options ``--help`` prints, one tuple of aliases per option (``-h`` left out)."""
    options = []
    for line in help_text.splitlines():
        if re.match(r"  -[^ ]", line):
            aliases = tuple(FLAG.findall(re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]))
            if "--help" not in aliases:
                options.append(aliases)
    return options


def _command_help(line: str) -> tuple[str, str, str]:
    """The command a usage line shows, what its ``--help`` prints (captured in-process), and
    the rest of the line."""
    words = line.split()
    if "harness.gpu" in words:
        from harness.gpu.check import main as gpu_main

        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), pytest.raises(SystemExit):
            gpu_main(["--help"])
        rest = " ".join(words[words.index("harness.gpu") + 1 :])
        return "python -m harness.gpu", printed.getvalue(), rest
    from harness.cli.main import build_parser

    at = 1 if words[0] == "attn-harness" else 3
    name = words[at]
    (subparsers,) = [
        a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ]
    assert name in subparsers.choices, f"`{line}`: no command {name!r}"
    return f"attn-harness {name}", subparsers.choices[name].format_help(), " ".join(words[at + 1 :])


def test_usage_lines_are_found() -> None:
    commands = {_command_help(line)[0] for _, line in _usage_lines()}
    assert {"attn-harness run", "attn-harness bench", "python -m harness.gpu"} <= commands
    assert len(commands) >= 10, commands


@pytest.mark.parametrize(
    ("doc", "line"),
    _usage_lines(),
    ids=lambda v: v if v.endswith(".md") else " ".join(v.split()[:2]),
)
def test_usage_lines_name_exactly_the_options_of_the_help(doc: str, line: str) -> None:
    command, help_text, rest = _command_help(line)
    options = _help_options(help_text)
    assert options, f"no options parsed from `{command} --help`"
    known = {alias for aliases in options for alias in aliases}
    shown = set(FLAG.findall(rest.split(" -- ", 1)[0]))
    extra = sorted(shown - known)
    assert not extra, f"{doc}: `{line}` shows {extra}, which `{command} --help` does not list"
    missing = [aliases for aliases in options if not shown & set(aliases)]
    assert not missing, f"{doc}: `{line}` lacks {missing}, which `{command} --help` lists"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)}


def _links(path: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", path.read_text()))


@pytest.mark.parametrize("path", LINKED_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_into_the_repository(path: Path) -> None:
    assert path.is_file(), f"{path.relative_to(ROOT)} does not exist"
    for link in _links(path):
        if link.startswith(EXTERNAL):
            continue
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        assert file.is_relative_to(ROOT), f"{path.name}: {link} leaves the repository"
        assert file.exists(), f"{path.name}: {link} names a missing file"
        if anchor and file.suffix == ".md" and file.parent == DOCS:
            assert anchor in _anchors(file), f"{path.name}: {link}: no such heading"


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: p.name)
def test_docs_stay_inside_the_repository(path: Path) -> None:
    text = path.read_text()
    assert not re.search(r"design\.md", text, flags=re.IGNORECASE), f"{path.name} names DESIGN.md"
    assert "/work/" not in text, f"{path.name} names an absolute path of a checkout"
    for relative in re.findall(r"(?:\.\./)+[\w./-]*", text):
        where = (path.parent / relative).resolve()
        assert where.is_relative_to(ROOT), f"{path.name}: {relative} is outside the repository"


def test_docs_index_lists_every_doc() -> None:
    index = (DOCS / "README.md").read_text()
    for doc in DOC_FILES:
        if doc.name != "README.md":
            assert f"]({doc.name})" in index, f"docs/README.md does not list {doc.name}"


PUBLIC_ROOTS = ("harness", "attn_harness_pytest", "reference_backends", "suites")


def _documented_imports() -> list[tuple[str, str, str]]:
    """Every ``from MODULE import NAME`` of the project in README.md's and docs/'s code."""
    import ast

    found = []
    for doc in [ROOT / "README.md", *DOC_FILES]:
        for block in code_blocks(doc, "python") + code_blocks(doc, "py"):
            try:
                tree = ast.parse(block)
            except SyntaxError:  # a fragment (an elided body): its import lines still count
                tree = ast.parse("\n".join(line for line in block.splitlines() if "import" in line))
            for node in ast.walk(tree):
                if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                    continue
                if node.module.split(".")[0] in PUBLIC_ROOTS:
                    found += [(doc.name, node.module, a.name) for a in node.names]
            if re.search(r"^import harness$", block, re.M):  # then harness.NAME attributes
                for name in re.findall(r"(?<![\w.])harness\.([A-Za-z_]\w*)", block):
                    found.append((doc.name, "harness", name))
    return found


def test_docs_import_public_names_from_where_they_say():
    """A name the docs import from a module is there: moving it breaks this, not a user."""
    import importlib

    documented = _documented_imports()
    assert len({(m, n) for _, m, n in documented}) >= 10  # the docs' imports were found
    for doc, module, name in documented:
        assert hasattr(importlib.import_module(module), name), f"{doc}: from {module} import {name}"


def test_every_name_in_harness_all_imports_from_harness():
    import harness

    assert len(harness.__all__) >= 20
    for name in harness.__all__:
        assert getattr(harness, name) is not None, name
    from harness import backend_kit

    for name in getattr(backend_kit, "__all__", []):
        assert hasattr(backend_kit, name), name
