"""How the report's figures look: colours, markers, series, axes, legends, the Agg canvas.

Every figure of ``harness.report.figures`` is built from these: one
``Series`` per (run, backend), coloured by backend (the peer black) and
marked by run; log axes labelled in their unit, not mathtext; a ``Figure``
with its own Agg canvas (no pyplot, no global state), rendered to PNG bytes
and SVG text. Text from input files reaches matplotlib only through
``_text``, which keeps ``$`` from starting mathtext and a leading ``_``
from hiding a legend entry.
"""

from __future__ import annotations

import io
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.axis import XAxis, YAxis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogFormatter, MaxNLocator, NullLocator

from harness.bench.table import format_ns, short_backend_names
from harness.report.stats import AnalysedRun, CaseStats

PEER = "contiguous-sdpa"
DPI = 100
MAX_LABEL = 60
LADDERS = ((1.0, 2.0, 5.0), (1.0, 1.5, 2.0, 3.0, 5.0, 7.0))  # log-axis tick steps per decade
MAX_TICKS = 8
COLOURS = (
    *("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"),
    *("#8c564b", "#e377c2", "#bcbd22", "#17becf", "#7f7f7f"),
)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", ":", "-.")
OUTCOME_COLOURS = {"passed": "#8bc34a", "failed": "#e53935", "unsupported": "#cfd8dc"}
DTYPE_COLOURS = {"float32": "#37474f", "bfloat16": "#6d4c41", "float16": "#6a1b9a"}


def _text(value: object, limit: int = MAX_LABEL) -> str:
    """Input text as matplotlib shows it literally: no mathtext, no hidden legend entry."""
    text = " ".join(str(value).split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    text = text.replace("$", r"\$")  # every $ escaped: never mathtext
    return " " + text if text.startswith("_") else text


# -- series: one (run, backend) each, colour by backend and marker by run -----------------


@dataclass(frozen=True)
class Series:
    label: str
    colour: str
    marker: str
    linestyle: str
    cases: list[CaseStats]


def _series(runs: Sequence[AnalysedRun], keep: Callable[[CaseStats], bool]) -> list[Series]:
    """The passing cases that ``keep`` selects, grouped per run and backend."""
    backends = list(dict.fromkeys(c.case.backend for run in runs for c in run.cases))
    colour_of, shown = _colours(backends), short_backend_names(backends)
    found: list[Series] = []
    for index, run in enumerate(runs):
        for backend in backends:
            cases = [c for c in run.cases if c.case.backend == backend and c.valid and keep(c)]
            if not cases:
                continue
            label = shown[backend] if len(runs) == 1 else f"{shown[backend]} @ {run.label}"
            found.append(
                Series(
                    label=_text(label, limit=2 * MAX_LABEL),
                    colour=colour_of[backend],
                    marker=MARKERS[index % len(MARKERS)],
                    linestyle=LINESTYLES[index % len(LINESTYLES)],
                    cases=cases,
                )
            )
    return found


def workload_key(c: CaseStats) -> str:
    """A case's workload as the figures name it: ``name@version``."""
    return f"{c.case.workload}@{c.case.workload_version}"


def _colours(backends: list[str]) -> dict[str, str]:
    others = itertools.cycle(COLOURS)
    return {b: "#000000" if b == PEER else next(others) for b in backends}


def _errors(values: Iterable[tuple[float, float, float]]) -> tuple[list[float], list[list[float]]]:
    """Points and asymmetric error bars from ``(value, low, high)``."""
    triples = list(values)
    points = [v for v, _, _ in triples]
    below = [max(v - lo, 0.0) for v, lo, _ in triples]
    above = [max(hi - v, 0.0) for v, _, hi in triples]
    return points, [below, above]


# -- axes: plain tick labels (matplotlib's default log labels are mathtext, slow to lay out) --


class _UnitLogFormatter(LogFormatter):
    """Log-axis labels in the axis's unit ("10 ms", "3k") instead of powers of ten."""

    def __init__(self, unit: Callable[[float], str], *, minor: bool) -> None:
        super().__init__(labelOnlyBase=not minor)
        self._unit = unit

    def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
        return self._unit(x)


def _log_axis(axis: XAxis | YAxis, unit: Callable[[float], str]) -> None:
    axis.set_major_formatter(_UnitLogFormatter(unit, minor=False))
    axis.set_minor_formatter(_UnitLogFormatter(unit, minor=True))


def _fixed_axis(axis: XAxis | YAxis, values: Iterable[float]) -> None:
    """Ticks at exactly the values drawn (context lengths, dp sizes), labelled as integers."""
    axis.set_major_locator(FixedLocator(sorted(set(values))))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0f}"))
    axis.set_minor_locator(NullLocator())


def _ladder(steps: tuple[float, ...], low: float, high: float) -> list[float]:
    values = []
    for power in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1):
        values += [step * 10.0**power for step in steps]
    return [round(v, 10) for v in values if low <= v <= high]


def log_ticks(low: float, high: float) -> list[float]:
    """Tick values for a log axis spanning ``[low, high]``: 2 to ``MAX_TICKS`` of them.

    1-2-5 steps when they give at least three ticks, finer steps for a narrow
    span, whole decades for a wide one, and evenly spaced values when even the
    finer steps leave fewer than two (values all within a few percent).
    """
    low, high = min(low, high), max(low, high)
    coarse = _ladder(LADDERS[0], low, high)
    if len(coarse) > MAX_TICKS:
        decades = _ladder((1.0,), low, high)
        step = -(-len(decades) // MAX_TICKS)
        return decades[::step] if len(decades) >= 2 else coarse[:: -(-len(coarse) // MAX_TICKS)]
    if len(coarse) >= 3:
        return coarse
    fine = _ladder(LADDERS[1], low, high)
    if len(fine) >= 2:
        return fine[:MAX_TICKS] if len(fine) <= MAX_TICKS else fine[:: -(-len(fine) // MAX_TICKS)]
    even = [float(v) for v in MaxNLocator(nbins=4).tick_values(low, high) if low <= v <= high]
    return even if len(even) >= 2 else [low, high]


def _ladder_axis(
    axis: XAxis | YAxis, unit: Callable[[float], str], limits: tuple[float, float]
) -> None:
    """Ticks from ``log_ticks`` within ``limits`` (the axis's), labelled in its unit."""
    low, high = limits
    axis.set_major_locator(FixedLocator(log_ticks(low, high)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: unit(v)))
    axis.set_minor_locator(NullLocator())


def _si(value: float) -> str:
    for suffix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _seconds(value: float) -> str:
    return format_ns(value * 1e9)


# -- rendering --------------------------------------------------------------------------


def _figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(min(width, 40.0), min(height, 60.0)), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)  # the Agg canvas, chosen here and not through global state
    return figure


class RenderedFigure(NamedTuple):
    name: str
    title: str
    caption: str
    png: bytes
    svg: str


class SkippedFigure(NamedTuple):
    name: str
    title: str
    reason: str


Outcome = RenderedFigure | SkippedFigure


def done(name: str, title: str, caption: str, figure: Figure) -> RenderedFigure:
    """The figure rendered, with what the page shows beside it."""
    png, svg = _render(figure)
    return RenderedFigure(name, title, caption, png, svg)


def _render(figure: Figure) -> tuple[bytes, str]:
    png, svg = io.BytesIO(), io.BytesIO()
    figure.savefig(png, format="png", dpi=DPI, metadata={"Software": None})
    figure.set_layout_engine("none")  # keep the layout just computed: the SVG needs no second
    figure.savefig(svg, format="svg", metadata={"Date": None})
    return png.getvalue(), svg.getvalue().decode("utf-8")


def _legend(figure: Figure, axes: Sequence[Axes]) -> None:
    handles: dict[str, Artist] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        columns = max(1, min(3, len(handles)))
        figure.legend(
            list(handles.values()),
            list(handles),
            loc="outside lower center",
            ncols=columns,
            fontsize="small",
        )


def _grid(figure: Figure, count: int, columns: int = 2) -> list[Axes]:
    cols = min(columns, count)
    rows = -(-count // cols)
    grid = figure.subplots(rows, cols, squeeze=False)
    axes = [ax for row in grid for ax in row]
    for extra in axes[count:]:
        extra.set_visible(False)
    return axes[:count]
