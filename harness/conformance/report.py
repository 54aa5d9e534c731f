"""What a conformance run tells its user: a live line, the verdict table, one entry per failure.

The pytest plugin records how each conformance test ended (``Verdicts``);
this module turns that into text. ``attn-harness conform`` shows only this
(``CompactReporter`` stands in for pytest's terminal output); a plain
``pytest --pyargs suites.conformance`` run, or ``conform -v``, shows pytest's
full report and ends with the same verdict table and failure entries.
"""

from __future__ import annotations

import ast
import bisect
import os
import re
import shlex
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from harness.conformance.plugin_names import backend_entry_of
from harness.conformance.progress import progress_display, seconds_left
from harness.core import text_table
from harness.processes.progress_file import report_progress

_BLOB = re.compile(r"@reproduce_failure\('([^']+)', b'([^']*)'\)")


@dataclass(frozen=True)
class FailureEntry:
    """One failed conformance test, in the words a backend author acts on."""

    backend: str
    test: str  # the test's name with its parameters, as ``--replay`` selects it
    detail: str  # what went wrong: the error against the bound, the crash, the refusal
    scenario: str  # the shrunk draw in words ("" when the test draws none)
    replay: str  # the one command that reruns exactly this failure


@dataclass
class Verdicts:
    """How each backend's conformance tests ended, per test function."""

    outcomes: dict[str, dict[str, Counter[str]]] = field(default_factory=dict)
    failures: list[FailureEntry] = field(
        default_factory=list
    )  # in the order the suite collects them
    positions: list[int] = field(default_factory=list)  # each failure's index in the collection

    def add_failure(self, failure: FailureEntry, position: int) -> None:
        """Keep ``failure`` in collection order, whichever process ran it and when."""
        at = bisect.bisect_right(self.positions, position)
        self.positions.insert(at, position)
        self.failures.insert(at, failure)

    def record(self, backend: str, function: str, outcome: str) -> None:
        self.outcomes.setdefault(backend, {}).setdefault(function, Counter())[outcome] += 1

    @property
    def tests(self) -> int:
        return sum(sum(c.values()) for tests in self.outcomes.values() for c in tests.values())

    def count(self, outcome: str) -> int:
        return sum(c[outcome] for tests in self.outcomes.values() for c in tests.values())

    def nothing_checked(self) -> list[str]:
        """Backends none of whose tests passed or failed (all skipped: outside the claim)."""
        return sorted(
            backend
            for backend, tests in self.outcomes.items()
            if not any(c["passed"] or c["failed"] for c in tests.values())
        )


def failure_text(exc: BaseException) -> tuple[str, str]:
    """``(detail, scenario)`` of a failed test's exception, without tracebacks or dumps.

    Property failures read ``PROPERTY violated by backend 'X'`` / ``scenario:
    ...`` / the detail; crashes, overruns and refusals put the detail first.
    A group of distinct failures (hypothesis found several) is read from its
    first member.
    """
    others = 0
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        others += len(exc.exceptions) - 1
        exc = exc.exceptions[0]
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__, ""
    scenarios = [line.removeprefix("scenario: ") for line in lines if line.startswith("scenario:")]
    rest = [line for line in lines[1:] if not line.startswith("scenario:")]
    if "violated by backend" in lines[0] and rest:
        detail = rest[0]
    else:
        detail = lines[0]
        if not isinstance(exc, AssertionError) and type(exc).__name__ not in detail:
            detail = f"{type(exc).__name__}: {detail}"
    if others:
        detail += f" (and {others} other distinct failure{'s' if others > 1 else ''})"
    detail += "".join(f"\n{line}" for line in rest if line.startswith("claimed vs drawn:"))
    return detail, scenarios[0] if scenarios else ""


def reproduce_blob(exc: BaseException) -> tuple[str, str] | None:
    """``(hypothesis version, blob)`` of the failing example, from hypothesis's notes."""
    stack = [exc]
    while stack:
        current = stack.pop(0)
        for note in getattr(current, "__notes__", ()):
            match = _BLOB.search(note)
            if match:
                return match.group(1), match.group(2)
        if isinstance(current, BaseExceptionGroup):
            stack.extend(current.exceptions)
    return None


def replay_token(test: str, version: str, blob: str) -> str:
    """The value of ``--replay``: ``TEST@HYPOTHESIS_VERSION:BLOB``."""
    return f"{test}@{version}:{blob}"


