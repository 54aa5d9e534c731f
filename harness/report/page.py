"""The report's ``index.html``: one self-contained page, readable offline, the answer first.

The page leads with the verdict (conformance per backend with links to its
failures, performance per backend against the in-run peer and the ceiling,
measurement flags), then the figures, then every case, the conformance
details, and last the inputs (files, environment, ceilings, timing setup).
Every figure is embedded as a base64 PNG (``<img data-figure="NAME">``) with
links to the SVG and PNG files beside the page; the ``attn-harness-figures``
meta tag holds the number of embedded figures, which a browser check
compares with the ``img[data-figure]`` it counts. Styles are inline; there
is no script and nothing is fetched from anywhere. Every string that comes
from an input file passes through ``_e`` (``html.escape``), so a hostile
backend or workload name renders as text.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.bench.engine_peer import engine_in
from harness.bench.table import format_ns
from harness.report.figure_style import RenderedFigure, SkippedFigure
from harness.report.formats import percent, percent_range, ratio, ratio_range, workload_grid
from harness.report.pair_section import pair_html
from harness.report.stats import AnalysedRun, CaseStats, ceilings, overhead_median_ns
from harness.report.verdict import (
    PerformanceLine,
    ReportVerdict,
    engine_among,
    shown_cases,
    unsupported_groups,
    verdict_of,
)

if TYPE_CHECKING:
    from harness.report.inputs import ConformanceRun, Inputs

MAX_MESSAGE = 2000  # characters of a failure message shown; the rest is in the JUnit file

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem auto; max-width: 1400px;
       padding: 0 1rem; color: #212121; line-height: 1.4; }
h1 { margin-bottom: 0.2rem; }
h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2rem; margin-top: 2.2rem; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.88rem; }
th, td { border: 1px solid #ddd; padding: 0.2rem 0.5rem; text-align: left;
         vertical-align: top; }
th { background: #f3f3f3; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.failed td { background: #fdecea; }
tr.unsupported td { color: #757575; }
p.headline { font-size: 1.15rem; font-weight: 600; padding: 0.5rem 0.8rem;
             border-left: 6px solid; }
p.headline.passed { background: #eef7e6; border-color: #689f38; }
p.headline.failed { background: #fdecea; border-color: #c62828; }
td.verdict-passed { color: #33691e; font-weight: 600; }
td.verdict-failed { color: #b71c1c; font-weight: 600; }
ul.collapsed { color: #616161; margin-top: 0; }
nav ul { display: flex; flex-wrap: wrap; gap: 0.2rem 1.2rem; list-style: none; padding: 0; }
figure { margin: 1rem 0 2rem; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.9rem; max-width: 70rem; }
p.skipped { color: #8a6d3b; background: #fcf8e3; padding: 0.4rem 0.6rem; }
pre { white-space: pre-wrap; word-break: break-word; background: #f7f7f7;
      padding: 0.4rem; margin: 0.2rem 0 0.6rem; font-size: 0.85rem; }
.muted { color: #757575; }
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


@dataclass(frozen=True)
class Row:
    cells: list[str]  # plain text, escaped when written
    css: str | None = None
    numeric: frozenset[int] = frozenset()
    cell_css: dict[int, str] | None = None  # class of single cells (fixed names, never input)
    links: dict[int, str] | None = None  # cell -> "#anchor" (fixed ids, never input)


def _cell(row: Row, i: int, text: str) -> str:
    classes = [c for c in ("num" if i in row.numeric else "", (row.cell_css or {}).get(i, "")) if c]
    css = f' class="{" ".join(classes)}"' if classes else ""
    link = (row.links or {}).get(i)
    body = f'<a href="{_e(link)}">{_e(text)}</a>' if link else _e(text)
    return f"<td{css}>{body}</td>"


def _table(header: Sequence[str], rows: Iterable[Row]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = "".join(_cell(row, i, c) for i, c in enumerate(row.cells))
        css = f' class="{_e(row.css)}"' if row.css else ""
        body.append(f"<tr{css}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _pairs(items: Iterable[tuple[str, object]]) -> str:
    return _table(["field", "value"], [Row([k, _value(v)]) for k, v in items])


def _value(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_value(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(_value(v) for v in value)
    return str(value)


# -- the verdict ----------------------------------------------------------------------------


def _verdict_conformance(verdict: ReportVerdict) -> str:
    if not verdict.conformance:
        return "<h3>Conformance</h3><p>No conformance run among the inputs.</p>"
    rows = []
    for line in verdict.conformance:
        outcome = "FAILED" if line.failed else "PASSED"
        failures = "-"
        links = None
        if line.failures:
            failures = f"{len(line.failures)} failed test(s)"
            links = {7: f"#failure-{line.failures[0] + 1}"}
        numbers = [line.passed, line.failed, line.unsupported, line.tests]
        examples = str(line.examples)
        if line.not_checked:
            examples += f" ({line.not_checked} not checked: over the interpreted budget)"
        rows.append(
            Row(
                [line.backend, outcome, *map(str, numbers), examples, failures],
                "failed" if line.failed else None,
                frozenset(range(2, 7)),
                {1: f"verdict-{outcome.lower()}"},
                links,
            )
        )
    header = ["backend", "verdict", "passed", "failed", "unsupported", "tests", "examples"]
    return "<h3>Conformance</h3>" + _table([*header, "failures"], rows)


def _perf_note(line: PerformanceLine) -> str:
    line_failing, unsupported, timed = line.failing, line.unsupported, line.timed
    notes = []
    if line_failing:
        shown = "; ".join(line_failing[:3])
        more = f" (+{len(line_failing) - 3} more)" if len(line_failing) > 3 else ""
        notes.append(f"{len(line_failing)} failed: {shown}{more}")
    if unsupported:
        notes.append(f"{unsupported} unsupported ({line.unsupported_reason})")
    if line.unreliable:
        notes.append(line.unreliable_note)
    if not timed and not line_failing and not unsupported:
        notes.append("nothing timed")
    return "; ".join(notes)


def _verdict_performance(verdict: ReportVerdict) -> str:
    if not verdict.performance:
        return "<h3>Performance</h3><p>No benchmark results among the inputs.</p>"
    engine = engine_among(verdict)
    header = ["run"] if verdict.several_runs else []
    header += ["backend", "timed", "x peer: median (range)"]
    header += [f"x {engine}: median (range)"] if engine else []
    header += ["of ceiling: median (range)", "bound", "note"]
    rows = []
    for line in verdict.performance:
        cells = [line.run] if verdict.several_runs else []
        start = len(cells)
        peer = "1 (the peer)" if line.is_peer else ratio_range(line.ratio)
        cells += [line.backend, f"{line.timed}/{line.cases}", peer]
        if engine:
            cells.append(
                "1 (the engine)" if line.backend == engine else ratio_range(line.ratio_engine)
            )
        cells += [percent_range(line.roofline), line.bound or "-"]
        cells.append(_perf_note(line))
        css = "failed" if line.failing else ("unsupported" if not line.timed else None)
        rows.append(Row(cells, css, frozenset(range(start + 1, len(cells) - 2))))
    intro = (
        "<p>x peer: a backend's median forward time over the in-run contiguous SDPA "
        "peer's (no paging), per case; the median over its timed cases and their range "
        "(&lt; 1: faster than the peer)."
        + (
            f" x {_e(engine)}: the same over the engine's production kernel, timed on the "
            "same pages in the same run (&lt; 1: faster than the engine)."
            if engine
            else ""
        )
        + " Of ceiling: the share of the binding roofline "
        "ceiling (memory bandwidth or matmul rate) measured in the same run; bound: "
        "the ceiling that binds its timed cases, with counts where they differ.</p>"
    )
    return "<h3>Performance</h3>" + intro + _table(header, rows)


def _verdict_by_workload(verdict: ReportVerdict) -> str:
    if not verdict.by_workload:
        return ""
    header, cells = workload_grid(verdict.by_workload, verdict.several_runs)
    first = 2 if verdict.several_runs else 1
    rows = [Row(row, None, frozenset(range(first, len(row)))) for row in cells]
    intro = (
        "<p>Each backend's share of the ceiling that binds (mem: copy bandwidth, cmp: "
        "matmul rate), workload by workload: the median over its timed cases and their "
        "range. The peer is the contiguous SDPA the ratios are taken against.</p>"
    )
    return "<h3>Against the machine, per workload</h3>" + intro + _table(header, rows)


def _verdict_flags(verdict: ReportVerdict) -> str:
    flags = verdict.flags
    if not flags:
        return "<h3>Flags (0)</h3><p>No measurement was flagged.</p>"
    header = ["run"] if verdict.several_runs else []
    header += ["workload", "case", "backend", "flag"]
    rows = []
    for flag in flags:
        cells = [flag.run] if verdict.several_runs else []
        cells += [flag.workload or "(run)", flag.case or "-", flag.backend or "-", flag.text]
        rows.append(Row(cells, "failed" if "error" in flag.text.lower() else None))
    intro = (
        f"<p>{len(flags)} warning(s) about a measurement, e.g. a rate above its ceiling "
        "(a measurement error: the number is not to be trusted).</p>"
    )
    return f"<h3>Flags ({len(flags)})</h3>" + intro + _table(header, rows)


def _verdict(verdict: ReportVerdict) -> str:
    state = "passed" if verdict.ok else "failed"
    return (
        '<section id="verdict"><h2>Verdict</h2>'
        f'<p class="headline {state}">{_e(verdict.headline())}</p>'
        + _verdict_conformance(verdict)
        + _verdict_performance(verdict)
        + _verdict_by_workload(verdict)
        + _verdict_flags(verdict)
        + "</section>"
    )


# -- figures ------------------------------------------------------------------------------


def _figure(figure: RenderedFigure) -> str:
    data = base64.b64encode(figure.png).decode("ascii")
    name = _e(figure.name)
    return (
        f'<figure id="figure-{name}">'
        f'<img data-figure="{name}" alt="{_e(figure.title)}" src="data:image/png;base64,{data}">'
        f"<figcaption><strong>{_e(figure.title)}.</strong> {_e(figure.caption)} "
        f'<a href="figures/{name}.svg">SVG</a> · <a href="figures/{name}.png">PNG</a>'
        "</figcaption></figure>"
    )


def _skipped(figure: SkippedFigure) -> str:
    title, reason = _e(figure.title), _e(figure.reason)
    return f'<p class="skipped"><strong>{title}</strong>: not drawn: {reason}.</p>'


def _figures(figures: Sequence[RenderedFigure | SkippedFigure]) -> str:
    parts = [_figure(f) if isinstance(f, RenderedFigure) else _skipped(f) for f in figures]
    return '<section id="figures"><h2>Figures</h2>' + "".join(parts) + "</section>"


# -- one benchmark run: its cases ---------------------------------------------------------


def _case_row(s: CaseStats, with_reference: bool, engine: str | None) -> Row:
    median = ci = roof = "-"
    if s.median_s is not None and s.ci_s is not None:
        median = format_ns(s.median_s * 1e9)
        ci = f"{format_ns(s.ci_s[0] * 1e9)} - {format_ns(s.ci_s[1] * 1e9)}"
    if s.roofline_fraction is not None:
        roof = percent(s.roofline_fraction) + (f" {s.bound}" if s.bound else "")
    note = s.case.error if s.case.status != "PASSED" and s.case.error else ""
    note = "; ".join([note, *s.case.flags]).strip("; ")
    cells = [s.case.workload, s.case.case, s.case.backend, s.case.status, median, ci]
    cells.append(ratio(s.ratio_peer, s.ratio_peer_ci))
    if with_reference:
        cells.append(ratio(s.ratio_reference, s.ratio_reference_ci))
    if engine:
        cells.append(ratio(s.ratio_engine, s.ratio_engine_ci))
    cells += [roof, note]
    css = None if s.case.status == "PASSED" else "failed"
    return Row(cells, css, frozenset(range(4, len(cells) - 1)))


def _cases(run: AnalysedRun) -> str:
    with_reference = any(s.ratio_reference is not None for s in run.cases)
    confidence = next((s.confidence for s in run.cases if s.confidence), 0.95)
    header = ["workload", "case", "backend", "status", "median", f"{confidence:.0%} CI"]
    header.append("x peer [CI]")
    if with_reference:
        header.append("x reference [CI]")
    engine = engine_in(run.record.cases)
    if engine:
        header.append(f"x {engine} [CI]")
    header += ["of ceiling", "note"]
    rows = [_case_row(s, with_reference, engine) for s in shown_cases(run)]
    intro = (
        "<p>Median forward time and its bootstrap interval, recomputed from the raw samples; "
        "x peer: time over the contiguous SDPA peer's (&gt; 1: slower); of ceiling: share of "
        "the binding ceiling. A case that did not pass is not timed.</p>"
    )
    groups = unsupported_groups(run)
    collapsed = ""
    if groups:
        items = "".join(
            f"<li>{_e(g.backend)}: {g.count} case{'s' if g.count != 1 else ''} unsupported "
            f"({_e(g.reason)})</li>"
            for g in groups
        )
        collapsed = f'<p>Not run, as each backend declared:</p><ul class="collapsed">{items}</ul>'
    table = _table(header, rows) if rows else "<p>No case was run.</p>"
    return intro + table + collapsed


def _run(index: int, run: AnalysedRun) -> str:
    return (
        f'<section id="run-{index}"><h2>Cases of run {index}: {_e(run.label)}</h2>'
        + _cases(run)
        + "</section>"
    )


# -- conformance details ------------------------------------------------------------------


def _conformance_counts(run: ConformanceRun) -> str:
    rows = []
    for backend in dict.fromkeys(c.backend for c in run.cases):
        outcomes = [c.outcome for c in run.cases if c.backend == backend]
        examples = sum(run.examples.get(backend, {}).values())
        counts = [outcomes.count(o) for o in ("passed", "failed", "unsupported")]
        numbers = [str(n) for n in (*counts, len(outcomes), examples)]
        rows.append(
            Row([backend, *numbers], "failed" if counts[1] else None, frozenset(range(1, 6)))
        )
    header = ["backend", "passed", "failed", "unsupported", "tests", "examples held"]
    return _table(header, rows)


def _failures(run: ConformanceRun, first: int) -> str:
    """The run's failures, numbered on from ``first`` (1-based) as the verdict links them."""
    failed = run.failed()
    if not failed:
        return "<p>No failures.</p>"
    items = []
    for number, case in enumerate(failed, first):
        message = case.message or ""
        if len(message) > MAX_MESSAGE:
            message = (
                message[:MAX_MESSAGE] + f"\n... ({len(message) - MAX_MESSAGE} more characters)"
            )
        where = f"<strong>{_e(case.backend)}</strong> · {_e(case.test)}"
        items.append(f'<li id="failure-{number}">{where}<pre>{_e(message)}</pre></li>')
    return f"<h4>Failures ({len(failed)})</h4><ul>{''.join(items)}</ul>"


def _conformance(runs: Sequence[ConformanceRun]) -> str:
    if not runs:
        return ""
    parts = ['<section id="conformance"><h2>Conformance details</h2>']
    first = 1
    for run in runs:
        facts = [("profile", run.profile), ("device", run.device), ("created", run.created)]
        known = ", ".join(f"{k} {v}" for k, v in facts if v)
        parts.append(f"<h3>{_e(run.path)}</h3>")
        if known:
            parts.append(f'<p class="muted">{_e(known)}</p>')
        parts += [_conformance_counts(run), _failures(run, first)]
        first += len(run.failed())
    parts.append("</section>")
    return "".join(parts)


# -- the inputs: files, then each run's environment, ceilings and timing setup --------------


def _environment(run: AnalysedRun) -> str:
    record = run.record
    env = dict(record.environment)
    git = env.pop("git", None)
    git = git if isinstance(git, dict) else {}
    sha = git.get("sha") or "-"
    dirty = " (dirty: uncommitted changes)" if git.get("dirty") else ""
    items: list[tuple[str, object]] = [
        ("file", run.path),
        ("created", record.created),
        ("tool", f"{record.tool.get('name', '?')} {record.tool.get('version', '')}".strip()),
        ("git", f"{sha}{dirty}"),
        *env.items(),
    ]
    return "<h4>Environment</h4>" + _pairs(items)


def _ceilings(run: AnalysedRun) -> str:
    used = run.record.ceilings.get("used")
    rows = []
    for c in ceilings(run.record):
        bandwidth = "-" if c.memory_bandwidth is None else f"{c.memory_bandwidth / 1e9:.4g} GB/s"
        flops = ", ".join(f"{d} {v / 1e9:.4g} GFLOP/s" for d, v in c.matmul_flops.items()) or "-"
        rows.append(Row([c.source, "yes" if c.source == used else "", bandwidth, flops]))
    if not rows:
        return "<h4>Ceilings</h4><p>No ceilings recorded: no roofline fractions.</p>"
    return "<h4>Ceilings</h4>" + _table(["source", "used", "memory bandwidth", "matmul"], rows)


def _timing(run: AnalysedRun) -> str:
    timing = dict(run.record.timing)
    timing.pop("overhead", None)
    overhead = overhead_median_ns(run.record)
    items = [*timing.items(), ("timer overhead (median of an empty call)", format_ns(overhead))]
    return "<h4>Timing setup</h4>" + _pairs(items)


def _inputs(inputs: Inputs, runs: Sequence[AnalysedRun]) -> str:
    rows = [Row([str(run.path), "benchmark results", run.label]) for run in runs]
    rows += [
        Row([str(c.path), "conformance (JUnit XML)", f"{len(c.cases)} tests"])
        for c in inputs.conformance
    ]
    parts = ['<section id="inputs"><h2>Inputs</h2>', _table(["file", "kind", "label"], rows)]
    if inputs.skipped:
        skipped = "".join(f"<li>{_e(s)}</li>" for s in inputs.skipped)
        parts.append(f"<p>Files in the named folders that were not used:</p><ul>{skipped}</ul>")
    for index, run in enumerate(runs, 1):
        parts.append(f"<h3>Run {index}: {_e(run.label)}</h3>")
        parts += [_environment(run), _ceilings(run), _timing(run)]
    parts.append("</section>")
    return "".join(parts)


