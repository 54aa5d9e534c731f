"""pytest plugin: run each backend on the conformance tests named for it, and nothing else.

    pytest ... -p suites.mutants.selection --backend-tests FILE

``FILE`` is JSON, ``{"backend spec": ["test_function", ...] | "*"}``: the
conformance tests (by function name, every parametrization of it) each
backend runs, ``"*"`` for all of them. ``tests/test_mutants.py`` uses it to
run each planted bug on the property declared to catch it
(``suites.mutants.catchers``) and the built-ins on the whole suite, instead
of every backend on every test. The draws do not change: a derandomized
profile seeds each test from the test alone, not from what else runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("attn-harness").addoption(
        "--backend-tests",
        default=None,
        metavar="FILE",
        help="JSON {backend spec: [test function, ...] or '*'}: run only these pairs",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = config.getoption("backend_tests")
    if path is None:
        return
    wanted: dict[str, list[str] | str] = json.loads(Path(path).read_text())
    kept, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        entry = callspec.params.get("backend_entry") if callspec is not None else None
        tests = wanted.get(entry.name) if entry is not None else None
        name = getattr(item, "originalname", item.name)
        if tests == "*" or (tests is not None and name in tests):
            kept.append(item)
        else:
            dropped.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept
