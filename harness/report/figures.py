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
from typing import TYPE_CHECKING, NamedTuple

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from harness.report.figure_style import (
    DTYPE_COLOURS,
    OUTCOME_COLOURS,
    Series,
    _errors,
    _figure,
    _fixed_axis,
    _grid,
    _legend,
    _log_axis,
    _render,
    _seconds,
    _series,
    _si,
    _text,
)
from harness.report.stats import AnalysedRun, CaseStats, ceilings

if TYPE_CHECKING:
    from harness.report.inputs import ConformanceRun

TITLES = {
    "time-vs-context": "Forward time against context length",
    "throughput-vs-context": "Throughput against context length",
    "ratio-to-peer": "Time relative to the no-paging peer and to reference",
    "roofline": "Roofline: achieved FLOP/s against arithmetic intensity",
    "dp-scaling": "Data-parallel scaling",
    "conformance": "Conformance: backend x property",
}
FIGURE_NAMES = tuple(TITLES)


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


def _done(name: str, title: str, caption: str, figure: Figure) -> RenderedFigure:
    png, svg = _render(figure)
    return RenderedFigure(name, title, caption, png, svg)


# -- 1 and 2: time and throughput against context length -----------------------------------


def _panels(runs: Sequence[AnalysedRun], kinds: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(workload key, kind)`` of each workload of those kinds with a passing case."""
    found: dict[str, str] = {}
    for kind in kinds:
        for run in runs:
            for c in run.cases:
                if c.kind == kind and c.valid and c.context_length:
                    found.setdefault(_workload_key(c), kind)
    return list(found.items())


def _workload_key(c: CaseStats) -> str:
    return f"{c.case.workload}@{c.case.workload_version}"


def _in_workload(key: str) -> Callable[[CaseStats], bool]:
    return lambda c: _workload_key(c) == key


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
        _log_axis(ax.yaxis, unit)
        ax.grid(True, which="both", alpha=0.3)
    _legend(figure, axes)
    return _done(name, title, caption, figure)


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


# -- 3: ratios to the peer and to reference -----------------------------------------------


def _case_key(c: CaseStats) -> str:
    return f"{c.case.workload}@{c.case.workload_version} / {c.case.case}"


def _ratio_panel(
    ax: Axes,
    runs: Sequence[AnalysedRun],
    value: Callable[[CaseStats], tuple[float, float, float] | None],
    categories: list[str],
    title: str,
) -> None:
    all_series = _series(runs, lambda c: value(c) is not None)
    row = {key: i for i, key in enumerate(categories)}
    step = 0.8 / max(len(all_series), 1)
    for j, series in enumerate(all_series):
        offset = (j - (len(all_series) - 1) / 2) * step
        points = [(row[_case_key(c)] + offset, v) for c in series.cases if (v := value(c))]
        xs, errors = _errors(v for _, v in points)
        ax.errorbar(
            xs,
            [y for y, _ in points],
            xerr=errors,
            label=series.label,
            color=series.colour,
            marker=series.marker,
            linestyle="none",
            markersize=5,
            capsize=2,
        )
    ax.axvline(1.0, color="#555555", linewidth=1)
    ax.set_xscale("log")
    _log_axis(ax.xaxis, lambda v: f"{v:.3g}")
    ax.set_title(title)
    ax.grid(True, axis="x", which="both", alpha=0.3)


def _peer_ratio(c: CaseStats) -> tuple[float, float, float] | None:
    if c.ratio_peer is None or c.ratio_peer_ci is None:
        return None
    return c.ratio_peer, *c.ratio_peer_ci


def _reference_ratio(c: CaseStats) -> tuple[float, float, float] | None:
    if c.ratio_reference is None or c.ratio_reference_ci is None:
        return None
    return c.ratio_reference, *c.ratio_reference_ci


def ratio_figure(runs: Sequence[AnalysedRun]) -> Outcome:
    name = "ratio-to-peer"
    title = TITLES[name]
    kinds: list[tuple[str, Callable[[CaseStats], tuple[float, float, float] | None]]] = [
        ("forward time / contiguous-sdpa time", _peer_ratio),
        ("forward time / reference time", _reference_ratio),
    ]
    used = [(t, f) for t, f in kinds if any(f(c) for run in runs for c in run.cases)]
    if not used:
        return SkippedFigure(name, title, "no passing backend case with a passing peer to compare")
    categories = list(
        dict.fromkeys(_case_key(c) for run in runs for c in run.cases for _, f in used if f(c))
    )
    series = max(len(_series(runs, lambda c: any(f(c) for _, f in used))), 1)
    figure = _figure(5.5 * len(used) + 3.0, 1.6 + len(categories) * max(0.3, 0.09 * series))
    axes = figure.subplots(1, len(used), squeeze=False, sharey=True)[0]
    for ax, (panel_title, value) in zip(axes, used, strict=True):
        _ratio_panel(ax, runs, value, categories, panel_title)
    axes[0].set_yticks(range(len(categories)), [_text(c) for c in categories], fontsize="small")
    axes[0].set_ylim(len(categories) - 0.5, -0.5)
    for ax in axes:
        ax.set_xlabel("ratio (log; > 1: slower)")
        ax.tick_params(axis="x", labeltop=len(categories) > 20)  # a tall figure: scale on top too
    _legend(figure, list(axes))
    caption = (
        "Per case and backend: median forward time over the contiguous SDPA peer's "
        "(no paging) and, where reference ran, over reference's; bars: bootstrap interval "
        "of the ratio, both sample sets resampled independently. Right of the line is slower."
    )
    return _done(name, title, caption, figure)


# -- 4: roofline --------------------------------------------------------------------------


def _achieved(c: CaseStats) -> tuple[float, float] | None:
    rate, intensity = c.per_second(c.flops), c.intensity
    return None if rate is None or intensity is None else (intensity, rate[0])


def _draw_ceilings(ax: Axes, runs: Sequence[AnalysedRun], span: tuple[float, float]) -> int:
    """Each run's measured (solid) and datasheet (dashed) ceilings; how many were drawn."""
    drawn = 0
    low, high = span
    xs = [low * (high / low) ** (i / 64) for i in range(65)]
    for run in runs:
        suffix = "" if len(runs) == 1 else f" @ {run.label}"
        for ceiling in ceilings(run.record):
            style = "-" if ceiling.source == "measured" else "--"
            roofs = ceiling.matmul_flops or {"": float("inf")}
            for dtype, peak in roofs.items():
                bandwidth = ceiling.memory_bandwidth or float("inf")
                ys = [min(bandwidth * x, peak) for x in xs]
                if all(y == float("inf") for y in ys):
                    continue
                what = f"{ceiling.source} {dtype or 'bandwidth'} roof{suffix}"
                colour = DTYPE_COLOURS.get(dtype, "#455a64")
                ax.plot(xs, ys, linestyle=style, color=colour, linewidth=1.2, label=_text(what))
                drawn += 1
    return drawn


def _ridges(runs: Sequence[AnalysedRun]) -> list[float]:
    """Intensities where a bandwidth slope meets a compute roof: the span must show them."""
    return [
        peak / c.memory_bandwidth
        for run in runs
        for c in ceilings(run.record)
        if c.memory_bandwidth
        for peak in c.matmul_flops.values()
    ]


def roofline_figure(runs: Sequence[AnalysedRun]) -> Outcome:
    name = "roofline"
    title = TITLES[name]
    all_series = _series(runs, lambda c: _achieved(c) is not None)
    if not all_series:
        return SkippedFigure(name, title, "no passing case with FLOP and byte counts")
    figure = _figure(8.0, 6.5)
    ax = figure.subplots()
    points = []
    for series in all_series:
        xy = [p for c in series.cases if (p := _achieved(c))]
        points += xy
        ax.scatter(
            [x for x, _ in xy],
            [y for _, y in xy],
            label=series.label,
            color=series.colour,
            marker=series.marker,
            s=28,
            zorder=3,
        )
    intensities = [x for x, _ in points] + _ridges(runs)
    drawn = _draw_ceilings(ax, runs, (min(intensities) / 4, max(intensities) * 4))
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / byte)")
    ax.set(ylabel="achieved FLOP/s")
    _log_axis(ax.xaxis, _si)
    _log_axis(ax.yaxis, _si)
    ax.grid(True, which="both", alpha=0.3)
    _legend(figure, [ax])
    caption = (
        "Each passing case: FLOPs over the median forward time against FLOPs per byte moved. "
        "Lines: the run's ceilings, the memory-bandwidth slope capped by the matmul roof of "
        "each dtype; measured ceilings solid, datasheet ceilings dashed."
    )
    if not drawn:
        caption += " No ceilings were recorded in the input, so none are drawn."
    return _done(name, title, caption, figure)


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
        _log_axis(ax.yaxis, _si)
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
    return _done(name, title, caption, figure)


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
    return _done(name, title, caption, figure)


# -- all of them --------------------------------------------------------------------------


def make_figures(
    runs: Sequence[AnalysedRun], conformance: Sequence[ConformanceRun]
) -> list[Outcome]:
    """Every figure in ``FIGURE_NAMES`` order, drawn or skipped with its reason."""
    bench: list[Callable[[Sequence[AnalysedRun]], Outcome]] = [
        time_figure,
        throughput_figure,
        ratio_figure,
        roofline_figure,
        dp_figure,
    ]
    outcomes: list[Outcome] = []
    for name, draw in zip(FIGURE_NAMES[: len(bench)], bench, strict=True):
        outcomes.append(
            draw(runs) if runs else SkippedFigure(name, TITLES[name], "no benchmark results given")
        )
    outcomes.append(conformance_figure(conformance))
    return outcomes
