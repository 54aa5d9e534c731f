"""A paired A/B comparison in the report: the paired-ratio figure and the verdict table.

Drawn only when the inputs hold an ``attn-harness ab`` document. One row per
case: each round's ratio ``candidate / base`` as a faint dot, the estimate
with its 95% interval as a bar coloured by the case's verdict, and the
threshold's bounds as dashed lines; a reader sees at once which cases moved,
by how much, and how many rounds the test needed.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter

from harness.report.figure_style import Outcome, RenderedFigure, _figure, _text, done

if TYPE_CHECKING:
    from harness.report.inputs import PairRun

PAIRED = "paired-ratio"
PAIRED_TITLE = "Paired A/B comparison: candidate / base, round by round"
VERDICT_COLOURS = {
    "FAIL": "#c0392b",
    "IMPROVED": "#1e8449",
    "PASS": "#2e86c1",
    "INCONCLUSIVE": "#7f8c8d",
}


def _timed(pair: PairRun) -> list[dict]:
    return [c for c in pair.record.cases if c.get("rounds")]


def pair_figure(pairs: Sequence[PairRun]) -> Outcome:
    """One panel per comparison, one row per timed case."""
    from harness.results.pairs import rounds_log_ratios

    panels = [(p, _timed(p)) for p in pairs]
    rows = sum(max(1, len(cases)) for _, cases in panels)
    figure = _figure(8.0, 1.2 + 0.32 * rows + 0.6 * len(panels))
    axes = figure.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (pair, cases) in zip(axes, panels, strict=True):
        threshold = pair.record.threshold
        for row, case in enumerate(cases):
            ratios = [math.exp(x) for x in rounds_log_ratios(case)]
            ax.plot(ratios, [row] * len(ratios), "o", color="#999999", alpha=0.35, ms=3)
            evidence = case.get("evidence") or {}
            centre = evidence.get("ratio")
            low, high = evidence.get("low"), evidence.get("high")
            colour = VERDICT_COLOURS.get(case["verdict"], "#333333")
            if centre is not None and low is not None and high is not None:
                ax.plot([low, high], [row, row], color=colour, lw=3, solid_capstyle="butt")
                ax.plot([centre], [row], "D", color=colour, ms=6)
        for bound in (1.0 + threshold, 1.0 / (1.0 + threshold)):
            ax.axvline(bound, color="#555555", ls="--", lw=1)
        ax.axvline(1.0, color="#222222", lw=1)
        ax.set_yticks(range(len(cases)))
        ax.set_yticklabels(
            [_text(f"{c['key']} ({c['verdict']}, {len(c['rounds'])} rounds)") for c in cases],
            fontsize="small",
        )
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{(x - 1) * 100:+.0f}%"))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda x, _: ""))
        base, candidate = pair.record.base, pair.record.candidate
        ax.set_title(
            _text(f"{candidate['backend']} vs base {base['backend']} {base.get('revision') or ''}"),
            fontsize="medium",
        )
        ax.set_xlabel("candidate / base: rounds (dots), estimate and 95% interval (bar)")
    handles = [Line2D([], [], color=c, lw=3, label=v) for v, c in VERDICT_COLOURS.items()]
    handles.append(Line2D([], [], color="#555555", ls="--", label="threshold"))
    figure.legend(handles=handles, loc="outside lower center", ncols=5, fontsize="small")
    caption = (
        "Each row is a case; grey dots are its rounds (both sides timed back to back, the order "
        "alternating), the bar its estimate and 95% interval, coloured by the verdict of the "
        "sequential test; dashed lines are the threshold's bounds."
    )
    return done(PAIRED, PAIRED_TITLE, caption, figure)


def pair_figures(pairs: Sequence[PairRun]) -> list[RenderedFigure]:
    """The paired-ratio figure when there is a comparison with a timed case, else none."""
    timed = [p for p in pairs if _timed(p)]
    figure = pair_figure(timed) if timed else None
    return [figure] if isinstance(figure, RenderedFigure) else []


def headline(pair: PairRun) -> str:
    from collections import Counter

    record = pair.record
    counts = Counter(c["verdict"] for c in record.cases)
    told = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    base, candidate = record.base, record.candidate
    at = f" at {base['revision']}" if base.get("revision") else ""
    verdict = "FAILED" if counts.get("FAIL") else "PASSED"
    return (
        f"{verdict}: {candidate['backend']} vs {base['backend']}{at}, threshold "
        f"{record.threshold:.0%}: {told} ({record.wall_s:.0f} s)"
    )


def pair_html(pairs: Sequence[PairRun]) -> str:
    """The page's section: a headline and a table per comparison."""
    if not pairs:
        return ""
    parts = ['<section id="paired"><h2>Paired A/B comparisons</h2>']
    for pair in pairs:
        parts.append(f"<p><strong>{html.escape(headline(pair))}</strong></p>")
        rows = "".join(
            f"<tr><td>{html.escape(c['verdict'])}</td><td>{html.escape(c['key'])}</td>"
            f"<td>{len(c.get('rounds', []))}</td><td>{html.escape(c.get('detail', ''))}</td></tr>"
            for c in pair.record.cases
        )
        parts.append(
            "<table><thead><tr><th>verdict</th><th>case</th><th>rounds</th><th>candidate / base"
            f"</th></tr></thead><tbody>{rows}</tbody></table>"
        )
    parts.append("</section>")
    return "\n".join(parts)
