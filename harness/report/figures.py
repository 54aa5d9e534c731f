"""The report's figures, drawn with matplotlib into PNG bytes and SVG text.

Each figure is a ``matplotlib.figure.Figure`` with its own Agg canvas: no
pyplot, no ``matplotlib.use``, no rcParams change, so importing this module
leaves the global state other code relies on as it was. The canvas, colours,
series and axes every figure shares are in ``harness.report.figure_style``.
A figure whose data is absent is not drawn; a ``SkippedFigure`` says why,
and the page shows it.

Names of figures (and so of their files) are the fixed ``FIGURE_NAMES``,
never derived from input. Text from input files reaches matplotlib only
through ``_text``, which keeps ``$`` from starting mathtext and a leading
``_`` from hiding a legend entry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from harness.report.figure_style import (
    OUTCOME_COLOURS,
    Outcome,
    Series,
    SkippedFigure,
    _errors,
    _figure,
    _fixed_axis,
    _grid,
    _ladder_axis,
    _legend,
    _seconds,
    _series,
    _si,
    _text,
    done,
    workload_key,
)
from harness.report.perf_figures import (
    RATIO,
    RATIO_TITLE,
    ROOFLINE,
    ROOFLINE_TITLE,
    ratio_figure,
    roofline_figure,
)
from harness.report.stats import AnalysedRun, CaseStats

if TYPE_CHECKING:
    from harness.report.inputs import ConformanceRun

TITLES = {
    RATIO: RATIO_TITLE,
    ROOFLINE: ROOFLINE_TITLE,
    "time-vs-context": "Forward time against context length",
    "throughput-vs-context": "Throughput against context length",
    "dp-scaling": "Data-parallel scaling",
    "conformance": "Conformance: backend x property",
}
FIGURE_NAMES = tuple(TITLES)


# -- 1 and 2: time and throughput against context length -----------------------------------


def _panels(runs: Sequence[AnalysedRun], kinds: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(workload key, kind)`` of each workload of those kinds with a passing case."""
    found: dict[str, str] = {}
    for kind in kinds:
        for run in runs:
            for c in run.cases:
                if c.kind == kind and c.valid and c.context_length:
                    found.setdefault(workload_key(c), kind)
    return list(found.items())


def _in_workload(key: str) -> Callable[[CaseStats], bool]:
    return lambda c: workload_key(c) == key


def _context_length(c: CaseStats) -> int | None:
    return c.context_length


def _by_context(
    runs: Sequence[AnalysedRun],
    name: str,
    ylabel: str,
    value: Callable[[CaseStats], tuple[float, float, float] | None],
    unit: Callable[[float], str],
    caption: str,
) -> Outcome:
    title = TITLES[name]
    panels = _panels(runs, ("decode", "prefill"))
    if not panels:
        return SkippedFigure(
            name, title, "no passing case of a decode or prefill workload in the input"
        )
    figure = _figure(6.4 * min(2, len(panels)), 4.2 * -(-len(panels) // 2) + 1.0)
    axes = _grid(figure, len(panels))
    for ax, (key, kind) in zip(axes, panels, strict=True):
        contexts: list[float] = []
        for series in _series(runs, _in_workload(key)):
            contexts += _plot_line(ax, series, _context_length, value)
        ax.set(xscale="log", yscale="log", xlabel="context length (longest sequence)")
        ax.set(ylabel=ylabel, title=f"{_text(key)} ({kind})")
        _fixed_axis(ax.xaxis, contexts)
        _ladder_axis(ax.yaxis, unit, ax.get_ylim())
        ax.grid(True, which="both", alpha=0.3)
    _legend(figure, axes)
    return done(name, title, caption, figure)


def _plot_line(
    ax: Axes,
    series: Series,
    x_of: Callable[[CaseStats], float | int | None],
    value: Callable[[CaseStats], tuple[float, float, float] | None],
) -> list[float]:
    """Draw one series; the x values drawn."""
    points = sorted(
        (x, v) for c in series.cases if (x := x_of(c)) is not None and (v := value(c)) is not None
    )
    if not points:
        return []
    ys, errors = _errors(v for _, v in points)
    ax.errorbar(
        [x for x, _ in points],
        ys,
        yerr=errors,
        label=series.label,
        color=series.colour,
        marker=series.marker,
        linestyle=series.linestyle,
        markersize=5,
        capsize=3,
    )
    return [float(x) for x, _ in points]


def _time(c: CaseStats) -> tuple[float, float, float] | None:
    if c.median_s is None or c.ci_s is None:
        return None
    return c.median_s, c.ci_s[0], c.ci_s[1]


def _throughput(c: CaseStats) -> tuple[float, float, float] | None:
    return c.per_second(c.tokens)


def time_figure(runs: Sequence[AnalysedRun]) -> Outcome:
    return _by_context(
        runs,
        "time-vs-context",
        "forward time, median",
        _time,
        _seconds,
        "Median time of one forward call per backend and the contiguous SDPA peer "
        "(contiguous-sdpa, black), against the longest context in the batch; one panel per "
        "decode or prefill workload. Error bars: bootstrap interval of the median, "
        "recomputed from the raw samples. Log axes.",
    )


def throughput_figure(runs: Sequence[AnalysedRun]) -> Outcome:
    return _by_context(
        runs,
        "throughput-vs-context",
        "query tokens per second",
        _throughput,
        _si,
        "Query tokens processed per second (tokens over the median forward time) against "
        "the longest context in the batch. Error bars: the median's bootstrap interval "
        "carried over to the rate. Log axes.",
    )


# -- 5: DP scaling ------------------------------------------------------------------------


def _dp_size(c: CaseStats) -> int | None:
    size = (c.case.spec or {}).get("dp_size")
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def dp_figure(runs: Sequence[AnalysedRun]) -> Outcome:
    name = "dp-scaling"
    title = TITLES[name]
    panels = _panels(runs, ("dp-scaling",))
    if not panels:
        return SkippedFigure(name, title, "no passing case of a dp-scaling workload in the input")
    figure = _figure(6.4 * min(2, len(panels)), 4.2 * -(-len(panels) // 2) + 1.0)
    axes = _grid(figure, len(panels))
    for ax, (key, _) in zip(axes, panels, strict=True):
        sizes: list[float] = []
        for series in _series(runs, _in_workload(key)):
            sizes += _plot_line(ax, series, _dp_size, _throughput)
        ax.set(yscale="log", xlabel="dp_size", ylabel="query tokens per second")
        _fixed_axis(ax.xaxis, sizes)
        _ladder_axis(ax.yaxis, _si, ax.get_ylim())
        ax.set_title(_text(key))
        ax.grid(True, which="both", alpha=0.3)
    _legend(figure, axes)
    caption = (
        "Query tokens per second against the number of data-parallel ranks, for a fixed "
        "global decode batch. dp-sweep (one process) times the most loaded rank's share; "
        "dist-dp-scaling (`attn-harness dist-bench`) times the whole group of real rank "
        "processes, barrier to barrier. Error bars: the median's bootstrap interval carried "
        "over to the rate."
    )
    return done(name, title, caption, figure)


# -- 6: conformance matrix ----------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    outcome: str
    text: str


def _cell(outcomes: list[str], examples: int) -> Cell:
    failed = outcomes.count("failed")
    if failed:
        text = f"failed {failed}/{len(outcomes)}" if len(outcomes) > 1 else "failed"
        return Cell("failed", text)
    passed = outcomes.count("passed")
    if passed:
        return Cell("passed", f"{examples} ex" if examples else _plural(passed, "case"))
    return Cell("unsupported", "unsupported")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def conformance_matrix(
    runs: Sequence[ConformanceRun],
) -> tuple[list[str], list[str], dict[tuple[str, int], Cell]]:
    """Rows (tests), columns (backend, per run when several) and the cell at (test, column)."""
    columns: list[tuple[int, str]] = []
    for index, run in enumerate(runs):
        columns += dict.fromkeys((index, c.backend) for c in run.cases)
    tests = sorted({c.test for run in runs for c in run.cases})
    cells: dict[tuple[str, int], Cell] = {}
    for j, (index, backend) in enumerate(columns):
        run = runs[index]
        for test in tests:
            outcomes = [c.outcome for c in run.cases if c.backend == backend and c.test == test]
            if outcomes:
                cells[test, j] = _cell(outcomes, run.examples.get(backend, {}).get(test, 0))
    names = [b if len(runs) == 1 else f"{b} ({runs[i].path.name})" for i, b in columns]
    return tests, names, cells


def conformance_figure(runs: Sequence[ConformanceRun]) -> Outcome:
    name = "conformance"
    title = TITLES[name]
    tests, columns, cells = conformance_matrix(runs)
    if not tests:
        return SkippedFigure(name, title, "no conformance JUnit XML with test cases in the input")
    longest = max(len(_text(t)) for t in tests)
    figure = _figure(2.0 + 0.075 * longest + 1.5 * len(columns), 1.8 + 0.32 * len(tests))
    ax = figure.subplots()
    for (test, j), cell in cells.items():
        i = tests.index(test)
        ax.add_patch(Rectangle((j, i), 1, 1, facecolor=OUTCOME_COLOURS[cell.outcome], ec="white"))
        ax.text(j + 0.5, i + 0.5, cell.text, ha="center", va="center", fontsize="x-small")
    ax.set_xlim(0, len(columns))
    ax.set_ylim(len(tests), 0)
    ax.set_xticks([j + 0.5 for j in range(len(columns))], [_text(c) for c in columns])
    ax.set_yticks([i + 0.5 for i in range(len(tests))], [_text(t) for t in tests])
    ax.tick_params(axis="x", labeltop=True, labelbottom=False, rotation=20, length=0)
    ax.tick_params(axis="y", length=0, labelsize="small")
    for spine in ax.spines.values():
        spine.set_visible(False)
    handles: list[Artist] = [Patch(facecolor=c, label=o) for o, c in OUTCOME_COLOURS.items()]
    handles.append(Line2D([], [], linestyle="none", label="text: examples held (ex) or cases"))
    figure.legend(handles=handles, loc="outside lower center", ncols=4, fontsize="small")
    caption = (
        "Each conformance property (row) for each backend (column): green passed, red failed, "
        "grey unsupported (skipped: outside the backend's claim), blank not run. Text: the "
        "hypothesis examples the property held for (from the coverage file), or the number of "
        "parametrised cases."
    )
    return done(name, title, caption, figure)


# -- all of them --------------------------------------------------------------------------


def make_figures(
    runs: Sequence[AnalysedRun], conformance: Sequence[ConformanceRun]
) -> list[Outcome]:
    """Every figure in ``FIGURE_NAMES`` order, drawn or skipped with its reason."""
    bench: list[Callable[[Sequence[AnalysedRun]], Outcome]] = [
        ratio_figure,
        roofline_figure,
        time_figure,
        throughput_figure,
        dp_figure,
    ]
    outcomes: list[Outcome] = []
    for name, draw in zip(FIGURE_NAMES[: len(bench)], bench, strict=True):
        outcomes.append(
            draw(runs) if runs else SkippedFigure(name, TITLES[name], "no benchmark results given")
        )
    outcomes.append(conformance_figure(conformance))
    return outcomes
