"""pytest plugin of attn-harness: ``--backend SPEC`` and ``--conformance-profile``.

Registered through the ``pytest11`` entry point, so an installed wheel gives
any pytest run these options; from a plain checkout load it with
``-p attn_harness_pytest``. Importing it is cheap: the harness (and torch)
load only when a conformance test asks for a backend.

Tests take the ``backend_entry`` fixture (one parametrization per selected
backend) and ``conformance_profile``. A failed conformance test gets a
"replay" section with the one command that reruns it; a backend for which
no conformance test could check anything makes the run fail.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

PROFILES = ("ci", "thorough", "kill")  # defined in harness.profiles
_STATE: dict[str, Any] = {
    "profile": "ci",
    "device": "cpu",
    "time_limit": None,
    "entries": None,
    "checked": {},
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attn-harness", "attention backend conformance")
    group.addoption(
        "--backend",
        action="append",
        default=[],
        metavar="SPEC",
        help="backend to check: a registered name, package.module:Class or "
        "path/to/file.py:Class (repeatable; default: every registered backend)",
    )
    group.addoption(
        "--conformance-profile",
        choices=PROFILES,
        default="ci",
        help="ci: derandomized and bounded (default); thorough: random, more and larger "
        "examples; kill: fewer examples, no shrinking (mutation testing)",
    )
    group.addoption(
        "--conformance-device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="device the conformance cases run on (default: cpu)",
    )
    group.addoption(
        "--example-time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="fail an example (naming its shape) that runs longer than this "
        "(default: the profile's, 300 s)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "conformance: a conformance property of a backend")
    _STATE["profile"] = config.getoption("conformance_profile")
    _STATE["device"] = config.getoption("conformance_device")
    _STATE["time_limit"] = config.getoption("example_time_limit")
    _STATE["checked"] = {}
    _STATE["entries"] = None
    specs = config.getoption("backend")
    if specs:  # resolve now, so an unloadable spec is a usage error before collection
        _STATE["entries"] = _resolve(specs)


def _resolve(specs: list[str]) -> list[Any]:
    from harness.errors import BackendLoadError
    from harness.registry import default_registry

    entries = []
    for spec in specs:
        try:
            entries.append(default_registry().resolve(spec))
        except (BackendLoadError, KeyError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            raise pytest.UsageError(f"--backend {spec}: {message}") from exc
    return entries


def selected_entries() -> list[Any]:
    if _STATE["entries"] is None:
        from harness.registry import default_registry

        _STATE["entries"] = default_registry().entries()
    return list(_STATE["entries"])


def current_device() -> str:
    """The device chosen with ``--conformance-device``."""
    return str(_STATE["device"])


def current_profile() -> Any:
    """The ``harness.profiles.Profile`` chosen on the command line."""
    from harness.profiles import get_profile

    profile = get_profile(_STATE["profile"])
    if _STATE["time_limit"] is not None:
        return replace(profile, example_time_limit_s=_STATE["time_limit"])
    return profile


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend_entry" in metafunc.fixturenames:
        entries = selected_entries()
        metafunc.parametrize("backend_entry", entries, ids=[e.name for e in entries])


@pytest.fixture(scope="session")
def conformance_profile() -> Any:
    return current_profile()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    callspec = getattr(item, "callspec", None)
    entry = callspec.params.get("backend_entry") if callspec is not None else None
    if entry is None or not (report.when == "call" or (report.when == "setup" and report.skipped)):
        return
    item.user_properties.append(("backend", entry.name))  # kept in --junitxml
    counts = _STATE["checked"].setdefault(entry.name, {"passed": 0, "failed": 0, "skipped": 0})
    counts[report.outcome] = counts.get(report.outcome, 0) + 1
    if report.failed:
        name = getattr(item, "originalname", item.name)
        module_obj = getattr(item, "module", None)
        module = module_obj.__name__ if module_obj is not None else "suites.conformance"
        # other parameters (a production regime) narrow the replay to this one test
        params = callspec.params if callspec is not None else {}
        others = [str(v) for k, v in params.items() if k != "backend_entry"]
        selector = " and ".join([name, *others])
        command = (
            f"python -m pytest --pyargs {module} -p attn_harness_pytest "
            f"--backend '{entry.name}' --conformance-profile {_STATE['profile']} "
            f"-k '{selector}'"
        )
        report.sections.append(("replay", f"backend {entry.name!r}, property {name}:\n  {command}"))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    for name, counts in sorted(_STATE["checked"].items()):
        if counts.get("passed", 0) == 0 and counts.get("failed", 0) == 0:
            terminalreporter.write_line(
                f"attn-harness: nothing could be checked for backend {name!r}: every "
                "conformance test was skipped (outside its declared capabilities)",
                red=True,
            )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    nothing = [
        name
        for name, counts in _STATE["checked"].items()
        if counts.get("passed", 0) == 0 and counts.get("failed", 0) == 0
    ]
    if nothing and session.exitstatus == 0:
        session.exitstatus = 1
