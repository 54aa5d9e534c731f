"""The lines a conformance run prints: its header notes, the verdict table, the
failures grouped by cause, coverage, what the cost budget left, and the closing line.

Each function reads a :class:`~harness.conformance.session.ConformanceSession`
and returns lines; the plugin decides where they go (the compact reporter,
pytest's terminal summary).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.conformance import run_coverage

if TYPE_CHECKING:
    from harness.conformance.session import ConformanceSession


def sizing_notes(run: ConformanceSession) -> list[str]:
    """Header lines: backends left out of a default run, and how interpreted ones are sized."""
    entries = run.selected_entries()  # fills not_claiming
    notes = [
        f"{name} not run: registered, but claims no {run.device!r} device here "
        f"(attn-harness list --backend {name} shows its capabilities)"
        for name in run.not_claiming
    ]
    for entry in entries:
        if run.interpreted_here(entry):
            profile = run.profile_for(entry)
            notes.append(
                f"{entry.name} runs interpreted on {run.device}: profile {profile.name}, "
                f"{profile.settings.max_examples} examples per property "
                f"(of {run.profile().settings.max_examples}) on smaller shapes, "
                f"{profile.production_examples} per production regime, at most "
                f"{profile.cost_budget_s:g} s of examples in all, parted among its tests "
                "(by predicted cost); "
                "coverage is reported, not required"
            )
    if run.pool_note is not None:
        notes.append(f"{run.pool_note}: examples may depend on which tests ran before")
    if run.shrink_limit is not None:
        notes.append(
            f"a failure is shrunk for at most {run.shrink_limit:g} s (a backend runs "
            "interpreted; --shrink-time-limit or --max-shrinks sets it)"
        )
    return notes


def coverage_lines(run: ConformanceSession, full: bool) -> list[str]:
    """The coverage table of each backend (``full``), or one line each."""
    log = run.coverage
    if log is None:
        return []
    wanted_by_name = run_coverage.wanted(run)
    entries = {e.name: e for e in run.selected_entries()}
    lines = []
    for name in sorted(log.backends):
        wanted = wanted_by_name.get(name, [])
        if full:
            table = log.table(name, wanted)
            lines += [""]
            lines += [f"attn-harness {line}" if line[0] != " " else line for line in table]
            continue
        gaps = log.backends[name].missing(wanted)
        if wanted:
            promise = (
                f"{len(gaps)} promised value(s) never checked (below)"
                if gaps
                else "every promised value checked"
            )
        elif name not in wanted_by_name:
            promise = "not required (part of the suite ran)"
        else:
            promise = f"not required by the {run.profile_for(entries[name]).name} profile"
        cover = log.backends[name]
        steps = sum(cover.totals()["dtype"].values())
        held = f"{sum(cover.examples.values())} examples held, {steps} rank-steps"
        lines.append(f"attn-harness coverage of {name!r}: {held}; {promise}")
    examples = run.options.examples
    if examples is not None and examples < run.default_examples():
        lines.append(
            f"attn-harness: --examples {examples}, fewer than the {run.options.profile} "
            f"profile's {run.default_examples()}: coverage is reported, not required"
        )
    return lines


def cost_lines(run: ConformanceSession) -> list[str]:
    """What the interpreted backends' cost budget left unchecked, one line per backend."""
    if run.cost is None:
        return []
    return list(run.cost.summary_lines(run.profile().name + " (interpreted)"))


def problems_of(run: ConformanceSession) -> list[tuple[str, str]]:
    """Why a run whose tests passed still fails, as (what, what it means)."""
    problems = []
    for name, gaps in sorted(run_coverage.coverage_gaps(run).items()):
        if gaps:
            failed = sum(c["failed"] for c in run.verdicts.outcomes.get(name, {}).values())
            meaning = (
                "tests of it failed, and a failing test draws nothing after its failure: "
                "fix the failures first; these values may well be reached then."
                if failed
                else "the profile promises these inside its claim. Declare what the "
                "backend cannot do in capabilities(), or see which draws it refused."
            )
            problems.append(
                (
                    f"backend {name!r} passed nothing for "
                    + "; ".join(f"{g.dimension} {g.wanted}" for g in gaps),
                    meaning,
                )
            )
    for name in run.verdicts.nothing_checked():
        problems.append(
            (
                f"nothing could be checked for backend {name!r}",
                "every conformance test was skipped (outside its declared capabilities)",
            )
        )
    return problems


def problem_lines(
    run: ConformanceSession, problems: list[tuple[str, str]] | None = None
) -> list[str]:
    """``problems`` (default: this run's) as the lines the run ends with."""
    found = problems_of(run) if problems is None else problems
    return [f"attn-harness: {what}: {meaning}" for what, meaning in found]


def verdict_lines(run: ConformanceSession, every_failure: bool = True) -> list[str]:
    """The verdict table (backend x property), then the failures grouped by cause.

    Each group opens with its triage line; ``every_failure`` prints an
    entry for every failure (``-v``, plain pytest), otherwise one
    representative per group and the rest named.
    """
    from harness.conformance.report import (
        UNWRAPPED,
        failure_lines,
        grouped_failure_lines,
        terminal_width,
        verdict_rows,
    )
    from harness.core.text_table import aligned, fitted

    if not run.verdicts.outcomes:
        return []
    examples = {name: cover.examples for name, cover in run.coverage_log().backends.items()}
    rows = verdict_rows(run.verdicts, examples, run.not_checked_counts())
    width = terminal_width()
    table = (fitted(rows, width) if width < UNWRAPPED else None) or aligned(rows)
    lines = ["", *table]
    if run.verdicts.failures:
        lines.append("")
    for group in run.failure_groups():
        if len(run.verdicts.failures) > 1:
            lines += grouped_failure_lines(group, every_failure)
        else:
            lines += failure_lines(group.failures[0])
    return lines


def compact_summary(run: ConformanceSession, seconds: float) -> list[str]:
    """What ``attn-harness conform`` prints at the end (``--conformance-output compact``)."""
    from harness.conformance.report import closing_line

    problems = problems_of(run)
    full = "coverage tables: -v; as JSON: --junitxml FILE, or -- --coverage-json FILE"
    coverage = coverage_lines(run, full=False)
    if run.coverage is not None:
        coverage.append(f"  ({full})")
    lines = [*verdict_lines(run, every_failure=False), "", *coverage]
    lines += cost_lines(run)
    lines += problem_lines(run, problems)
    replayed = run.replay[0] if run.replay_held and run.replay is not None else None
    return [
        *lines,
        closing_line(
            run.verdicts,
            seconds,
            [what for what, _ in problems],
            replayed,
            not_checked=0 if run.cost is None else len(run.cost.skipped),
        ),
    ]
