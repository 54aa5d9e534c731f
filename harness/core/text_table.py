"""Plain aligned text tables, as every command prints them (readable in a CI log as in a terminal).

``aligned`` lays a table out at its natural width (what a file gets);
``fitted`` wraps its cells so that no line is wider than the terminal, and
``wrapped`` does the same for a line of prose. The width is
``terminal_width()``: ``$COLUMNS`` when set, else the terminal's, else 80
columns (output to a pipe or a CI log). Standard library only: the CLI
modules that import it must answer ``--help`` without loading torch.
"""

from __future__ import annotations

import re
import shutil
import textwrap
from collections.abc import Sequence

DEFAULT_WIDTH = 80
"""Columns when neither ``$COLUMNS`` nor a terminal says: a pipe, a file, a CI log."""

GAP = "  "
_BREAK = re.compile(r"(?<=[,/=])|(?<=:)(?!:)|(?<=\s)(?=\S)|(?<=[A-Za-z0-9]-)(?=[A-Za-z])")
"""Where a cell may break: after a space, comma, slash, =, colon (``::`` whole), or the
hyphen of a hyphenated word (not a minus sign: ``-14.5%`` stays whole)."""


def terminal_width() -> int:
    """The width output is fitted to: ``$COLUMNS``, else the terminal's, else 80."""
    return max(20, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)


def aligned(rows: list[list[str]]) -> list[str]:
    """The header row, a rule of dashes, then the rows, columns two spaces apart.

    A row of one cell is a heading line printed as it is, outside the column
    widths (the benchmark table's workload and case lines).
    """
    cells = [row for row in rows if len(row) > 1]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return _render(rows, widths)


def fitted(
    rows: list[list[str]],
    width: int,
    give_first: Sequence[int] = (),
    whole: Sequence[int] = (),
) -> list[str] | None:
    """``aligned``, with cells wrapped so that no line is wider than ``width``.

    The columns in ``give_first`` (free text, say, beside names better kept
    whole) give way first, down to a quarter of the width; then the widest
    column, a column at a time, down to its longest unbreakable piece.
    Columns in ``whole`` (names a reader searches for) are never broken.
    ``None`` when even that does not fit (the caller then lays its data out
    another way).
    """
    cells = [row for row in rows if len(row) > 1]
    columns = range(len(cells[0]))
    widths = [max(len(row[i]) for row in cells) for i in columns]
    floors = [
        widths[i] if i in whole else max(_longest_piece(row[i]) for row in cells) for i in columns
    ]
    room = width - len(GAP) * (len(widths) - 1)
    if sum(floors) > room:
        return None
    for i in give_first:
        widths[i] = max(floors[i], width // 4, widths[i] - (sum(widths) - room))
    while sum(widths) > room:
        shrinkable = [i for i in columns if widths[i] > floors[i]]
        widest = max(shrinkable, key=lambda i: widths[i])
        widths[widest] -= 1
    return _render(rows, widths, width)


def wrapped(line: str, width: int, indent: str = "  ", first: str = "") -> list[str]:
    """A line of prose broken at spaces to ``width``, continuation lines indented.

    ``first`` opens the first line (``FAILED ``). A line that fits is returned
    as it is. A word longer than the line (a long path) is kept whole, so that
    it can be copied.
    """
    if len(first) + len(line) <= width:
        return [first + line]
    return textwrap.wrap(
        line,
        width,
        initial_indent=first,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [first.rstrip()]


def _pieces(cell: str) -> list[str]:
    return [p for p in _BREAK.split(cell) if p]


def _longest_piece(cell: str) -> int:
    return max((len(p.rstrip()) for p in _pieces(cell)), default=0)


def _cell_lines(cell: str, width: int) -> list[str]:
    """``cell`` broken after its break characters into lines of at most ``width``."""
    if len(cell) <= width:
        return [cell]
    lines, current = [], ""
    for piece in _pieces(cell):
        if current and len((current + piece).rstrip()) > width:
            lines.append(current.rstrip())
            current = ""
        current += piece.lstrip() if not current else piece
    return [*lines, current.rstrip()]


def _render(rows: list[list[str]], widths: list[int], width: int | None = None) -> list[str]:
    lines: list[str] = []
    for n, row in enumerate(rows):
        if len(row) == 1:
            lines += wrapped(row[0], width) if width else [row[0]]
        else:
            split = [_cell_lines(c, w) for c, w in zip(row, widths, strict=True)]
            for k in range(max(len(s) for s in split)):
                parts = [(s[k] if k < len(s) else "").ljust(widths[i]) for i, s in enumerate(split)]
                lines.append(GAP.join(parts).rstrip())
        if n == 0:
            lines.append(GAP.join("-" * w for w in widths))
    return lines
