"""The report's ``summary.md``: what a pull-request comment needs, in GitHub Markdown.

The verdict first (one headline, conformance and performance per backend,
the measurement flags), then each conformance run with its failures, then
the performance compactly: one row per case, one column per backend (its
ratio to the in-run peer with the interval), the cases a backend declared it
cannot run collapsed into one line, and last the runs it was built from.
Every string from an input file goes through ``md``, which escapes what
could end a table cell (``|``, newlines), open code (backticks), start
formatting or a link, or become HTML (``<``, ``>``, ``&``), so a hostile
name shows as its text and cannot break the table.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from harness.bench.table import format_ns
from harness.report.formats import percent_range, ratio, ratio_range, workload_grid
from harness.report.stats import AnalysedRun, CaseStats
from harness.report.verdict import (
    ReportVerdict,
    engine_among,
    shown_cases,
    unsupported_groups,
    verdict_of,
)

if TYPE_CHECKING:
    from harness.report.inputs import ConformanceRun, Inputs

MAX_ROWS = 200  # a comment has a size limit; the page has every case
MAX_FLAGS = 30
MAX_MESSAGE = 300
_SPECIAL = re.compile(r"([\\`*_\[\]#|~$])")  # what formats, links, math, or ends a cell


def md(value: object) -> str:
    """Text that renders as itself in a Markdown table cell."""
    text = " ".join(str(value).split())  # newlines (any whitespace run) become one space
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _SPECIAL.sub(r"\\\1", text)


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows)]


# -- the verdict ----------------------------------------------------------------------------


def _verdict(verdict: ReportVerdict) -> list[str]:
    lines = [f"**{md(verdict.headline())}**", ""]
    if verdict.conformance:
        rows = [
            [
                md(c.backend),
                ("FAILED" if c.failed else "passed")
                + (
                    f" ({c.not_checked} examples not checked: over budget)" if c.not_checked else ""
                ),
                f"{c.passed}/{c.tests}",
                str(c.failed),
                str(c.unsupported),
            ]
            for c in verdict.conformance
        ]
        header = ["backend", "conformance", "passed/tests", "failed", "unsupported"]
        lines += [*_table(header, rows), ""]
    if verdict.performance:
        engine = engine_among(verdict)
        header = (["run"] if verdict.several_runs else []) + ["backend", "timed"]
        header += ["x peer: median (range)"]
        header += [f"x {md(engine)}: median (range)"] if engine else []
        header += ["of ceiling: median (range)", "note"]
        rows = []
        for p in verdict.performance:
            cells = [md(p.run)] if verdict.several_runs else []
            note = f"{len(p.failing)} failed" if p.failing else ""
            if p.unsupported:
                why = f"{p.unsupported} unsupported ({md(p.unsupported_reason)})"
                note = ", ".join(x for x in (note, why) if x)
            note = ", ".join(x for x in (note, md(p.unreliable_note)) if x)
            peer = "1 (the peer)" if p.is_peer else ratio_range(p.ratio)
            cells += [md(p.backend), f"{p.timed}/{p.cases}", peer]
            if engine:
                own = p.backend == engine
                cells.append("1 (the engine)" if own else ratio_range(p.ratio_engine))
            cells.append(percent_range(p.roofline))
            rows.append([*cells, note])
        lines += [*_table(header, rows), ""]
    if verdict.by_workload:
        header, grid = workload_grid(verdict.by_workload, verdict.several_runs)
        lines += ["Against the machine (share of the binding ceiling), per workload:", ""]
        shown = [md(cell) for cell in header]  # backend names come from the input files
        lines += [*_table(shown, [[md(cell) for cell in row] for row in grid]), ""]
    lines += _flags(verdict)
    return lines


def _flags(verdict: ReportVerdict) -> list[str]:
    flags = verdict.flags
    if not flags:
        return ["Flags: none (no measurement was flagged)."]
    lines = [f"Flags: **{len(flags)}**"]
    for flag in flags[:MAX_FLAGS]:
        where = " / ".join(md(x) for x in (flag.workload, flag.case, flag.backend) if x)
        prefix = f"{md(flag.run)}: " if verdict.several_runs else ""
        lines.append(f"- {prefix}{where or '(the run)'}: {md(flag.text)}")
    if len(flags) > MAX_FLAGS:
        lines.append(f"- ... and {len(flags) - MAX_FLAGS} more in index.html.")
    return lines


# -- conformance ----------------------------------------------------------------------------


def _conformance(run: ConformanceRun) -> list[str]:
    counts = {
        o: sum(c.outcome == o for c in run.cases) for o in ("passed", "failed", "unsupported")
    }
    summary = ", ".join(f"{n} {o}" for o, n in counts.items())
    backends = ", ".join(md(b) for b in dict.fromkeys(c.backend for c in run.cases))
    profile = f", profile {md(run.profile)}" if run.profile else ""
    lines = [f"- {md(run.path.name)} ({backends or 'no backend'}{profile}): {summary}"]
    for case in run.failed():
        message = (case.message or "").strip()
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE] + " ..."
        lines.append(f"  - FAILED {md(case.backend)} · {md(case.test)}: {md(message)}")
    return lines


# -- performance: one row per case, one column per backend ------------------------------------


def _cell(s: CaseStats) -> str:
    if s.case.status != "PASSED":
        return md(s.case.status)
    if s.case.role == "peer":
        return format_ns(s.median_s * 1e9) if s.median_s is not None else "-"
    return ratio(s.ratio_peer, s.ratio_peer_ci)


def _performance(runs: Sequence[AnalysedRun]) -> list[str]:
    several = len(runs) > 1
    shown = {i: shown_cases(run) for i, run in enumerate(runs, 1)}
    backends = list(dict.fromkeys(s.case.backend for cases in shown.values() for s in cases))
    roles: dict[str, set[str]] = {}
    for cases in shown.values():
        for s in cases:
            roles.setdefault(s.case.backend, set()).add(s.case.role)
    peers = [b for b in backends if roles[b] == {"peer"}]
    columns = peers + [b for b in backends if b not in peers]
    header = (["run"] if several else []) + ["workload / case"]
    header += [f"{md(b)} (time)" if b in peers else md(b) for b in columns]
    rows: list[list[str]] = []
    for index, cases in shown.items():
        by_case: dict[str, dict[str, CaseStats]] = {}
        for s in cases:
            key = f"{s.case.workload}@{s.case.workload_version} / {s.case.case}"
            by_case.setdefault(key, {})[s.case.backend] = s
        for key, cells in by_case.items():
            row = [str(index)] if several else []
            row.append(md(key))
            row += [_cell(cells[b]) if b in cells else "-" for b in columns]
            rows.append(row)
    lines = _table(header, rows[:MAX_ROWS]) if rows else ["No case was run."]
    if len(rows) > MAX_ROWS:
        lines += ["", f"... and {len(rows) - MAX_ROWS} more cases in index.html."]
    collapsed = [
        f"- {f'run {i}: ' if several else ''}{md(g.backend)}: {g.count} case"
        f"{'s' if g.count != 1 else ''} unsupported ({md(g.reason)})"
        for i, run in enumerate(runs, 1)
        for g in unsupported_groups(run)
    ]
    if collapsed:
        lines += ["", "Not run, as each backend declared:", *collapsed]
    lines += [
        "",
        "Cells: a backend's median forward time over the peer's (x, > 1: slower) with its "
        "bootstrap interval; the peer's own median time; a status where the case did not "
        "pass. Recomputed from the raw samples.",
    ]
    return lines


def _run_line(index: int, run: AnalysedRun) -> str:
    env = run.record.environment
    git = env.get("git") if isinstance(env.get("git"), dict) else None
    sha = str((git or {}).get("sha") or "no git")
    dirty = " (dirty)" if (git or {}).get("dirty") else ""
    device = env.get("device_name") or env.get("device") or "?"
    return (
        f"- run {index}: **{md(run.label)}**: device {md(device)}, {md(run.record.created)}, "
        f"sha {md(sha)}{dirty}, {len(run.cases)} cases"
    )


def _pairs(inputs: Inputs) -> list[str]:
    """One headline per paired comparison, and its FAIL cases."""
    from harness.report.pair_section import headline

    lines: list[str] = []
    for pair in inputs.pairs:
        lines.append(f"- {md(headline(pair))}")
        lines += [
            f"  - FAIL {md(c['key'])}: {md(c.get('detail', ''))}"
            for c in pair.record.cases
            if c["verdict"] == "FAIL"
        ]
    return lines


def render_summary(
    title: str, inputs: Inputs, runs: Sequence[AnalysedRun], verdict: ReportVerdict | None = None
) -> str:
    """The whole ``summary.md`` text."""
    verdict = verdict or verdict_of(inputs, runs)
    lines = [f"## {md(title)}", "", "### Verdict", "", *_verdict(verdict)]
    if inputs.conformance:
        lines += ["", "### Conformance", ""]
        for run in inputs.conformance:
            lines += _conformance(run)
    if inputs.pairs:
        lines += ["", "### Paired A/B comparisons", "", *_pairs(inputs)]
    if runs:
        lines += ["", "### Performance", "", *_performance(runs)]
        lines += ["", "### Inputs", "", *(_run_line(i, run) for i, run in enumerate(runs, 1))]
    lines += ["", "Figures and every table: index.html beside this file."]
    return "\n".join(lines) + "\n"