def parse_replay(value: str) -> tuple[str, str, bytes]:
    """``(test, version, blob)`` from a ``--replay`` value; ``ValueError`` names what is wrong."""
    test, at, rest = value.rpartition("@")
    version, colon, blob = rest.partition(":")
    if not (at and colon and test and version and blob):
        raise ValueError(
            f"--replay expects TEST@VERSION:BLOB as a failure report prints it, got {value!r}"
        )
    from hypothesis.core import decode_failure
    from hypothesis.errors import InvalidArgument

    try:
        data = ast.literal_eval(f"b'{blob}'")
        decode_failure(data)  # a copy cut short (its '==' left on the next line) fails here
    except (SyntaxError, ValueError, InvalidArgument) as exc:
        raise ValueError(
            f"--replay: {blob!r} is not a whole hypothesis failure blob (copy the whole "
            f"replay value, up to and including any '=' at its end)"
        ) from exc
    return test, version, data


def _cell(counts: Counter[str], examples: int, unchecked: int = 0) -> str:
    runs = sum(counts.values())
    if counts["failed"]:
        return f"FAILED {counts['failed']}/{runs}" if runs > 1 else "FAILED"
    left = f", {unchecked} not checked" if unchecked else ""
    if counts["passed"]:
        skipped = f", {counts['skipped']} unsupported" if counts["skipped"] else ""
        held = f"{examples} ex" if examples else _plural(counts["passed"], "case")
        return f"passed ({held}{left}){skipped}"
    if unchecked:
        return f"not checked ({unchecked} over budget)"
    return "unsupported"


def verdict_rows(
    verdicts: Verdicts,
    examples: dict[str, Counter[str]],
    unchecked: dict[str, Counter[str]] | None = None,
) -> list[list[str]]:
    """Header and one row per test function: a cell per backend (outcome, examples held,
    examples an interpreted run's cost budget left unchecked)."""
    backends = list(verdicts.outcomes)
    functions: list[str] = []
    for tests in verdicts.outcomes.values():
        functions += [f for f in tests if f not in functions]
    rows = [["property", *backends]]
    for function in sorted(functions):
        cells = []
        for backend in backends:
            counts = verdicts.outcomes[backend].get(function)
            held = examples.get(backend, Counter())[function]
            left = (unchecked or {}).get(backend, Counter())[function]
            cells.append("-" if counts is None else _cell(counts, held, left))
        rows.append([function, *cells])
    return rows


INDENT = " " * 7  # under "FAILED " and "CAUSE  "


UNWRAPPED = 10**6  # a width no line reaches: logs keep whole lines


def terminal_width() -> int:
    """Columns to fit: ``COLUMNS`` when set, else the terminal's; unlimited in a log.

    Output to a file or a pipe stays in whole lines (a log is searched for
    phrases), unless ``COLUMNS`` asks for a width.
    """
    if os.environ.get("COLUMNS", "").isdigit() or sys.stdout.isatty():
        return max(40, text_table.terminal_width())
    return UNWRAPPED


def shell_lines(command: str, width: int) -> list[str]:
    """``command`` as shell lines of at most ``width`` columns that paste back as one.

    Arguments are packed onto lines ended by `` \\``; an argument longer
    than a line (a replay blob) is cut into quoted pieces joined by a
    backslash-newline, which the shell removes. Continuation lines start at
    column 0, since an indent would split the argument.
    """
    lines: list[str] = []
    current = ""
    for arg in shlex.split(command):
        quoted = shlex.quote(arg)
        if current and len(current) + 1 + len(quoted) + 2 > width:
            lines.append(current + " \\")
            current = ""
        if len(quoted) + 2 <= width:
            current = f"{current} {quoted}" if current else quoted
            continue
        step = max(8, width - 4)
        pieces = [shlex.quote(arg[i : i + step]) for i in range(0, len(arg), step)]
        if current:
            lines.append(current + " \\")
        lines += [piece + "\\" for piece in pieces[:-1]]
        current = pieces[-1]
    if current:
        lines.append(current)
    return lines


def failure_lines(failure: FailureEntry, width: int | None = None) -> list[str]:
    """One failure's entry: what failed, the shrunk scenario, and the command to replay it."""
    width = width or terminal_width()
    test = shown_name(failure.test, failure.backend)
    first, *more = failure.detail.splitlines()
    lines = text_table.wrapped(
        f"{failure.backend} · {test}: {first}", width, INDENT, first="FAILED "
    )
    for line in more:
        lines += text_table.wrapped(line, width, INDENT, first=INDENT)
    if failure.scenario:
        scenario = f"scenario: {failure.scenario}"
        lines += text_table.wrapped(scenario, width, INDENT + " " * 10, first=INDENT)
    label = f"{INDENT}replay:   "
    if len(label) + len(failure.replay) <= width:
        lines.append(label + failure.replay)
    else:
        lines += [f"{INDENT}replay:", *shell_lines(failure.replay, width)]
    return lines


