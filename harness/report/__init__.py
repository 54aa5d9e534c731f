"""``attn-harness report``: benchmark results and conformance runs as one readable report.

``build_report(paths, out_dir)`` writes ``index.html`` (self-contained),
``summary.md`` (for a pull-request comment) and ``figures/NAME.png`` and
``NAME.svg``. Everything is computed in memory first, then written into a
fresh folder beside ``out_dir`` and renamed into place: a failure at any
point leaves the previous report (or nothing) at ``out_dir``, never a
partial one. numpy, matplotlib and torch load inside ``build_report``, so
importing this package (as the command-line parser does) stays cheap.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from harness.core.atomic_file import unwritable_reason
from harness.report.inputs import ReportError

__all__ = ["ReportError", "build_report", "unavailable_reason"]

DEFAULT_TITLE = "attn-harness report"
# what a report folder may hold and still be replaced: the report, and the screenshot
# `python -m harness.report.browser_check` leaves beside it
REPORT_ENTRIES = frozenset({"index.html", "summary.md", "figures", "screenshot.png"})


def unavailable_reason() -> str | None:
    """Why no report can be drawn here (matplotlib, an optional dependency, is missing)."""
    if importlib.util.find_spec("matplotlib") is None:
        return (
            "the report's figures need matplotlib, which is not installed: "
            "python -m pip install 'attn-harness[report]'"
        )
    return None


def _render(paths: Sequence[str | Path], title: str) -> dict[str, bytes]:
    """Every file of the report, by its path inside the report folder."""
    from harness.report.figure_style import RenderedFigure
    from harness.report.figures import make_figures
    from harness.report.inputs import load_inputs
    from harness.report.page import render_page
    from harness.report.pair_section import pair_figures
    from harness.report.stats import analyse
    from harness.report.summary_md import render_summary
    from harness.report.verdict import verdict_of

    inputs = load_inputs(paths)
    runs = analyse(inputs.bench)
    figures = [*make_figures(runs, inputs.conformance), *pair_figures(inputs.pairs)]
    verdict = verdict_of(inputs, runs)
    files = {
        "index.html": render_page(title, inputs, runs, figures, verdict).encode("utf-8"),
        "summary.md": render_summary(title, inputs, runs, verdict).encode("utf-8"),
    }
    for figure in figures:
        if isinstance(figure, RenderedFigure):  # names are fixed ones, never input text
            files[f"figures/{figure.name}.png"] = figure.png
            files[f"figures/{figure.name}.svg"] = figure.svg.encode("utf-8")
    return files


def _check_target(out: Path) -> None:
    """Refuse to replace anything but an earlier report (or an empty folder)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ReportError(f"--out {out}: exists and is not a folder")
    if out.is_dir():
        try:
            entries = {p.name for p in out.iterdir()}
        except OSError as exc:
            raise ReportError(f"--out {out}: cannot read folder: {exc.strerror or exc}") from None
        if not entries <= REPORT_ENTRIES:
            raise ReportError(
                f"--out {out}: folder exists and holds more than a report "
                f"({', '.join(sorted(entries - REPORT_ENTRIES)[:3])}); choose another folder"
            )


def _write_folder(folder: Path, files: dict[str, bytes]) -> None:
    for relative, data in files.items():
        target = folder / relative
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(data)
    folder.chmod(0o755)  # mkdtemp makes it private; a report is for sharing


def _swap_in(fresh: Path, out: Path) -> None:
    """Put ``fresh`` at ``out``; an earlier report there is removed only once it is replaced."""
    if not out.exists():
        os.rename(fresh, out)
        return
    holder = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
    try:
        os.rename(out, holder / "report")
    except BaseException:
        holder.rmdir()
        raise
    try:
        os.rename(fresh, out)
    except BaseException:
        os.rename(holder / "report", out)  # should this fail too, the old report stays in holder
        holder.rmdir()
        raise
    shutil.rmtree(holder, ignore_errors=True)


def _parent(out: Path) -> Path:
    """The folder ``out`` goes in; missing folders above it are made once the report is
    rendered, so the nearest one that exists must be a folder."""
    if (problem := unwritable_reason(out.parent / ".probe")) is not None:
        raise ReportError(f"--out {out}: {problem}")
    return out.parent


def build_report(
    paths: Sequence[str | Path], out_dir: str | Path, *, title: str | None = None
) -> Path:
    """Write the report of ``paths`` to ``out_dir``; the path of its ``index.html``.

    ``ReportError`` when an input cannot be used or ``out_dir`` cannot be
    written; ``out_dir`` is then as it was before.
    """
    missing = unavailable_reason()
    if missing is not None:
        raise ReportError(missing)
    out = Path(out_dir)
    parent = _parent(out)
    _check_target(out)
    files = _render(paths, title or DEFAULT_TITLE)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fresh = Path(tempfile.mkdtemp(dir=parent, prefix=f".{out.name}.", suffix=".tmp"))
    except OSError as exc:
        raise ReportError(f"--out {out}: cannot write in {parent}: {exc.strerror or exc}") from None
    try:
        _write_folder(fresh, files)
        _swap_in(fresh, out)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            shutil.rmtree(fresh)
        if isinstance(exc, OSError):
            raise ReportError(
                f"--out {out}: cannot write the report: {exc.strerror or exc}"
            ) from None
        raise
    return out / "index.html"
