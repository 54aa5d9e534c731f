"""The report's ``index.html``: one self-contained page, readable offline.

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

from harness.bench.table import format_ns
from harness.report.figures import RenderedFigure, SkippedFigure
from harness.report.stats import AnalysedRun, CaseStats, ceilings, overhead_median_ns

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
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.failed td { background: #fdecea; }
tr.unsupported td { color: #757575; }
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


def _table(header: Sequence[str], rows: Iterable[Row]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="num">{_e(c)}</td>' if i in row.numeric else f"<td>{_e(c)}</td>"
            for i, c in enumerate(row.cells)
        )
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


# -- one benchmark run --------------------------------------------------------------------


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
    return "<h3>Environment</h3>" + _pairs(items)


def _ceilings(run: AnalysedRun) -> str:
    used = run.record.ceilings.get("used")
    rows = []
    for c in ceilings(run.record):
        bandwidth = "-" if c.memory_bandwidth is None else f"{c.memory_bandwidth / 1e9:.4g} GB/s"
        flops = ", ".join(f"{d} {v / 1e9:.4g} GFLOP/s" for d, v in c.matmul_flops.items()) or "-"
        rows.append(Row([c.source, "yes" if c.source == used else "", bandwidth, flops]))
    if not rows:
        return "<h3>Ceilings</h3><p>No ceilings recorded: no roofline fractions.</p>"
    return "<h3>Ceilings</h3>" + _table(["source", "used", "memory bandwidth", "matmul"], rows)


def _timing(run: AnalysedRun) -> str:
    timing = dict(run.record.timing)
    timing.pop("overhead", None)
    overhead = overhead_median_ns(run.record)
    items = [*timing.items(), ("timer overhead (median of an empty call)", format_ns(overhead))]
    return "<h3>Timing setup</h3>" + _pairs(items)


def _flags(run: AnalysedRun) -> str:
    rows = [
        Row([s.case.workload, s.case.case, s.case.backend, flag])
        for s in run.cases
        for flag in s.case.flags
    ]
    if not rows:
        return "<h3>Measurement flags</h3><p>No case was flagged.</p>"
    intro = "<p>Warnings about a measurement, e.g. a rate above its ceiling (an error).</p>"
    return (
        "<h3>Measurement flags</h3>" + intro + _table(["workload", "case", "backend", "flag"], rows)
    )


def _ratio(value: float | None, ci: tuple[float, float] | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" + (f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else "")


def _case_row(s: CaseStats, with_reference: bool) -> Row:
    median = ci = roof = "-"
    if s.median_s is not None and s.ci_s is not None:
        median = format_ns(s.median_s * 1e9)
        ci = f"{format_ns(s.ci_s[0] * 1e9)} - {format_ns(s.ci_s[1] * 1e9)}"
    if s.roofline_fraction is not None:
        roof = f"{s.roofline_fraction:.1%}" + (f" {s.bound}" if s.bound else "")
    note = s.case.error if s.case.status != "PASSED" and s.case.error else ""
    note = "; ".join([note, *s.case.flags]).strip("; ")
    cells = [s.case.workload, s.case.case, s.case.backend, s.case.status, median, ci]
    cells.append(_ratio(s.ratio_peer, s.ratio_peer_ci))
    if with_reference:
        cells.append(_ratio(s.ratio_reference, s.ratio_reference_ci))
    cells += [roof, note]
    css = {"PASSED": None, "UNSUPPORTED": "unsupported"}.get(s.case.status, "failed")
    return Row(cells, css, frozenset(range(4, len(cells) - 1)))


def _cases(run: AnalysedRun) -> str:
    with_reference = any(s.ratio_reference is not None for s in run.cases)
    confidence = next((s.confidence for s in run.cases if s.confidence), 0.95)
    header = ["workload", "case", "backend", "status", "median", f"{confidence:.0%} CI"]
    header.append("x peer [CI]")
    if with_reference:
        header.append("x reference [CI]")
    header += ["roofline", "note"]
    rows = [_case_row(s, with_reference) for s in run.cases]
    intro = (
        "<p>Median forward time and its bootstrap interval, recomputed from the raw samples; "
        "x peer: time over the contiguous SDPA peer's (&gt; 1: slower); roofline: share of "
        "the binding ceiling. A case that did not pass is not timed.</p>"
    )
    return "<h3>Cases</h3>" + intro + _table(header, rows)


def _run(index: int, run: AnalysedRun) -> str:
    parts = [
        f'<section id="run-{index}"><h2>Run {index}: {_e(run.label)}</h2>',
        _environment(run),
        _ceilings(run),
        _timing(run),
        _flags(run),
        _cases(run),
        "</section>",
    ]
    return "".join(parts)


# -- conformance --------------------------------------------------------------------------


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


def _failures(run: ConformanceRun) -> str:
    failed = run.failed()
    if not failed:
        return "<p>No failures.</p>"
    items = []
    for case in failed:
        message = case.message or ""
        if len(message) > MAX_MESSAGE:
            message = (
                message[:MAX_MESSAGE] + f"\n... ({len(message) - MAX_MESSAGE} more characters)"
            )
        where = f"<strong>{_e(case.backend)}</strong> · {_e(case.test)}"
        items.append(f"<li>{where}<pre>{_e(message)}</pre></li>")
    return f"<h4>Failures ({len(failed)})</h4><ul>{''.join(items)}</ul>"


def _conformance(runs: Sequence[ConformanceRun]) -> str:
    if not runs:
        return ""
    parts = ['<section id="conformance"><h2>Conformance</h2>']
    for run in runs:
        facts = [("profile", run.profile), ("device", run.device), ("created", run.created)]
        known = ", ".join(f"{k} {v}" for k, v in facts if v)
        parts.append(f"<h3>{_e(run.path)}</h3>")
        if known:
            parts.append(f'<p class="muted">{_e(known)}</p>')
        parts += [_conformance_counts(run), _failures(run)]
    parts.append("</section>")
    return "".join(parts)


# -- the page -----------------------------------------------------------------------------


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
    parts.append("</section>")
    return "".join(parts)


def _contents(runs: Sequence[AnalysedRun], conformance: bool) -> str:
    links = [("inputs", "Inputs"), ("figures", "Figures")]
    links += [(f"run-{i}", f"Run {i}: {r.label}") for i, r in enumerate(runs, 1)]
    if conformance:
        links.append(("conformance", "Conformance"))
    items = "".join(f'<li><a href="#{_e(a)}">{_e(t)}</a></li>' for a, t in links)
    return f"<nav><ul>{items}</ul></nav>"


def render_page(
    title: str,
    inputs: Inputs,
    runs: Sequence[AnalysedRun],
    figures: Sequence[RenderedFigure | SkippedFigure],
) -> str:
    """The whole ``index.html`` text."""
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
        f"run(s) and {len(inputs.conformance)} conformance run(s).</p></header>",
        _contents(runs, bool(inputs.conformance)),
        _inputs(inputs, runs),
        _figures(figures),
        *(_run(i, run) for i, run in enumerate(runs, 1)),
        _conformance(inputs.conformance),
        "\n</body>\n</html>\n",
    ]
    return head + "\n".join(body)
