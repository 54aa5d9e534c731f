"""The report's ``summary.md``: what a pull-request comment needs, in GitHub Markdown.

A heading, one line per run, a table of cases and the conformance counts
and failures. Every string from an input file goes through ``md``, which
escapes what could end a table cell (``|``, newlines), open code (backticks),
start formatting or a link, or become HTML (``<``, ``>``, ``&``), so a
hostile name shows as its text and cannot break the table.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from harness.bench.table import format_ns
from harness.report.stats import AnalysedRun, CaseStats

if TYPE_CHECKING:
    from harness.report.inputs import ConformanceRun, Inputs

MAX_ROWS = 400  # a comment has a size limit; the page has every case
MAX_MESSAGE = 300
_SPECIAL = re.compile(r"([\\`*_\[\]#|~$])")  # what formats, links, math, or ends a cell


def md(value: object) -> str:
    """Text that renders as itself in a Markdown table cell."""
    text = " ".join(str(value).split())  # newlines (any whitespace run) become one space
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _SPECIAL.sub(r"\\\1", text)


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _ratio(value: float | None, ci: tuple[float, float] | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" + (f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else "")


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


def _case_cells(index: int, s: CaseStats, several: bool) -> list[str]:
    median = "-"
    if s.median_s is not None and s.ci_s is not None:
        low, high = (format_ns(x * 1e9) for x in s.ci_s)
        median = f"{format_ns(s.median_s * 1e9)} [{low}-{high}]"
    where = f"{s.case.workload}@{s.case.workload_version} / {s.case.case}"
    cells = [str(index)] if several else []
    cells += [md(s.case.backend), md(where), md(s.case.status), median]
    cells.append(_ratio(s.ratio_peer, s.ratio_peer_ci))
    return cells


def _cases(runs: Sequence[AnalysedRun]) -> list[str]:
    several = len(runs) > 1
    header = (["run"] if several else []) + ["backend", "workload / case", "status"]
    header += ["median [CI]", "x peer [CI]"]
    lines = [_row(header), _row(["---"] * len(header))]
    rows = [_row(_case_cells(i, s, several)) for i, run in enumerate(runs, 1) for s in run.cases]
    lines += rows[:MAX_ROWS]
    if len(rows) > MAX_ROWS:
        lines += ["", f"... and {len(rows) - MAX_ROWS} more cases in index.html."]
    return lines


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


def render_summary(title: str, inputs: Inputs, runs: Sequence[AnalysedRun]) -> str:
    """The whole ``summary.md`` text."""
    lines = [f"## {md(title)}", ""]
    if runs:
        lines += [_run_line(i, run) for i, run in enumerate(runs, 1)]
        lines += ["", *_cases(runs), ""]
        lines.append(
            "median: forward time with its bootstrap interval; x peer: time over the contiguous "
            "SDPA peer's (> 1: slower), with its interval; both recomputed from the raw samples."
        )
    if inputs.conformance:
        lines += ["", "### Conformance", ""]
        for run in inputs.conformance:
            lines += _conformance(run)
    lines += ["", "Figures and every table: index.html beside this file."]
    return "\n".join(lines) + "\n"
