"""A failed conformance test as the run reports it: its entry (detail, scenario, the
one command that replays it), a test whose worker process died, and a replay that
passed. The plugin calls these from its report hooks."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from harness.conformance.workers import TestVerdict, backend_in_nodeid

if TYPE_CHECKING:
    import pytest

    from harness.conformance.session import ConformanceSession


def failure_entry(item: pytest.Item, run: ConformanceSession, backend: str, excinfo: Any) -> Any:
    """The failure as its entry in the summary: detail, scenario, replay command."""
    from harness.conformance.report import FailureEntry, failure_text, replay_token, reproduce_blob

    exc = excinfo.value if excinfo is not None else None
    detail, scenario = failure_text(exc) if exc is not None else ("error in setup", "")
    blob = reproduce_blob(exc) if exc is not None else None
    if blob is not None:
        token = replay_token(item.name, *blob)
    elif run.replay is not None:  # a replay does not print its blob again: reuse it
        token = item.config.getoption("replay")
    else:
        token = item.name
    return FailureEntry(backend, item.name, detail, scenario, run.replay_command(backend, token))


def crashed_worker_verdict(run: ConformanceSession, report: pytest.TestReport) -> Any:
    """A test whose worker died carries no verdict of its own: a failure naming the crash."""
    if not report.failed or report.when != "???":  # xdist's report of a crashed test
        return None
    backend = backend_in_nodeid(report.nodeid, [e.name for e in run.selected_entries()])
    if backend is None:
        return None
    from harness.conformance.report import FailureEntry

    test = report.nodeid.rpartition("::")[2]
    text = str(report.longrepr).strip().splitlines()
    detail = f"its worker process died: {text[-1] if text else 'no message'}"
    failure = FailureEntry(backend, test, detail, "", run.replay_command(backend, test))
    return TestVerdict(
        backend=backend,
        module=None,
        function=test.partition("[")[0],
        outcome="failed",
        position=run.positions.get(report.nodeid, len(run.positions)),
        examples=0,
        failure=dataclasses.asdict(failure),
    )


def replay_passed(excinfo: pytest.ExceptionInfo[BaseException] | None) -> bool:
    """The replayed example ran to the end without failing (not: its data no longer fits).

    Hypothesis's ``reproduce_failure`` raises ``DidNotReproduce`` in both cases; only
    the first says the test completed.
    """
    from hypothesis.errors import DidNotReproduce

    if excinfo is None or not isinstance(excinfo.value, DidNotReproduce):
        return False
    return "completed successfully" in str(excinfo.value)
