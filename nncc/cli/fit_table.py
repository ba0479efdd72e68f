"""Plain tables that fit the terminal by dropping whole columns, never by cutting cells.

Each column has a priority; while the table is wider than the terminal, the column of
lowest priority goes; then the dropped columns that fit after all come back, the most
useful first. Columns marked ``keep`` (what identifies a row) are never dropped
and never cut: a row whose kept cells alone exceed the width is printed whole.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

GAP = "  "


@dataclass
class Column:
    title: str
    priority: int = 0  # higher stays longer
    right: bool = False  # right-aligned (numbers)
    keep: bool = False  # never dropped


def terminal_width() -> int:
    """$COLUMNS, else the terminal's width, else 80 (stdout piped)."""
    return shutil.get_terminal_size((80, 24)).columns


def fit(columns: list[Column], rows: list[list[str]], width: int | None) -> list[int]:
    """Indices of the columns to show, in their order: all when ``width`` is None."""
    shown = list(range(len(columns)))
    if width is None:
        return shown

    def total(indices):
        return sum(_width(columns, rows, i) for i in indices) + len(GAP) * (len(indices) - 1)

    droppable = sorted((i for i, c in enumerate(columns) if not c.keep), key=lambda i: columns[i].priority)
    dropped = []
    for i in droppable:
        if total(shown) <= width:
            break
        shown.remove(i)
        dropped.append(i)
    for i in reversed(dropped):  # a narrow column of lower priority may fit where a wide one did not
        if total(sorted(shown + [i])) <= width:
            shown = sorted(shown + [i])
    return shown


def render(columns: list[Column], rows: list[list[str]], width: int | None) -> str:
    """The table as text lines: a header, then one line per row."""
    shown = fit(columns, rows, width)
    widths = {i: _width(columns, rows, i) for i in shown}
    lines = []
    for cells in [[c.title for c in columns], *rows]:
        parts = [cells[i].rjust(widths[i]) if columns[i].right else cells[i].ljust(widths[i]) for i in shown]
        lines.append(GAP.join(parts).rstrip())
    return "\n".join(lines)


def _width(columns: list[Column], rows: list[list[str]], i: int) -> int:
    return max([len(columns[i].title)] + [len(r[i]) for r in rows])
