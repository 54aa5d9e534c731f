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

State: each run's options and tallies live in one
``harness.conformance.session.ConformanceSession`` in that run's
``config.stash``; the functions the suite calls (``current_profile``,
``record_examples``, ...) reach the running one through a context variable
that ``pytest_configure`` sets and ``pytest_unconfigure`` restores, so runs
nested in one process (``pytester``, ``attn-harness conform`` in-process)
never see each other's options.

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

import dataclasses
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from pathlib import Path
from typing import Any

import pytest

from harness.conformance import run_coverage, session_lines
from harness.conformance.failure_entries import (
    crashed_worker_verdict,
    failure_entry,
    replay_passed,
)
from harness.conformance.options import ConformanceOptions, add_options
from harness.conformance.plugin_names import PROFILE_NAMES as PROFILES
from harness.conformance.plugin_names import backend_entry_of, cache_root
from harness.conformance.session import ConformanceSession
from harness.conformance.workers import (
    REPORT_ATTRIBUTE,
    WORKEROUTPUT_KEY,
    TestVerdict,
    add_tallies,
    is_controller,
    is_worker,
    pack_tallies,
    unpack_tallies,
    verdict_of,
    worker_count,
)
from harness.core.atomic_file import write_json_atomically

SESSION_KEY = pytest.StashKey[ConformanceSession]()
"""Where a run's :class:`ConformanceSession` lives: ``config.stash[SESSION_KEY]``."""
_TOKEN_KEY = pytest.StashKey[Token[ConformanceSession | None]]()
_SHRINK_KEY = pytest.StashKey[float]()  # hypothesis's shrink budget before this run lowered it
_POOL_KEY = pytest.StashKey[Any]()  # undoes this run's fixed pool of hypothesis's constants
_ACTIVE: ContextVar[ConformanceSession | None] = ContextVar("attn_harness_session", default=None)
"""The session of the pytest run in progress in this context (``None`` outside one)."""

__all__ = [
    "PROFILES",
    "SESSION_KEY",
    "backend_entry_of",
    "cache_root",
    "current_device",
    "current_profile",
    "keep_hypothesis_files_out_of_the_working_directory",
    "profile_for",
    "record_examples",
    "record_failed_example",
    "record_run",
    "replayable",
    "selected_entries",
    "session",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser.getgroup("attn-harness", "attention backend conformance"))


def _options(namespace: Any) -> ConformanceOptions:
    try:
        return ConformanceOptions.from_namespace(namespace)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from exc


def _start(config: pytest.Config, options: ConformanceOptions) -> ConformanceSession:
    """A fresh session for this run, made the active one (the previous one kept to restore)."""
    try:
        made = ConformanceSession(options)
    except ValueError as exc:  # a malformed --replay
        raise pytest.UsageError(str(exc)) from exc
    config.stash[SESSION_KEY] = made
    if _TOKEN_KEY not in config.stash:
        config.stash[_TOKEN_KEY] = _ACTIVE.set(made)
    else:
        _ACTIVE.set(made)
    return made


INTERPRETED_SHRINK_S = 15.0
"""How long a failure is shrunk when a selected backend runs interpreted and no limit is asked."""


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Given the suite's folder, pytest imports its conftest before ``pytest_configure``."""
    _start(early_config, _options(early_config.known_args_namespace))


@pytest.hookimpl(trylast=True)  # after pytest's terminal reporter has registered itself
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "conformance: a conformance property of a backend")
    shrink = config.getoption("shrink_time_limit")
    if shrink is not None:
        _limit_shrinking(shrink)
    shrinks = config.getoption("max_shrinks")
    if shrinks is not None:
        _limit_shrinks(shrinks)
    run = _start(config, _options(config.option))
    try:
        run.resolve_backends()  # now, so an unloadable spec is a usage error before collection
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from exc
    if run.options.shard is not None and not is_worker(config):
        from harness.conformance.shard_runs import start_shard

        problem = start_shard(run, config, _coverage_json_path(config) is not None)
        if problem is not None:
            raise pytest.UsageError(problem)
    if is_worker(config):
        run.workers = worker_count(config)
    elif is_controller(config):
        run.workers = int(config.getoption("numprocesses", 1) or 1)
    if shrink is None and shrinks is None and run.runs_interpreted():
        from hypothesis.internal.conjecture import engine

        config.stash[_SHRINK_KEY] = getattr(engine, "MAX_SHRINKING_SECONDS", 300)
        _limit_shrinking(INTERPRETED_SHRINK_S)  # each shrink step re-runs an interpreted kernel
        run.shrink_limit = INTERPRETED_SHRINK_S
    if config.getoption("conformance_output") == "compact" and not is_worker(config):
        _install_compact_reporter(config, run)


def pytest_unconfigure(config: pytest.Config) -> None:
    undo_pool = config.stash.get(_POOL_KEY, None)
    if undo_pool is not None:
        undo_pool()
        del config.stash[_POOL_KEY]
    previous = config.stash.get(_SHRINK_KEY, None)
    if previous is not None:  # the next in-process run starts from hypothesis's own budget
        _limit_shrinking(previous)
    token = config.stash.get(_TOKEN_KEY, None)
    if token is not None:
        _ACTIVE.reset(token)
        del config.stash[_TOKEN_KEY]


def _install_compact_reporter(config: pytest.Config, run: ConformanceSession) -> None:
    """Put the compact reporter in the place of pytest's terminal output."""
    from harness.conformance.report import CompactReporter

    standard = config.pluginmanager.getplugin("terminalreporter")
    if standard is not None:
        config.pluginmanager.unregister(standard)
    reporter = CompactReporter(
        config,
        lambda seconds: session_lines.compact_summary(run, seconds),
        lambda: session_lines.sizing_notes(run),
        run.selected_entries,
        run.workers,
    )
    config.pluginmanager.register(reporter, "attn-harness-compact-reporter")
    run.reporter = reporter


def session(config: pytest.Config | None = None) -> ConformanceSession:
    """The running (or ``config``'s) conformance session.

    Outside a pytest run that loaded the plugin (the harness's own unit tests
    call the suite's checks directly) this is a session with the default
    options that counts nothing.
    """
    if config is not None:
        return config.stash[SESSION_KEY]
    active = _ACTIVE.get()
    return active if active is not None else ConformanceSession(ConformanceOptions())


@contextmanager
def active(run: ConformanceSession) -> Iterator[ConformanceSession]:
    """Make ``run`` the session the suite's functions see, for a test of the plugin."""
    token = _ACTIVE.set(run)
    try:
        yield run
    finally:
        _ACTIVE.reset(token)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Under pytest's own report: which profile applies (hypothesis's header says 'default')."""
    run = session(config)
    specs = config.getoption("backend") or ["every registered backend"]
    return [
        f"attn-harness: profile {run.options.profile} (its settings decorate each conformance "
        f"test), device {run.device}, backends: {', '.join(specs)}",
        *(f"attn-harness: {note}" for note in session_lines.sizing_notes(run)),
    ]


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


def _limit_shrinks(count: int) -> None:
    """Set hypothesis's budget of successful shrinks (a module constant, like the time's)."""
    if count <= 0:
        raise pytest.UsageError(f"--max-shrinks must be > 0, got {count}")
    from hypothesis.internal.conjecture import engine

    if not hasattr(engine, "MAX_SHRINKS"):
        raise pytest.UsageError("--max-shrinks: this hypothesis version has no shrink budget")
    engine.MAX_SHRINKS = count


# -- what the suite's modules call: each reads the running session -------------------------


def selected_entries() -> list[Any]:
    """The ``--backend`` entries; without one, every registered backend that claims the device."""
    return session().selected_entries()


def current_device() -> str:
    """The device chosen with ``--conformance-device``."""
    return session().device


def current_profile() -> Any:
    """The ``harness.conformance.profiles.Profile`` chosen on the command line."""
    return session().profile()


def profile_for(entry: Any) -> Any:
    """The profile that sizes ``entry``'s draws: lighter where it runs interpreted."""
    return session().profile_for(entry)


def cost_ledger(entry: Any) -> Any:
    """The run's ``CostLedger`` where ``entry`` runs interpreted, else ``None``."""
    return session().cost_ledger(entry)


def current_item() -> str:
    """The running conformance test's shown name, with its parameters."""
    return session().current_item()


def coverage_log() -> Any:
    """The run's ``harness.conformance.claim_coverage.CoverageLog``."""
    return session().coverage_log()


def record_examples(backend: str, scenarios: list[Any], *, example: bool = True) -> None:
    """Count one example of the running conformance test that held (every rank's step in it).

    Outside a conformance test (the harness's own unit tests call the same
    checks) nothing is counted.
    """
    session().record_examples(backend, scenarios, example=example)


def record_failed_example(backend: str, scenarios: list[Any]) -> None:
    """Note one example of the running conformance test that failed (the triage's evidence)."""
    session().record_failed_example(backend, scenarios)


def record_run(backend: str, run: Any) -> None:
    """Count one finished run of the stateful machine."""
    session().record_run(backend, run)


def replayable(test: Any) -> Any:
    """``test`` (a hypothesis test or state machine) set to run only the replayed example.

    Tests that build their ``@given`` function at run time wrap it with this;
    top-level ``@given`` tests get the same from ``pytest_runtest_call``.
    """
    return _replaying(test, session().replay_blob())


def _replaying(test: Any, replay: tuple[str, bytes] | None) -> Any:
    if replay is None:
        return test
    from hypothesis import reproduce_failure

    return reproduce_failure(*replay)(test)


# -- hooks that follow the run ---------------------------------------------------------------


def pytest_runtest_setup(item: pytest.Item) -> None:
    entry = backend_entry_of(item)
    name = getattr(item, "originalname", item.name)
    run = session(item.config)
    run.current_test = name if entry is not None else None
    run.current_case = ""
    run.examples_in_test = 0
    if entry is not None:
        from harness.conformance.report import shown_name

        run.current_case = shown_name(item.name, entry.name).partition("[")[2].rstrip("]")


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        session(items[0].config).deselected = True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run = session(config)
    replay = run.replay
    if replay is None:
        from harness.conformance.workers import longest_first

        if run.options.shard is not None:  # the share of the whole collection, in its order
            from harness.conformance.shard_runs import take_share

            items[:] = take_share(run, items)
        order = longest_first([getattr(item, "originalname", item.name) for item in items])
        items[:] = [items[i] for i in order]
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


def pytest_collection_finish(session: pytest.Session) -> None:
    """Count each backend's tests: an interpreted backend's budget is shared among them."""
    run = session.config.stash[SESSION_KEY]
    counts = run.tests_per_backend
    if run.collection is None:  # a shard numbered the whole collection already
        run.positions = {item.nodeid: i for i, item in enumerate(session.items)}
    if _POOL_KEY not in session.config.stash and any(map(backend_entry_of, session.items)):
        from harness.conformance.draw_constants import freeze_pool

        frozen = freeze_pool()
        if isinstance(frozen, str):
            run.pool_note = frozen
        else:
            session.config.stash[_POOL_KEY] = frozen
    for item in session.items:
        entry = backend_entry_of(item)
        if entry is not None:
            counts[entry.name] = counts.get(entry.name, 0) + 1


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
    run = session(item.config)
    if entry is not None and own_settings is not None and run.interpreted_here(entry):
        from hypothesis import settings

        from harness.conformance.profiles import Profile

        fewer = Profile.scaled_examples(own_settings.max_examples)
        setattr(test, settings_attribute, settings(own_settings, max_examples=fewer))
    _replaying(test, run.replay_blob())
    try:
        yield
    finally:
        setattr(test, settings_attribute, own_settings)
        test._hypothesis_internal_use_reproduce_failure = None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend_entry" in metafunc.fixturenames:
        entries = session(metafunc.config).selected_entries()
        metafunc.parametrize("backend_entry", entries, ids=[e.name for e in entries])


@pytest.fixture(scope="session")
def conformance_profile(request: pytest.FixtureRequest) -> Any:
    return session(request.config).profile()


