"""Which backends CI's paired gate compares: those whose own files changed since the base."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.ab.changes import backend_sources, base_revision, changed_backends, main

PACKAGE = "abchg_pkg"  # a name no other test's module uses: find_spec caches by name


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=root, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository with two backends: one loads a data file, one shares a helper."""
    package = tmp_path / PACKAGE
    (package / "csrc").mkdir(parents=True)
    (package / "__init__.py").write_text(
        "from abchg_pkg.native import Native\nfrom abchg_pkg.plain import Plain\n"
    )
    (package / "helpers.py").write_text("SCALE = 2\n")
    (package / "plain.py").write_text(
        "from abchg_pkg import helpers\n\nclass Plain:\n    scale = helpers.SCALE\n"
    )
    (package / "native.py").write_text(
        "from pathlib import Path\n\n"
        "SOURCE = Path(__file__).parent / 'csrc' / 'kernel.cpp'\n\n"
        "class Native:\n    pass\n"
    )
    (package / "csrc" / "kernel.cpp").write_text("int f() { return 1; }\n")
    (package / "csrc" / "notes.txt").write_text("no module names this file\n")
    _git(tmp_path, "init", "-q", "-b", "main")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "one")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.split(".")[0] == PACKAGE]:
        monkeypatch.delitem(sys.modules, name)
    return tmp_path


MODULES = {"plain": f"{PACKAGE}.plain", "native": f"{PACKAGE}.native"}


def _commit(root: Path, path: str, text: str) -> None:
    (root / path).write_text(text)
    _git(root, "commit", "-q", "-am", f"change {path}")


def test_a_backend_runs_its_module_what_it_imports_and_the_files_it_names(
    project: Path,
) -> None:
    assert backend_sources(MODULES["plain"], project) == {
        f"{PACKAGE}/plain.py",
        f"{PACKAGE}/helpers.py",
    }, "from pkg import module counts that module, not the package's __init__"
    assert backend_sources(MODULES["native"], project) == {
        f"{PACKAGE}/native.py",
        f"{PACKAGE}/csrc/kernel.cpp",
    }, "a data file the module names is its source; one it does not name is not"


def test_only_the_backends_whose_files_changed_are_compared(project: Path) -> None:
    first = _git(project, "rev-parse", "HEAD")
    _commit(project, f"{PACKAGE}/csrc/kernel.cpp", "int f() { return 2; }\n")
    assert changed_backends(MODULES, first, project) == {"native": [f"{PACKAGE}/csrc/kernel.cpp"]}
    second = _git(project, "rev-parse", "HEAD")
    _commit(project, f"{PACKAGE}/helpers.py", "SCALE = 3\n")
    assert changed_backends(MODULES, second, project) == {"plain": [f"{PACKAGE}/helpers.py"]}
    _commit(project, f"{PACKAGE}/csrc/notes.txt", "still unnamed\n")
    third = _git(project, "rev-parse", "HEAD~1")
    assert list(changed_backends(MODULES, third, project)) == []


def test_an_uncommitted_edit_counts_as_a_change(project: Path) -> None:
    head = _git(project, "rev-parse", "HEAD")
    (project / PACKAGE / "plain.py").write_text("class Plain:\n    scale = 5\n")
    assert changed_backends(MODULES, head, project) == {"plain": [f"{PACKAGE}/plain.py"]}


def test_the_base_is_the_parent_on_main_and_the_fork_point_on_a_branch(project: Path) -> None:
    assert base_revision(project) is None, "a single commit has nothing to compare with"
    _commit(project, f"{PACKAGE}/helpers.py", "SCALE = 3\n")
    assert base_revision(project) == _git(project, "rev-parse", "HEAD~1")
    fork = _git(project, "rev-parse", "HEAD")
    _git(project, "checkout", "-q", "-b", "topic")
    _commit(project, f"{PACKAGE}/helpers.py", "SCALE = 4\n")
    _commit(project, f"{PACKAGE}/helpers.py", "SCALE = 5\n")
    assert base_revision(project) == fork, "a branch is compared with where it left main"


def test_the_command_prints_the_base_then_each_backend_changed_or_not(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--base", "HEAD", "sdpa", "reference"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert lines[0] == f"base {head}"
    assert [line.split()[1].rstrip(":") for line in lines[1:]] == ["sdpa", "reference"]
    assert all(line.split()[0] in ("changed", "unchanged") for line in lines[1:])


def test_a_revision_that_does_not_exist_is_refused_by_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--base", "no-such-revision-xyz", "sdpa"]) == 2
    assert "no-such-revision-xyz" in capsys.readouterr().err