def printed_replay(output: str) -> list[str]:
    """The first replay command in ``output`` as its arguments (continuation lines joined).

    The inverse of what ``failure_lines`` prints, for scripts and tests.
    """
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith("replay:"):
            text = line.split("replay:", 1)[1]
            if not text.strip():
                text = ""
                for follow in lines[i + 1 :]:
                    text += follow + "\n"
                    if not follow.endswith("\\"):
                        break
            return shlex.split(text.replace("\\\n", ""))
    raise ValueError("no replay command in the output")


def grouped_failure_lines(group: Any, every_failure: bool) -> list[str]:
    """A group of failures: its triage line, then its entries (or one, and the rest named)."""
    from harness.conformance.triage import cause_line

    width = terminal_width()
    first = group.failures[0]
    lines = text_table.wrapped(
        f"{first.backend} · {cause_line(group)}", width, INDENT, first="CAUSE  "
    )
    shown = group.failures if every_failure else group.failures[:1]
    for failure in shown:
        lines += failure_lines(failure, width)
    rest = group.failures[len(shown) :]
    if rest:
        names = [shown_name(f.test, f.backend) for f in rest]
        listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        more = f"{_plural(len(rest), 'more failure')} like it: {listed} (-v lists each)"
        lines += text_table.wrapped(more, width, INDENT, first=INDENT)
    return lines


def closing_line(
    verdicts: Verdicts,
    seconds: float,
    problems: list[str],
    replayed: str | None = None,
    not_checked: int = 0,
) -> str:
    """The run's last line; ``replayed`` names a replayed test whose example passes now,
    ``not_checked`` counts examples an interpreted run's cost budget left out."""
    failed, tests = verdicts.count("failed"), verdicts.tests
    if replayed is not None and not failed and not problems:
        verdict = f"PASSED: the replayed example of {replayed} passes now (the fix held)"
    elif failed:
        names = sorted({f.backend for f in verdicts.failures}) or sorted(verdicts.outcomes)
        verdict = f"FAILED: {failed} of {_plural(tests, 'test')} failed ({', '.join(names)})"
    elif problems:
        verdict = "FAILED: " + "; ".join(problems)
    else:
        backends = ", ".join(verdicts.outcomes) or "no backend"
        skipped = verdicts.count("skipped")
        notes = [f"{skipped} unsupported, not run"] if skipped else []
        if not_checked:
            notes.append(f"{_plural(not_checked, 'example')} not checked, over budget")
        counted = "; ".join([_plural(tests, "test"), *notes])
        verdict = f"PASSED: every property held for {backends} ({counted})"
    return f"attn-harness conform: {verdict} in {seconds:.0f} s"


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def shown_name(test: str, backend: str) -> str:
    """A test's name without its backend: ``test_x[reference-float32]`` -> ``test_x[float32]``."""
    name, bracket, params = test.partition("[")
    if not bracket:
        return test
    rest = params[:-1].removeprefix(backend).lstrip("-")
    return f"{name}[{rest}]" if rest else name


def _quiet() -> bool:
    return bool(os.environ.get("CI")) or not sys.stdout.isatty()


