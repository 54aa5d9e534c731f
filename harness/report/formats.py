"""How the report writes its numbers, the same on the page and in ``summary.md``.

Compact forms that fit one table cell without wrapping: a ratio with its
interval as ``0.84x [0.80, 0.88]``, a share of a ceiling as ``12%``, and a
spread over cases as ``0.84x (0.52-1.9x)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.report.verdict import Range, WorkloadLine


def ratio(value: float | None, ci: tuple[float, float] | None = None) -> str:
    """``0.84x [0.80, 0.88]``; ``-`` when there is no ratio."""
    if value is None:
        return "-"
    return f"{value:.2f}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def percent(value: float | None) -> str:
    """A fraction as a percentage, to two significant figures below 10%."""
    if value is None:
        return "-"
    share = value * 100
    return f"{share:.2g}%" if share < 10 else f"{share:.0f}%"


def ratio_range(spread: Range | None) -> str:
    """The median ratio over cases and its extremes: ``0.84x (0.52-1.90x)``."""
    if spread is None:
        return "-"
    return f"{spread.median:.2f}x ({spread.low:.2f}-{spread.high:.2f}x)"


def percent_range(spread: Range | None) -> str:
    """The median share of the ceiling over cases and its extremes: ``12% (1.5-48%)``."""
    if spread is None:
        return "-"
    return f"{percent(spread.median)} ({percent(spread.low).rstrip('%')}-{percent(spread.high)})"


def workload_grid(
    lines: Sequence[WorkloadLine], several_runs: bool
) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-workload roofline table: a row per (run,) workload, a
    column per backend, each cell its share of the binding ceiling and which one binds,
    so a backend and the peer beside it read at a glance against the machine."""
    backends = list(dict.fromkeys(line.backend for line in lines))
    keys = list(dict.fromkeys((line.run, line.workload) for line in lines))
    cells = {(line.run, line.workload, line.backend): line for line in lines}
    header = (["run"] if several_runs else []) + ["workload", *backends]
    rows = []
    for run, workload in keys:
        row = ([run] if several_runs else []) + [workload]
        for backend in backends:
            line = cells.get((run, workload, backend))
            shown = "-" if line is None else percent_range(line.roofline)
            row.append(shown if line is None or not line.bound else f"{shown} {line.bound}")
        rows.append(row)
    return header, rows
