"""The one Markdown table writer (src/recallspec/markdown.py)."""

from __future__ import annotations

import pytest

from recallspec.markdown import cell, table, table_lines


def test_table_lines_header_rule_and_rows() -> None:
    assert table_lines(["a", "b"], [[1, None], ["x | y", 2.5]]) == [
        "| a | b |",
        "|---|---|",
        "| 1 | - |",
        "| x \\| y | 2.5 |",
    ]


def test_alignment_and_join() -> None:
    assert table(["k", "v"], [["a", "1"]], align="lr") == "| k | v |\n|:---|---:|\n| a | 1 |"


def test_cells_fold_newlines() -> None:
    assert cell("two\nlines") == "two lines"


@pytest.mark.parametrize(("header", "rows", "align"), [
    ([], [], None),
    (["a", "b"], [["only one"]], None),
    (["a"], [], "lr"),
])
def test_bad_shapes_are_refused(header: list[str], rows: list[list[str]],
                                align: str | None) -> None:
    with pytest.raises(ValueError):
        table_lines(header, rows, align)
