"""Plain aligned text tables, as every command prints them (readable in a CI log as in a terminal).

Standard library only: the CLI modules that import it must answer ``--help``
without loading torch.
"""

from __future__ import annotations


def aligned(rows: list[list[str]]) -> list[str]:
    """The header row, a rule of dashes, then the rows, columns two spaces apart.

    A row of one cell is a heading line printed as it is, outside the column
    widths (the benchmark table's workload and case lines).
    """
    cells = [row for row in rows if len(row) > 1]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = [
        row[0]
        if len(row) == 1
        else "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines
