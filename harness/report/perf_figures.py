"""The two figures that answer "how fast": the ratio to the in-run peer, and the roofline.

Both are small multiples, one panel per workload, because a workload's cases
share a meaning (a context sweep, a dp sweep) that a reader follows along an
axis, while cases of different workloads do not compare. In the ratio figure
each backend is a line over its workload's cases on a shared log axis whose
ticks are chosen by ``figure_style.log_ticks``, so even a report of one workload
with ratios close together gets several labelled ticks. In the roofline each
point is coloured by backend (as in every figure) and shaped by its case,
named in the panel's own legend, so points of one arithmetic intensity (the
decode cases of every context) are told apart.

``ratio_plot`` and ``roofline_plot`` return the ``Figure`` itself (or why
none can be drawn), so its axes and ticks can be inspected; the
``*_figure`` functions render it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from harness.report.figure_style import (
    DTYPE_COLOURS,
    MARKERS,
    Outcome,
    Series,
    SkippedFigure,
    _errors,
    _figure,
    _legend,
    _log_axis,
    _series,
    _si,
    _text,
    done,
    log_ticks,
    workload_key,
)
from harness.report.stats import AnalysedRun, CaseStats, ceilings

RATIO = "ratio-to-peer"
RATIO_TITLE = "Time relative to the in-run no-paging peer, per workload"
ROOFLINE = "roofline"
ROOFLINE_TITLE = "Roofline per workload: achieved FLOP/s against arithmetic intensity"
COLUMNS = 3  # panels side by side: at 1280 px each still shows its case labels whole
PANEL_WIDTH = 4.2  # inches at 100 dpi
RATIO_PANEL_HEIGHT = 3.1
ROOFLINE_PANEL_HEIGHT = 3.4
LABEL_WIDTH = 18  # characters of a case label per line under the ratio panels
SAME_INTENSITY = 1.03  # intensities within 3% of each other share a roofline column
SPREAD_DECADES = 0.3  # how wide such a column is spread, its cases side by side


def _workloads(runs: Sequence[AnalysedRun], keep: Callable[[CaseStats], bool]) -> list[str]:
    """Each workload (name@version) with a case ``keep`` selects, in the order of the runs."""
    return list(
        dict.fromkeys(workload_key(c) for run in runs for c in run.cases if c.valid and keep(c))
    )


def _cases_of(
    runs: Sequence[AnalysedRun], key: str, keep: Callable[[CaseStats], bool]
) -> list[str]:
    return list(
        dict.fromkeys(
            c.case.case
            for run in runs
            for c in run.cases
            if c.valid and keep(c) and workload_key(c) == key
        )
    )


def _panels(figure: Figure, count: int) -> list[Axes]:
    """``count`` axes in rows of ``COLUMNS``, sharing the y axis; spare cells hidden."""
    cols = min(COLUMNS, count)
    grid = figure.subplots(-(-count // cols), cols, squeeze=False, sharey=True)
    axes = [ax for row in grid for ax in row]
    for spare in axes[count:]:
        spare.set_visible(False)
    for ax in axes[:count]:
        ax.yaxis.set_tick_params(labelleft=True)  # every panel keeps its scale
    return axes[:count]


def _ratio_label(value: float, _: object = None) -> str:
    return f"{value:.3g}x"


def _ratio_axis(ax: Axes, values: Sequence[float]) -> None:
    """Log scale, limits padded around every value and 1, ticks from ``log_ticks``."""
    low, high = min(*values, 1.0), max(*values, 1.0)
    pad = max((high / low) ** 0.06, 1.04)
    low, high = low / pad, high * pad
    ax.set_yscale("log")
    ax.set_ylim(low, high)
    ax.yaxis.set_major_locator(FixedLocator(log_ticks(low, high)))
    ax.yaxis.set_major_formatter(FuncFormatter(_ratio_label))
    ax.yaxis.set_minor_locator(NullLocator())


# -- the ratio figure -------------------------------------------------------------------------


def _peer_ratio(c: CaseStats) -> tuple[float, float, float] | None:
    if c.ratio_peer is None or c.ratio_peer_ci is None:
        return None
    return c.ratio_peer, *c.ratio_peer_ci


def _has_ratio(c: CaseStats) -> bool:
    return _peer_ratio(c) is not None


def _ratio_panel(ax: Axes, key: str, cases: list[str], all_series: list[Series]) -> list[float]:
    """One workload: each series a line over the cases; the values drawn (for the axis)."""
    position = {name: i for i, name in enumerate(cases)}
    drawn: list[float] = []
    step = min(0.06, 0.4 / max(len(all_series), 1))
    for j, series in enumerate(all_series):
        offset = (j - (len(all_series) - 1) / 2) * step  # apart enough to see each interval
        points = sorted(
            (position[c.case.case] + offset, v)
            for c in series.cases
            if workload_key(c) == key and (v := _peer_ratio(c)) is not None
        )
        if not points:
            continue
        ys, errors = _errors(v for _, v in points)
        ax.errorbar(
            [x for x, _ in points],
            ys,
            yerr=errors,
            label=series.label,
            color=series.colour,
            marker=series.marker,
            linestyle=series.linestyle,
            linewidth=1.0,
            markersize=5,
            capsize=2,
        )
        drawn += [value for _, triple in points for value in triple]
    ax.axhline(1.0, color="#555555", linewidth=1.2, zorder=1)
    labels = [textwrap.fill(_text(c), LABEL_WIDTH) for c in cases]
    ax.set_xticks(range(len(cases)), labels, fontsize="small")
    ax.set_xlim(-0.5, len(cases) - 0.5)
    ax.set_title(_text(key))
    ax.grid(True, axis="y", alpha=0.3)
    return drawn


def _panel_grid(count: int, panel_height: float) -> tuple[Figure, list[Axes]]:
    """A figure of ``count`` panels, ``COLUMNS`` across at most, each ``panel_height`` tall."""
    rows = -(-count // COLUMNS)
    cols = min(COLUMNS, count)
    figure = _figure(PANEL_WIDTH * cols + 0.6, panel_height * rows + 1.0)
    return figure, _panels(figure, count)


def ratio_plot(runs: Sequence[AnalysedRun]) -> Figure | str:
    """The ratio figure, one panel per workload; a reason instead when nothing has a ratio."""
    keys = _workloads(runs, _has_ratio)
    if not keys:
        return "no passing backend case with a passing peer to compare"
    all_series = _series(runs, _has_ratio)
    figure, axes = _panel_grid(len(keys), RATIO_PANEL_HEIGHT)
    drawn: list[float] = []
    for ax, key in zip(axes, keys, strict=True):
        drawn += _ratio_panel(ax, key, _cases_of(runs, key, _has_ratio), all_series)
    for ax in axes:
        _ratio_axis(ax, drawn)
    for i, ax in enumerate(axes):
        if i % COLUMNS == 0:  # the first panel of each row
            ax.set_ylabel("time / peer's time (log)")
    _legend(figure, axes)
    return figure


def ratio_figure(runs: Sequence[AnalysedRun]) -> Outcome:
    drawn = ratio_plot(runs)
    if isinstance(drawn, str):
        return SkippedFigure(RATIO, RATIO_TITLE, drawn)
    caption = (
        "One panel per workload: each backend's median forward time over the in-run contiguous "
        "SDPA peer's (same tokens, no paging), case by case; the line at 1x is the peer, below "
        "it is faster. Bars: bootstrap interval of the ratio, both sample sets resampled "
        "independently. A backend with no timed case (unsupported, failed) has no line here; the "
        "verdict lists it. The ratio to reference is in the case tables."
    )
    return done(RATIO, RATIO_TITLE, caption, drawn)


# -- the roofline -----------------------------------------------------------------------------


def _achieved(c: CaseStats) -> tuple[float, float] | None:
    rate, intensity = c.per_second(c.flops), c.intensity
    return None if rate is None or intensity is None else (intensity, rate[0])


def _has_point(c: CaseStats) -> bool:
    return _achieved(c) is not None


def _ridges(runs: Sequence[AnalysedRun]) -> list[float]:
    """Intensities where a bandwidth slope meets a compute roof: a panel's span shows them."""
    return [
        peak / c.memory_bandwidth
        for run in runs
        for c in ceilings(run.record)
        if c.memory_bandwidth
        for peak in c.matmul_flops.values()
    ]


