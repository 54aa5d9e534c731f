"""The README's example backend runs and passes the quick oracle check."""

from __future__ import annotations

import pathlib
import re

from harness.quick_check import run_quick_check
from harness.registry import BackendRegistry

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_example_backend_passes_quick_check(monkeypatch):
    import harness.registry

    monkeypatch.setattr(harness.registry, "_DEFAULT", BackendRegistry())
    (block,) = _python_blocks()
    namespace: dict[str, object] = {}
    exec(compile(block, str(README), "exec"), namespace)
    entry = harness.registry.default_registry().entry("loop-sdpa")
    results = run_quick_check(entry)
    assert results
    failures = [r for r in results if r.status != "PASSED"]
    assert not failures, failures[:3]


def test_readme_quick_start_has_two_commands():
    section = README.read_text().split("## Quick start", 1)[1].split("##", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    lines = [line for line in block.splitlines() if line.strip()]
    assert len(lines) == 2
    assert "constraints.txt" in lines[0]
    assert "nox -s tests" in lines[1]
    assert "harness conform" in lines[0]
