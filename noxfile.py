"""Developer and CI sessions. Every install goes through constraints.txt (the pinned torch)."""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests", "conformance", "lint", "typecheck"]

CONSTRAINTS = ("-c", "constraints.txt")


@nox.session
def tests(session: nox.Session) -> None:
    """The unit tests (CPU; the triton backend's under Triton's interpreter)."""
    session.install(*CONSTRAINTS, "-e", ".[test,triton]")
    session.run("pytest", *session.posargs)


@nox.session
def conformance(session: nox.Session) -> None:
    """The conformance suite (ci profile) against every registered backend.

    Extra arguments go to ``attn-harness conform``, e.g.
    ``nox -s conformance -- --backend my_pkg.attn:MyBackend --profile thorough``.
    """
    session.install(*CONSTRAINTS, "-e", ".[triton]")
    session.run("attn-harness", "conform", *session.posargs)


@nox.session
def mutants(session: nox.Session) -> None:
    """The planted-bug kill matrix: which properties catch which bug."""
    session.install(*CONSTRAINTS, "-e", ".")
    session.run("python", "-m", "suites.mutants.kill_matrix", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """CPU default: every backend x every workload (CPU size) -> reports/bench-cpu.json."""
    session.install(*CONSTRAINTS, "-e", ".[bench]")
    Path("reports").mkdir(exist_ok=True)
    session.run(
        "attn-harness",
        "bench",
        "--no-progress",
        "--out",
        "reports/bench-cpu.json",
        *session.posargs,
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff lint and format check."""
    session.install(*CONSTRAINTS, "ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over the library and the built-in backends."""
    session.install(*CONSTRAINTS, "-e", ".", "mypy")
    session.run("mypy")
