"""pytest plugin of attn-harness: ``--backend SPEC`` and ``--conformance-profile``.

Registered through the ``pytest11`` entry point, so an installed wheel gives
any pytest run these options; from a plain checkout load it with
``-p attn_harness_pytest``. Importing it is cheap: the harness (and torch)
load only when a conformance test asks for a backend.

Tests take the ``backend_entry`` fixture (one parametrization per selected
backend) and ``conformance_profile``. A failed conformance test gets a
"replay" section with the one command that reruns exactly that example
(``--replay TEST@VERSION:BLOB``, fed to hypothesis's ``reproduce_failure``);
a backend for which no conformance test could check anything makes the run
fail. The run ends with a verdict table (backend x property) and one entry
per failure; ``--conformance-output compact`` (what ``attn-harness conform``
uses) shows only that, with a live line on a terminal.

Whatever runs the plugin, hypothesis keeps its files under the harness's
cache folder (``$ATTN_HARNESS_CACHE`` or ``~/.cache/attn-harness``), not in a
``.hypothesis/`` folder in the current directory, unless
``HYPOTHESIS_STORAGE_DIRECTORY`` says otherwise.

Coverage: the suite records every checked example (``record_examples``);
the run ends with a per-backend table of what was exercised, writes it as
JUnit properties and JSON, and fails when the whole suite ran under a
profile that promises coverage and a claimed value was never checked.
"""

from __future__ import annotations

import argparse
import os
import pkgutil
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.conformance.plugin_names import PROFILE_NAMES as PROFILES
from harness.conformance.plugin_names import backend_entry_of, cache_root
from harness.core.atomic_file import write_json_atomically

_STATE: dict[str, Any] = {
    "profile": "ci",
    "device": "cpu",
    "time_limit": None,
    "examples": None,
    "profiles": {},
    "entries": None,
    "coverage": None,
    "current_test": None,
    "modules": {},
    "deselected": False,
    "verdicts": None,
    "replay": None,
    "reporter": None,
    "cli": False,
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
    group.addoption(
        "--examples",
        type=int,
        default=None,
        metavar="N",
        help="examples per property test (default: the profile's, 100 for ci); fewer for a "
        "slow backend, more for a deeper run; below the profile's count, coverage is "
        "reported but not required",
    )
    group.addoption(
        "--shrink-time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop shrinking a failure after this long and report the smallest example found "
        "so far (default: hypothesis's, 300 s); lower it for a slow backend",
    )
    group.addoption(
        "--replay",
        default=None,
        metavar="TEST@VERSION:BLOB",
        help="rerun exactly one failing example, as a failure report prints it (or TEST "
        "alone: rerun that one test); every other test is deselected",
    )
    group.addoption(
        "--conformance-output",
        choices=("pytest", "compact"),
        default="pytest",
        help="pytest: pytest's report, then the verdict table (default); compact: only a "
        "header, a live line on a terminal, the verdict table and one entry per failure",
    )
    group.addoption(
        "--conformance-cli",
        action="store_true",
        help=argparse.SUPPRESS,  # set by `attn-harness conform`: replays name that command
    )
    group.addoption(
        "--coverage-json",
        default=None,
        metavar="PATH",
        help="write the coverage tally here as JSON (default: next to --junitxml, "
        "as NAME.coverage.json)",
    )


def _read_profile_options(options: Any) -> None:
    """What the suite's modules read when they are imported: profile, device, budgets."""
    _STATE["profile"] = options.conformance_profile
    _STATE["device"] = options.conformance_device
    _STATE["time_limit"] = options.example_time_limit
    _STATE["examples"] = options.examples
    _STATE["profiles"] = {}  # profile_for's, built from these options
    if _STATE["examples"] is not None and _STATE["examples"] < 1:
        raise pytest.UsageError(f"--examples must be >= 1, got {_STATE['examples']}")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Given the suite's folder, pytest imports its conftest before ``pytest_configure``."""
    _read_profile_options(early_config.known_args_namespace)


@pytest.hookimpl(trylast=True)  # after pytest's terminal reporter has registered itself
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "conformance: a conformance property of a backend")
    _read_profile_options(config.option)
    shrink = config.getoption("shrink_time_limit")
    if shrink is not None:
        _limit_shrinking(shrink)
    _STATE["entries"] = None
    _STATE["not_claiming"] = []
    _STATE["coverage"] = None
    _STATE["modules"] = {}
    _STATE["deselected"] = False
    _STATE["cli"] = config.getoption("conformance_cli")
    _STATE["replay"] = _parse_replay(config.getoption("replay"))
    specs = config.getoption("backend")
    if specs:  # resolve now, so an unloadable spec is a usage error before collection
        _STATE["entries"] = _resolve(specs)
    from harness.conformance.report import Verdicts

    _STATE["verdicts"] = Verdicts()
    _STATE["reporter"] = None
    if config.getoption("conformance_output") == "compact":
        _install_compact_reporter(config)


def _install_compact_reporter(config: pytest.Config) -> None:
    """Put the compact reporter in the place of pytest's terminal output."""
    from harness.conformance.report import CompactReporter

    standard = config.pluginmanager.getplugin("terminalreporter")
    if standard is not None:
        config.pluginmanager.unregister(standard)
    reporter = CompactReporter(config, _compact_summary, sizing_notes)
    config.pluginmanager.register(reporter, "attn-harness-compact-reporter")
    _STATE["reporter"] = reporter


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Under pytest's own report: which profile applies (hypothesis's header says 'default')."""
    specs = config.getoption("backend") or ["every registered backend"]
    return [
        f"attn-harness: profile {_STATE['profile']} (its settings decorate each conformance "
        f"test), device {_STATE['device']}, backends: {', '.join(specs)}",
        *(f"attn-harness: {note}" for note in sizing_notes()),
    ]


def _parse_replay(value: str | None) -> tuple[str, str | None, bytes | None] | None:
    if not value:
        return None
    if "@" not in value:
        return value, None, None
    from harness.conformance.report import parse_replay

    try:
        return parse_replay(value)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from exc


def keep_hypothesis_files_out_of_the_working_directory() -> None:
    """Hypothesis caches files in ``./.hypothesis`` by default; keep them in our cache.

    Called by the conformance suite's conftest, before its tests are defined,
    so a project that merely has the plugin installed keeps its own folder.
    """
    if os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        return
    from hypothesis import configuration

    configuration.set_hypothesis_home_dir(str(cache_root() / "hypothesis-home"))


def _limit_shrinking(seconds: float) -> None:
    """Set hypothesis's shrinking budget (a module constant; it has no setting for it).

    Shrinking re-runs the failing property on ever smaller draws; with a slow
    backend the default five minutes can end on a large example, so a lower
    budget is better spent on a backend whose every example takes seconds.
    """
    if seconds <= 0:
        raise pytest.UsageError(f"--shrink-time-limit must be > 0, got {seconds:g}")
    from hypothesis.internal.conjecture import engine

    if not hasattr(engine, "MAX_SHRINKING_SECONDS"):
        raise pytest.UsageError(
            "--shrink-time-limit: this hypothesis version has no shrinking time budget to set"
        )
    engine.MAX_SHRINKING_SECONDS = seconds  # type: ignore[assignment]  # read as a number


def _resolve(specs: list[str]) -> list[Any]:
    from harness.core.errors import BackendLoadError
    from harness.core.registry import default_registry

    entries = []
    for spec in specs:
        try:
            entries.append(default_registry().resolve(spec))
        except (BackendLoadError, KeyError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            raise pytest.UsageError(f"--backend {spec}: {message}") from exc
    return entries


def selected_entries() -> list[Any]:
    """The ``--backend`` entries; without one, every registered backend that claims the device.

    A registered backend that claims no such device here (a built-in whose
    optional package is not installed) is left out of a default run and
    named in the header, rather than failing it for checking nothing; asked
    for by name, it runs and fails so.
    """
    if _STATE["entries"] is None:
        from harness.core.registry import default_registry, split_by_device

        claiming, others = split_by_device(default_registry().entries(), _STATE["device"])
        _STATE["entries"] = claiming
        _STATE["not_claiming"] = [e.name for e in others]
    return list(_STATE["entries"])


def current_device() -> str:
    """The device chosen with ``--conformance-device``."""
    return str(_STATE["device"])


def current_profile() -> Any:
    """The ``harness.conformance.profiles.Profile`` chosen on the command line."""
    from harness.conformance.profiles import get_profile

    profile = get_profile(_STATE["profile"])
    if _STATE["time_limit"] is not None:
        profile = replace(profile, example_time_limit_s=_STATE["time_limit"])
    if _STATE["examples"] is not None:
        profile = profile.with_examples(_STATE["examples"])
    return profile


def interpreted_here(entry: Any) -> bool:
    """Whether ``entry`` runs interpreted on the chosen device (it says so in its claim)."""
    return _STATE["device"] in entry.capabilities.interpreted_devices


def profile_for(entry: Any) -> Any:
    """The profile that sizes ``entry``'s draws: lighter where it runs interpreted.

    Asked for at every draw, so both kinds are built once per run of options.
    """
    interpreted = interpreted_here(entry)
    built = _STATE["profiles"]
    if interpreted not in built:
        profile = current_profile()
        built[interpreted] = profile.interpreted() if interpreted else profile
    return built[interpreted]


def sizing_notes() -> list[str]:
    """Lines for the header: registered backends left out of a default run, and how the
    draws of a backend that runs interpreted here are sized."""
    notes = [
        f"{name} not run: registered, but claims no {_STATE['device']!r} device here "
        f"(attn-harness list --backend {name} shows its capabilities)"
        for name in _STATE.get("not_claiming", [])
    ]
    for entry in selected_entries():
        if interpreted_here(entry):
            profile = profile_for(entry)
            notes.append(
                f"{entry.name} runs interpreted on {_STATE['device']}: profile {profile.name}, "
                f"{profile.settings.max_examples} examples per property "
                f"(of {current_profile().settings.max_examples}) on smaller shapes, "
                f"{profile.production_examples} per production regime; coverage is reported, "
                "not required"
            )
    return notes


def get_default_examples() -> int:
    """Examples per property test of the chosen profile, before ``--examples``."""
    from harness.conformance.profiles import get_profile

    return int(get_profile(_STATE["profile"]).settings.max_examples)


def coverage_log() -> Any:
    """The session's ``harness.conformance.claim_coverage.CoverageLog``."""
    if _STATE["coverage"] is None:
        from harness.conformance.claim_coverage import CoverageLog

        _STATE["coverage"] = CoverageLog()
    return _STATE["coverage"]


def record_examples(backend: str, scenarios: list[Any], *, example: bool = True) -> None:
    """Count one example of the running conformance test that held (every rank's step in it).

    Outside a conformance test (the harness's own unit tests call the same
    checks) nothing is counted.
    """
    if _STATE["current_test"] is not None:
        coverage_log().record(backend, _STATE["current_test"], scenarios, example=example)
        if example and _STATE["reporter"] is not None:
            _STATE["reporter"].example_held()


def record_run(backend: str, run: Any) -> None:
    """Count one finished run of the stateful machine."""
    if _STATE["current_test"] is not None:
        coverage_log().record_stateful(backend, _STATE["current_test"], run)
        if _STATE["reporter"] is not None:
            _STATE["reporter"].example_held()


def pytest_runtest_setup(item: pytest.Item) -> None:
    conformance = backend_entry_of(item) is not None
    _STATE["current_test"] = getattr(item, "originalname", item.name) if conformance else None


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        _STATE["deselected"] = True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    replay = _STATE["replay"]
    if replay is None:
        return
    test = replay[0]
    kept = [item for item in items if item.name == test]
    if not kept:
        names = sorted(item.name for item in items if backend_entry_of(item) is not None)
        raise pytest.UsageError(
            f"--replay: no conformance test named {test!r} among the selected backends; it "
            "takes TEST@VERSION:BLOB as a failure entry prints it, or a test's name "
            f"(for example: {', '.join(names[:2]) or 'none collected'})"
        )
    config.hook.pytest_deselected(items=[item for item in items if item.name != test])
    items[:] = kept