@pytest.fixture(scope="session")
def conformance_session(request: pytest.FixtureRequest) -> ConformanceSession:
    """This run's :class:`ConformanceSession`: its options, backends and tallies."""
    return session(request.config)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    entry = backend_entry_of(item)
    counted = report.when == "call" or (report.when == "setup" and not report.passed)
    if entry is None or not counted:
        return
    item.user_properties.append(("backend", entry.name))  # kept in --junitxml
    run = session(item.config)
    if run.replay is not None and report.failed and replay_passed(call.excinfo):
        report.outcome, report.longrepr = "passed", None  # the fix held: green, not red
        report.sections.append(("replay", "the replayed example passes now: the fix held"))
        run.replay_held = True
    unchecked = len(run.unchecked_here(entry.name)) if report.when == "call" else 0
    if unchecked:  # the report (attn-harness report) shows them beside the examples held
        item.user_properties.append(("not_checked", str(unchecked)))
    reason = run.nothing_affordable(entry.name) if report.when == "call" and report.passed else None
    if reason is not None:  # every example over the cost budget: not checked, not passed
        report.outcome, report.longrepr = "skipped", (str(item.path), item.location[1] or 0, reason)
    module = getattr(item, "module", None)
    function = getattr(item, "originalname", item.name)
    failure = failure_entry(item, run, entry.name, call.excinfo) if report.failed else None
    if failure is not None:
        report.sections.append(
            ("replay", f"backend {entry.name!r}, property {function}:\n  {failure.replay}")
        )
    verdict = TestVerdict(
        backend=entry.name,
        module=getattr(module, "__name__", None),
        function=function,
        outcome=report.outcome,
        position=run.positions.get(item.nodeid, len(run.positions)),
        examples=run.examples_in_test,
        failure=None if failure is None else dataclasses.asdict(failure),
    )
    setattr(report, REPORT_ATTRIBUTE, verdict.as_payload())  # recorded where it is logged


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Record a finished conformance test: here, so the controller of a run spread over
    workers records every test its workers report (a test whose worker died included)."""
    run = session()
    verdict = verdict_of(report)
    if verdict is None:
        verdict = crashed_worker_verdict(run, report)
    if verdict is None:
        return
    run.record_verdict(verdict)
    if run.reporter is not None and run.workers > 1:
        run.reporter.examples_held(verdict.examples)


def _coverage_json_path(config: pytest.Config) -> Path | None:
    explicit = config.getoption("coverage_json")
    if explicit:
        return Path(explicit)
    junit = config.getoption("xmlpath", None)
    return Path(junit).with_suffix(".coverage.json") if junit else None


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    run = session(config)
    for line in session_lines.coverage_lines(run, full=True):
        terminalreporter.write_line(line)
    for line in session_lines.problem_lines(run):
        terminalreporter.write_line(line, red=True)
    for line in session_lines.verdict_lines(run):
        terminalreporter.write_line(line, red=line.startswith("FAILED"))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """A worker finished (xdist's controller): add what it tallied to this session."""
    data = getattr(node, "workeroutput", {}).get(WORKEROUTPUT_KEY)
    if data is not None:
        add_tallies(session(node.config), unpack_tallies(data))


@pytest.hookimpl(tryfirst=True)  # before the JUnit writer saves its file
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    run = config.stash[SESSION_KEY]
    if is_worker(config):  # the controller reports, saves and judges the whole run
        config.workeroutput[WORKEROUTPUT_KEY] = pack_tallies(run)  # type: ignore[attr-defined]
        return
    if exitstatus == pytest.ExitCode.INTERRUPTED and _stopped_at_maxfail(config, run):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # as pytest alone ends such a run
    if session.exitstatus == pytest.ExitCode.INTERRUPTED:
        return  # a run cut short writes no coverage file and changes no verdict
    if is_controller(config):  # the workers' fixture recorded no JUnit properties
        _junit_properties(config, run)
    _save_coverage(config, run)
    if any(run_coverage.coverage_gaps(run).values()) and session.exitstatus == 0:
        session.exitstatus = 1
    if run.verdicts.nothing_checked() and session.exitstatus == 0:
        session.exitstatus = 1


def _stopped_at_maxfail(config: pytest.Config, run: ConformanceSession) -> bool:
    """Whether the run stopped because ``-x`` / ``--maxfail`` was reached.

    pytest alone ends such a run as failed; pytest-xdist's controller stops
    its workers by raising an interruption of its own, which would otherwise
    read as a Ctrl-C and lose the failure it stopped for.
    """
    maxfail = int(config.getoption("maxfail", 0) or 0)
    return maxfail > 0 and run.verdicts.count("failed") >= maxfail


def _junit_properties(config: pytest.Config, run: ConformanceSession) -> None:
    """The tally as the JUnit report's test-suite properties, when this process writes it."""
    from _pytest.junitxml import xml_key

    xml = config.stash.get(xml_key, None)
    if xml is not None:
        for name, value in run_coverage.junit_properties(run):
            xml.add_global_property(name, value)


def _save_coverage(config: pytest.Config, run: ConformanceSession) -> None:
    """The tally as JSON next to the JUnit file (the suite's conftest also writes it into
    the JUnit report, through pytest's ``record_testsuite_property``)."""
    data = run_coverage.coverage_json(run)
    if run.options.shard is not None:  # a shard's file always carries what the merge needs
        from harness.conformance.shard_runs import shard_state

        data = {**(data or {}), "shard": shard_state(run)}
    if data is None:
        return
    path = _coverage_json_path(config)
    if path is not None:
        write_json_atomically(path, data)