# -- the page -----------------------------------------------------------------------------


def _contents(runs: Sequence[AnalysedRun], conformance: bool, pairs: bool = False) -> str:
    links = [("verdict", "Verdict"), ("figures", "Figures")]
    links += [(f"run-{i}", f"Cases of run {i}") for i, _ in enumerate(runs, 1)]
    if conformance:
        links.append(("conformance", "Conformance details"))
    if pairs:
        links.append(("paired", "Paired A/B comparisons"))
    links.append(("inputs", "Inputs"))
    items = "".join(f'<li><a href="#{_e(a)}">{_e(t)}</a></li>' for a, t in links)
    return f"<nav><ul>{items}</ul></nav>"


def render_page(
    title: str,
    inputs: Inputs,
    runs: Sequence[AnalysedRun],
    figures: Sequence[RenderedFigure | SkippedFigure],
    verdict: ReportVerdict | None = None,
) -> str:
    """The whole ``index.html`` text."""
    verdict = verdict or verdict_of(inputs, runs)
    drawn = sum(isinstance(f, RenderedFigure) for f in figures)
    head = (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f'<meta name="attn-harness-figures" content="{drawn}">\n'
        f"<title>{_e(title)}</title>\n<style>{STYLE}</style>\n</head>\n"
    )
    body = [
        f"<body>\n<header><h1>{_e(title)}</h1>",
        f'<p class="muted">Written by attn-harness report from {len(inputs.bench)} benchmark '
        f"run(s) and {len(inputs.conformance)} conformance run(s)"
        + (f", with {len(inputs.pairs)} paired comparison(s)" if inputs.pairs else "")
        + ".</p></header>",
        _contents(runs, bool(inputs.conformance), bool(inputs.pairs)),
        _verdict(verdict),
        _figures(figures),
        *(_run(i, run) for i, run in enumerate(runs, 1)),
        _conformance(inputs.conformance),
        pair_html(inputs.pairs),
        _inputs(inputs, runs),
        "\n</body>\n</html>\n",
    ]
    return head + "\n".join(body)