def current_replay() -> tuple[str, bytes] | None:
    """``(hypothesis version, blob)`` of the example ``--replay`` asks for, if any."""
    replay = _STATE["replay"]
    if replay is None or replay[2] is None:
        return None
    return replay[1], replay[2]


def replayable(test: Any) -> Any:
    """``test`` (a hypothesis test or state machine) set to run only the replayed example.

    Tests that build their ``@given`` function at run time wrap it with this;
    top-level ``@given`` tests get the same from ``pytest_runtest_call``.
    """
    replay = current_replay()
    if replay is None:
        return test
    from hypothesis import reproduce_failure

    return reproduce_failure(replay[0], replay[1])(test)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """Set up a top-level ``@given`` test for this item, and undo it afterwards.

    A replay runs only the replayed example; a backend that runs interpreted
    gets its share of the test's examples. The function object is shared by
    every backend's item and outlives the run, so both are undone.
    """
    test = getattr(item, "obj", None)
    entry = backend_entry_of(item)
    if test is None or not hasattr(test, "hypothesis"):
        yield
        return
    settings_attribute = "_hypothesis_internal_use_settings"
    own_settings = getattr(test, settings_attribute, None)
    if entry is not None and own_settings is not None and interpreted_here(entry):
        from hypothesis import settings

        from harness.conformance.profiles import Profile

        fewer = Profile.scaled_examples(own_settings.max_examples)
        setattr(test, settings_attribute, settings(own_settings, max_examples=fewer))
    if current_replay() is not None:
        replayable(test)
    try:
        yield
    finally:
        setattr(test, settings_attribute, own_settings)
        test._hypothesis_internal_use_reproduce_failure = None


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
    entry = backend_entry_of(item)
    counted = report.when == "call" or (report.when == "setup" and not report.passed)
    if entry is None or not counted:
        return
    item.user_properties.append(("backend", entry.name))  # kept in --junitxml
    module = getattr(item, "module", None)
    if module is not None:
        _STATE["modules"].setdefault(entry.name, set()).add(module.__name__)
    function = getattr(item, "originalname", item.name)
    _STATE["verdicts"].record(entry.name, function, report.outcome)
    if report.failed:
        failure = _failure(item, entry.name, call.excinfo)
        _STATE["verdicts"].failures.append(failure)
        report.sections.append(
            ("replay", f"backend {entry.name!r}, property {function}:\n  {failure.replay}")
        )


def _failure(item: pytest.Item, backend: str, excinfo: Any) -> Any:
    """The failure as its entry in the summary: detail, scenario, replay command."""
    from harness.conformance.report import Failure, failure_text, replay_token, reproduce_blob

    exc = excinfo.value if excinfo is not None else None
    detail, scenario = failure_text(exc) if exc is not None else ("error in setup", "")
    blob = reproduce_blob(exc) if exc is not None else None
    if blob is not None:
        token = replay_token(item.name, *blob)
    elif _STATE["replay"] is not None:  # a replay does not print its blob again: reuse it
        token = item.config.getoption("replay")
    else:
        token = item.name
    return Failure(backend, item.name, detail, scenario, _replay_command(backend, token))


def _replay_command(backend: str, token: str) -> str:
    """The one command that reruns ``token``'s example, with the Python that ran this one."""
    profile = _STATE["profile"]
    device = [] if _STATE["device"] == "cpu" else ["--device", _STATE["device"]]
    if _STATE["cli"]:
        launcher = (
            ["attn-harness"]
            if Path(sys.argv[0]).name == "attn-harness"
            else [sys.executable, "-m", "harness"]
        )
        args = [*launcher, "conform", "--backend", backend, "--profile", profile, *device]
    else:
        args = [sys.executable, "-m", "pytest", "--pyargs", "suites.conformance"]
        args += ["-p", "attn_harness_pytest", "--backend", backend]
        args += ["--conformance-profile", profile]
        args += ["--conformance-device", _STATE["device"]] if device else []
    return shlex.join([*args, "--replay", token])