def _draw_ceilings(ax: Axes, runs: Sequence[AnalysedRun], span: tuple[float, float]) -> int:
    """Each run's measured (solid) and datasheet (dashed) ceilings; how many were drawn."""
    drawn = 0
    low, high = span
    xs = [low * (high / low) ** (i / 64) for i in range(65)]
    for run in runs:
        suffix = "" if len(runs) == 1 else f" @ {run.label}"
        for ceiling in ceilings(run.record):
            style = "-" if ceiling.source == "measured" else "--"
            for dtype, peak in (ceiling.matmul_flops or {"": float("inf")}).items():
                bandwidth = ceiling.memory_bandwidth or float("inf")
                ys = [min(bandwidth * x, peak) for x in xs]
                if all(y == float("inf") for y in ys):
                    continue
                what = f"{ceiling.source} {dtype or 'bandwidth'} roof{suffix}"
                colour = DTYPE_COLOURS.get(dtype, "#455a64")
                ax.plot(xs, ys, linestyle=style, color=colour, linewidth=1.2, label=_text(what))
                drawn += 1
    return drawn


def _spread(runs: Sequence[AnalysedRun], key: str, cases: list[str]) -> dict[str, float]:
    """A factor on each case's intensity: cases of one intensity spread sideways in case order.

    Decode cases of every context length move the same bytes per FLOP, so on a
    roofline they fall in one column; spread over ``SPREAD_DECADES`` around it
    (the caption says so), each case is seen. A case alone at its intensity
    keeps it exactly.
    """
    intensity: dict[str, float] = {}
    for name in cases:
        found = [
            c.intensity
            for run in runs
            for c in run.cases
            if workload_key(c) == key and c.case.case == name and c.intensity and _has_point(c)
        ]
        intensity[name] = sorted(found)[len(found) // 2]
    factor = {name: 1.0 for name in cases}
    groups: list[list[str]] = []
    for name in sorted(cases, key=lambda n: intensity[n]):
        if groups and intensity[name] <= intensity[groups[-1][0]] * SAME_INTENSITY:
            groups[-1].append(name)
        else:
            groups.append([name])
    for group in groups:
        ordered = [n for n in cases if n in group]  # the workload's own order, e.g. by context
        for i, name in enumerate(ordered):
            if len(ordered) > 1:
                factor[name] = 10 ** (SPREAD_DECADES * (i / (len(ordered) - 1) - 0.5))
    return factor


def _roofline_panel(
    ax: Axes, runs: Sequence[AnalysedRun], key: str, all_series: list[Series]
) -> tuple[list[float], int]:
    """One workload's points, shaped by case; the rates drawn and the ceilings drawn."""
    cases = _cases_of(runs, key, _has_point)
    shape = {name: MARKERS[i % len(MARKERS)] for i, name in enumerate(cases)}
    spread = _spread(runs, key, cases)
    xs: list[float] = []
    rates: list[float] = []
    for series in all_series:
        mine = {
            c.case.case: p for c in series.cases if workload_key(c) == key and (p := _achieved(c))
        }
        points = [
            (name, (mine[name][0] * spread[name], mine[name][1])) for name in cases if name in mine
        ]
        if len(points) > 1:
            ax.plot(
                [x for _, (x, _) in points],
                [y for _, (_, y) in points],
                color=series.colour,
                linewidth=0.8,
                alpha=0.5,
                linestyle=series.linestyle,
            )
        for name, (x, y) in points:
            ax.scatter(
                [x],
                [y],
                color=series.colour,
                marker=shape[name],
                s=34,
                zorder=3,
                edgecolors="white",
                linewidths=0.4,
            )
            xs.append(x)
            rates.append(y)
    ridges = _ridges(runs)
    low, high = min(xs + ridges), max(xs + ridges)
    drawn = _draw_ceilings(ax, runs, (low / 3, high * 3))
    ax.set(xscale="log", yscale="log", xlabel="FLOP / byte")
    ax.set_xlim(low / 3, high * 3)
    _log_axis(ax.xaxis, _si)
    _log_axis(ax.yaxis, _si)
    ax.set_title(_text(key))
    ax.grid(True, which="major", alpha=0.3)
    handles = [
        Line2D(
            [],
            [],
            color="#616161",
            marker=shape[name],
            linestyle="none",
            label=textwrap.fill(_text(name), 24),
        )
        for name in cases
    ]
    ax.legend(
        handles=handles,
        fontsize="x-small",
        loc="lower right",
        title="case",
        title_fontsize="x-small",
        framealpha=0.8,
    )
    return rates, drawn


def roofline_plot(runs: Sequence[AnalysedRun]) -> tuple[Figure, int] | str:
    """The roofline, one panel per workload, and how many ceilings it draws per panel."""
    keys = _workloads(runs, _has_point)
    if not keys:
        return "no passing case with FLOP and byte counts"
    all_series = _series(runs, _has_point)
    figure, axes = _panel_grid(len(keys), ROOFLINE_PANEL_HEIGHT)
    rates: list[float] = []
    drawn = 0
    for ax, key in zip(axes, keys, strict=True):
        panel_rates, drawn = _roofline_panel(ax, runs, key, all_series)
        rates += panel_rates
    roofs = [peak for run in runs for c in ceilings(run.record) for peak in c.matmul_flops.values()]
    axes[0].set_ylim(min(rates) / 2.5, max(rates + roofs) * 2.5)
    for i, ax in enumerate(axes):
        if i % COLUMNS == 0:  # the first panel of each row
            ax.set_ylabel("achieved FLOP/s")
    _roofline_legend(figure, axes[0], all_series)
    return figure, drawn


def _roofline_legend(figure: Figure, ax: Axes, all_series: list[Series]) -> None:
    """Backends by colour (one neutral shape: shapes are cases here), then the ceilings."""
    handles: dict[str, Artist] = {
        s.label: Line2D([], [], color=s.colour, marker="o", linestyle="none", label=s.label)
        for s in all_series
    }
    for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
        handles.setdefault(label, handle)
    figure.legend(
        list(handles.values()),
        list(handles),
        loc="outside lower center",
        ncols=min(4, len(handles)),
        fontsize="small",
    )


def roofline_figure(runs: Sequence[AnalysedRun]) -> Outcome:
    drawn = roofline_plot(runs)
    if isinstance(drawn, str):
        return SkippedFigure(ROOFLINE, ROOFLINE_TITLE, drawn)
    figure, ceilings_drawn = drawn
    caption = (
        "One panel per workload: each passing case's FLOPs over its median forward time "
        "against FLOPs per byte moved; colour: the backend, shape: the case (the panel's "
        "legend), a faint line joins one backend's cases in the workload's order. Cases of "
        "one intensity (decode at every context length, every dp size) are spread sideways "
        "in that order over a factor of 2 around it, so each is seen. Lines: the run's "
        "ceilings, the memory-bandwidth slope capped by the matmul roof of each dtype; "
        "measured ceilings solid, datasheet ceilings dashed. The verdict gives each "
        "backend's share of the binding ceiling."
    )
    if not ceilings_drawn:
        caption += " No ceilings were recorded in the input, so none are drawn."
    return done(ROOFLINE, ROOFLINE_TITLE, caption, figure)
