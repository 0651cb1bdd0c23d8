"""The one Markdown table writer every report uses (layer 0: imports nothing of ours).

A table is a header row and body rows of cells already formatted as text; ``table``
escapes the pipes inside cells (so a cell may read ``12.1 | 13.0``) and returns the lines
without a trailing newline, so callers can ``"\\n".join`` them with other lines.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["cell", "table", "table_lines"]


def cell(value: object) -> str:
    """A cell's text: ``None`` reads as "-" (what every report prints for a figure not
    measured, ``bench.common.report.num``), pipes are escaped, newlines folded."""
    if value is None:
        return "-"
    return str(value).replace("\r", " ").replace("\n", " ").replace("|", "\\|")


def table_lines(header: Sequence[object], rows: Iterable[Sequence[object]],
                align: str | None = None) -> list[str]:
    """The lines of a Markdown table.

    ``align`` is one character per column (``l``, ``r`` or ``c``; default all ``-``, the
    renderer's default); every row must have as many cells as the header.
    """
    width = len(header)
    if width == 0:
        raise ValueError("a table needs at least one column")
    if align is not None and len(align) != width:
        raise ValueError(f"align has {len(align)} columns, the header {width}")
    marks = {"l": ":---", "r": "---:", "c": ":---:", "-": "---"}
    rule = [marks[a] for a in (align or "-" * width)]
    out = ["| " + " | ".join(cell(h) for h in header) + " |",
           "|" + "|".join(rule) + "|"]
    for i, row in enumerate(rows):
        if len(row) != width:
            raise ValueError(f"row {i} has {len(row)} cells, the header {width}")
        out.append("| " + " | ".join(cell(c) for c in row) + " |")
    return out


def table(header: Sequence[object], rows: Iterable[Sequence[object]],
          align: str | None = None) -> str:
    """The table as one string (``table_lines`` joined by newlines)."""
    return "\n".join(table_lines(header, rows, align))