def _requirements(entry: Any) -> list[Any]:
    """What the profile promises to reach inside ``entry``'s claim (nothing if it does not)."""
    from harness.conformance.claim_coverage import requirements
    from harness.conformance.large_pool import large_pool_scenario, unavailable_reason

    profile = profile_for(entry)
    if not profile.enforces_coverage:
        return []
    budget = profile.budget
    large = large_pool_scenario(entry.capabilities, _STATE["device"])
    return requirements(
        entry.capabilities,
        dp_aware=entry.accepts_dp,
        max_dp_size=budget.max_dp_size,
        max_context=budget.max_context,
        limit=budget.production,
        large_pool=large is not None and unavailable_reason(large) is None,
    )


def _whole_suite_ran(name: str) -> bool:
    """Every conformance module ran for this backend and nothing was deselected."""
    import suites.conformance as package

    expected = {
        f"{package.__name__}.{m.name}"
        for m in pkgutil.iter_modules(package.__path__)
        if m.name.startswith("test_")
    }
    return not _STATE["deselected"] and expected <= _STATE["modules"].get(name, set())


def _coverage_gaps() -> dict[str, list[Any]]:
    """Per backend whose whole suite ran: the promised values never checked."""
    if _STATE["coverage"] is None:
        return {}
    entries = {e.name: e for e in selected_entries()}
    gaps = {}
    for name, cover in _STATE["coverage"].backends.items():
        if name in entries and _whole_suite_ran(name):
            gaps[name] = cover.missing(_requirements(entries[name]))
    return gaps


def _coverage_json_path(config: pytest.Config) -> Path | None:
    explicit = config.getoption("coverage_json")
    if explicit:
        return Path(explicit)
    junit = config.getoption("xmlpath", None)
    return Path(junit).with_suffix(".coverage.json") if junit else None


def _coverage_lines(full: bool) -> list[str]:
    """The coverage table of each backend (``full``), or one line each."""
    log = _STATE["coverage"]
    if log is None:
        return []
    entries = {e.name: e for e in selected_entries()}
    lines = []
    for name in sorted(log.backends):
        whole = name in entries and _whole_suite_ran(name)
        wanted = _requirements(entries[name]) if whole else []
        if full:
            table = log.table(name, wanted)
            lines += [""] + [f"attn-harness {line}" if line[0] != " " else line for line in table]
            continue
        cover = log.backends[name]
        gaps = cover.missing(wanted)
        if wanted:
            promise = (
                f"{len(gaps)} promised value(s) never checked (below)"
                if gaps
                else "every promised value checked"
            )
        elif not whole:
            promise = "not required (part of the suite ran)"
        else:
            promise = f"not required by the {profile_for(entries[name]).name} profile"
        steps = sum(cover.totals()["dtype"].values())
        held = f"{sum(cover.examples.values())} examples held, {steps} rank-steps"
        lines.append(f"attn-harness coverage of {name!r}: {held}; {promise}")
    examples = _STATE["examples"]
    if examples is not None and examples < get_default_examples():
        lines.append(
            f"attn-harness: --examples {examples}, fewer than the {_STATE['profile']} "
            f"profile's {get_default_examples()}: coverage is reported, not required"
        )
    return lines


def _problems() -> list[tuple[str, str]]:
    """Why a run whose tests passed still fails, as (what, what it means): gaps, nothing checked."""
    problems = []
    for name, gaps in sorted(_coverage_gaps().items()):
        if gaps:
            problems.append(
                (
                    f"backend {name!r} passed nothing for "
                    + "; ".join(f"{g.dimension} {g.wanted}" for g in gaps),
                    "the profile promises these inside its claim. Declare what the backend "
                    "cannot do in capabilities(), or see which draws it refused.",
                )
            )
    for name in _STATE["verdicts"].nothing_checked():
        problems.append(
            (
                f"nothing could be checked for backend {name!r}",
                "every conformance test was skipped (outside its declared capabilities)",
            )
        )
    return problems


def _problem_lines(problems: list[tuple[str, str]]) -> list[str]:
    return [f"attn-harness: {what}: {meaning}" for what, meaning in problems]


def _verdict_lines() -> list[str]:
    """The verdict table (backend x property) and one entry per failure."""
    from harness.conformance.report import failure_lines, verdict_rows
    from harness.core.text_table import aligned

    verdicts = _STATE["verdicts"]
    if verdicts is None or not verdicts.outcomes:
        return []
    examples = {name: cover.examples for name, cover in coverage_log().backends.items()}
    lines = ["", *aligned(verdict_rows(verdicts, examples))]
    if verdicts.failures:
        lines.append("")
    for failure in verdicts.failures:
        lines += failure_lines(failure)
    return lines


def _compact_summary(seconds: float) -> list[str]:
    """What ``attn-harness conform`` prints at the end (``--conformance-output compact``)."""
    from harness.conformance.report import closing_line

    problems = _problems()
    full = "coverage tables: -v; as JSON: --junitxml FILE, or -- --coverage-json FILE"
    coverage = _coverage_lines(full=False)
    if _STATE["coverage"] is not None:
        coverage.append(f"  ({full})")
    lines = [*_verdict_lines(), "", *coverage, *_problem_lines(problems)]
    reasons = [what for what, _ in problems]
    return [*lines, closing_line(_STATE["verdicts"], seconds, reasons)]


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    for line in _coverage_lines(full=True):
        terminalreporter.write_line(line)
    for line in _problem_lines(_problems()):
        terminalreporter.write_line(line, red=True)
    for line in _verdict_lines():
        terminalreporter.write_line(line, red=line.startswith("FAILED"))


@pytest.hookimpl(tryfirst=True)  # before the JUnit writer saves its file
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        return  # a run cut short writes no coverage file and changes no verdict
    _save_coverage(session.config)
    if any(_coverage_gaps().values()) and session.exitstatus == 0:
        session.exitstatus = 1
    if _STATE["verdicts"].nothing_checked() and session.exitstatus == 0:
        session.exitstatus = 1


def _save_coverage(config: pytest.Config) -> None:
    """The tally as JSON next to the JUnit file, and as its test-suite properties."""
    log = _STATE["coverage"]
    if log is None:
        return
    entries = {e.name: e for e in selected_entries()}
    wanted = {
        name: _requirements(entries[name])
        for name in log.backends
        if name in entries and _whole_suite_ran(name)
    }
    data = {
        "profile": _STATE["profile"],
        "examples_per_test": int(current_profile().settings.max_examples),
        "backends": log.as_json(wanted),
    }
    path = _coverage_json_path(config)
    if path is not None:
        write_json_atomically(path, data)
    try:
        from _pytest.junitxml import xml_key  # what record_testsuite_property uses
    except ImportError:  # pragma: no cover - a future pytest without it
        return
    xml = config.stash.get(xml_key, None)
    if xml is None:
        return
    for name, backend in data["backends"].items():
        xml.add_global_property(f"coverage[{name}].examples", backend["examples"])
        for dimension, counts in backend["dimensions"].items():
            cells = "; ".join(f"{label}={n}" for label, n in counts.items())
            xml.add_global_property(f"coverage[{name}].{dimension}", cells)
        if backend["stateful"].get("runs"):
            stateful = backend["stateful"]
            xml.add_global_property(
                f"coverage[{name}].stateful",
                f"runs={stateful['runs']} steps_median={stateful['steps_median']} "
                f"steps_p10={stateful['steps_p10']}",
            )
        if backend["never_checked"]:
            xml.add_global_property(
                f"coverage[{name}].never_checked", "; ".join(backend["never_checked"])
            )
