"""The README's example backend runs and passes the quick oracle check."""

from __future__ import annotations

import argparse
import ast
import pathlib
import re
import subprocess
import sys

from harness.conformance.check_matrix import run_quick_check
from harness.core.registry import BackendRegistry

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
COMMANDS = README.parent / "docs" / "commands.md"  # every command's usage line and option


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_example_backend_passes_quick_check(monkeypatch):
    import harness.core.registry

    monkeypatch.setattr(harness.core.registry, "_DEFAULT", BackendRegistry())
    (block,) = _python_blocks()
    namespace: dict[str, object] = {}
    exec(compile(block, str(README), "exec"), namespace)
    entry = harness.core.registry.default_registry().entry("loop-sdpa")
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
    assert "harness run" in lines[0]


def _commands(text: str, program: str) -> list[str]:
    """Every ``program ...`` command in the text's code blocks and inline code, joined lines."""
    blocks = re.findall(r"```(?:bash)?\n(.*?)```", text, flags=re.DOTALL)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.DOTALL))
    commands = []
    for chunk in [*blocks, *spans]:
        joined = re.sub(r"\n\s+(?=[\[-])", " ", chunk)  # continuation lines of a usage block
        for line in joined.splitlines():
            at = line.find(program + " ")
            if at >= 0:
                commands.append(line[at:].split("#", 1)[0])
    return commands


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    from harness.cli.main import build_parser

    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(subparsers.choices)


def _parser_options() -> dict[str, set[str]]:
    return {name: set(sub._option_string_actions) for name, sub in _subparsers().items()}


def _plugin_options() -> set[str]:
    """The options a pytest run with the plugin (and the benchmark suite) accepts."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "attn_harness_pytest",
            "suites/benchmarks",
            "--help",
        ],
        cwd=README.parent,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", result.stdout))


def test_readme_commands_use_only_options_the_cli_has():
    options = _parser_options()
    plugin = _plugin_options()
    commands = _commands(README.read_text() + COMMANDS.read_text(), "attn-harness")
    assert len(commands) > 10
    checked = 0
    for command in commands:
        words = command.split()
        sub = words[1] if len(words) > 1 else ""
        if sub not in options:
            continue
        own, _, passed_on = command.partition(" -- ")
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", own):
            assert flag in options[sub], f"README: `{command}` uses {flag}, not in {sub} --help"
            checked += 1
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", passed_on):
            assert flag in plugin, f"README: `{command}` passes {flag} to pytest, which lacks it"
            checked += 1
    assert checked > 15


def test_readme_pytest_commands_use_only_options_pytest_and_the_plugin_have():
    plugin = _plugin_options()
    commands = _commands(COMMANDS.read_text(), "pytest")
    assert commands
    for command in commands:
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", command):
            assert flag in plugin, f"README: `{command}` uses {flag}, unknown to pytest + plugin"


def _nox_sessions() -> list[str]:
    """The sessions noxfile.py defines: functions decorated with ``@nox.session``, in order."""
    tree = ast.parse((README.parent / "noxfile.py").read_text())
    sessions = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            call = decorator if isinstance(decorator, ast.Call) else None
            target = call.func if call else decorator
            if ast.unparse(target) not in ("nox.session", "session"):
                continue
            named = [k.value for k in (call.keywords if call else []) if k.arg == "name"]
            sessions.append(ast.literal_eval(named[0]) if named else node.name)
    return sessions


def test_readme_nox_sessions_exist():
    sessions = set(_nox_sessions())
    named = set(re.findall(r"nox -s (\w+)", README.read_text()))
    for doc in sorted((README.parent / "docs").glob("*.md")):
        named |= set(re.findall(r"nox -s (\w+)", doc.read_text()))
    assert named
    assert named <= sessions, named - sessions


def test_commands_page_lists_exactly_the_nox_sessions():
    """docs/commands.md's ``nox sessions:`` list names every session of noxfile.py, in order."""
    sentence = COMMANDS.read_text().split("nox sessions: ", 1)[1].split(";", 1)[0]
    listed = re.findall(r"`(\w+)`", sentence)
    assert listed == _nox_sessions(), (listed, _nox_sessions())


def test_every_option_of_every_command_is_in_the_commands_page():
    """docs/commands.md's usage lines name every option (tests/test_docs.py checks each line)."""
    text = COMMANDS.read_text()
    for name, sub in _subparsers().items():
        for action in sub._actions:
            if action.help == argparse.SUPPRESS or "--help" in action.option_strings:
                continue
            if not action.option_strings:  # a positional: its metavar is in the usage line
                assert f" {action.metavar}" in text, (
                    f"{name} {action.metavar} not in {COMMANDS.name}"
                )
                continue
            shown = [
                f for f in action.option_strings if re.search(rf"(?<![\w-]){f}(?![\w-])", text)
            ]
            assert shown, f"{name} {action.option_strings} is not in {COMMANDS.name}"