class CompactReporter:
    """Stands in for pytest's terminal reporter under ``attn-harness conform``.

    It prints a header naming the backends, a live line on a terminal, and at
    the end what ``summary()`` (given by the plugin) returns. Collection
    errors and interruptions get one line each; pytest's full report is a
    ``-v`` away.
    """

    def __init__(
        self, config: Any, summary: Any, notes: Any = list, selected: Any = list, workers: int = 1
    ) -> None:
        self.config = config
        self.summary = summary  # () -> list[str], the verdict table and the rest
        self.notes = notes  # () -> list[str], how the profile was sized for each backend
        self.selected = selected  # () -> the selected backend entries
        self.workers = workers  # processes running the tests (xdist workers), 1: this one
        self.live: Any = None  # progress.LiveLine on a terminal, else progress.PlainProgress
        self.total = 0
        self.done = 0
        self.started = time.monotonic()
        self.errors: list[str] = []
        self.interrupted: str | None = None
        self.backends: list[str] = []
        self.functions = 0
        self.header_printed = False
        self.out = sys.stdout

    def write(self, line: str = "") -> None:
        print(line, file=self.out, flush=True)

    def say(self, line: str) -> None:
        """A sentence of the run's own (header, coverage, verdict): fitted to the width."""
        for part in text_table.wrapped(line, terminal_width()):
            self.write(part)

    # -- pytest hooks -----------------------------------------------------

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:  # each worker reports its collection: say it once
            text = str(report.longrepr).strip().splitlines()
            error = f"could not collect {report.nodeid or 'the suite'}: {text[-1]}"
            if error not in self.errors:
                self.errors.append(error)

    def pytest_collection_finish(self, session: Any) -> None:
        self.total = len(session.items)
        self.backends = []
        for item in session.items:
            entry = backend_entry_of(item)
            if entry is not None and entry.name not in self.backends:
                self.backends.append(entry.name)
        self.functions = len({getattr(i, "originalname", i.name) for i in session.items})

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """Spread over workers, the controller collects nothing: the first worker's ids."""
        if self.total:
            return
        from harness.conformance.workers import backend_in_nodeid

        self.total = len(ids)
        names = [e.name for e in self.selected()]
        for nodeid in ids:
            backend = backend_in_nodeid(nodeid, names)
            if backend is not None and backend not in self.backends:
                self.backends.append(backend)
        self.functions = len({i.rpartition("::")[2].partition("[")[0] for i in ids})

    def header(self) -> None:
        """What runs, printed once the run starts (a usage error prints none)."""
        if self.header_printed:
            return
        self.header_printed = True
        option = self.config.option
        threads = ""
        if option.conformance_device == "cpu" and "torch" in sys.modules:
            threads = f" · torch threads {sys.modules['torch'].get_num_threads()}"
        self.say(
            f"attn-harness conform: {', '.join(self.backends) or 'no backend'} · "
            f"{_plural(self.functions, 'property', 'properties')}, "
            f"{_plural(self.total, 'test')} · profile {option.conformance_profile} · "
            f"device {option.conformance_device}{threads}"
            + (f" · {self.workers} workers" if self.workers > 1 else "")
        )
        for note in self.notes():
            self.say(f"  {note}")

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        if self.live is None:
            self.header()
            every = float(self.config.getoption("progress_every", 30.0))
            width = terminal_width()
            self.live = progress_display(
                ", ".join(self.backends),
                quiet=_quiet(),
                every_s=every,
                width=None if width == UNWRAPPED else width,
                per_test=self.workers == 1,
            )
        label = nodeid.rpartition("::")[2]
        for backend in self.backends:
            if f"[{backend}" in label:
                label = shown_name(label, backend)  # the backend is named once, up front
        self.live.start_test(self.done, self.total, label)
        elapsed = time.monotonic() - self.started
        left_s = seconds_left(elapsed, self.done, self.total)
        report_progress(self.done, self.total, left_s=left_s, label=label)

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        self.done += 1

    def example_held(self) -> None:
        if self.live is not None:
            self.live.example_held()

    def examples_held(self, count: int) -> None:
        """A test that ran in a worker ended, having held ``count`` examples."""
        if self.live is not None and count:
            self.live.add_examples(count)

    def pytest_keyboard_interrupt(self, excinfo: Any) -> None:
        self.interrupted = "interrupted (Ctrl-C): no report written"

    def pytest_internalerror(self, excrepr: Any, excinfo: Any) -> bool:
        self.errors.append(f"internal error: {excinfo.typename}: {excinfo.value}")
        return False

    @pytest.hookimpl(trylast=True)  # after the plugin has settled the exit status
    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        if self.live is not None:
            self.live.stop()
        if exitstatus == pytest.ExitCode.USAGE_ERROR:
            return  # the caller prints the usage error; there is no verdict
        if self.interrupted and session.exitstatus == pytest.ExitCode.INTERRUPTED:
            # (-x under pytest-xdist also ends by an interruption, which the plugin has
            # turned back into a failed run by now)
            print(f"attn-harness conform: {self.interrupted}", file=sys.stderr, flush=True)
            return
        self.header()
        for error in self.errors:
            self.write(f"attn-harness conform: error: {error}")
        for line in self.summary(time.monotonic() - self.started):
            # its own sentences wrap; table rows and failure entries come fitted already
            (self.say if line.startswith("attn-harness") else self.write)(line)
