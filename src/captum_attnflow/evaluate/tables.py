"""The markdown tables of the evaluation results: one frame for every table (header, separator,
one line a row) and the layer columns of the per-layer ones (L1..Ln, then ``score`` for
methods without layers). What a cell holds stays with each table."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """The lines of a markdown table: the header, the separator and one line per row of cells
    (each written as ``str`` writes it).

    Example::

        >>> print("\\n".join(markdown_table(["method", "L1"], [["raw", "0.30"], ["flow", ""]])))
        | method | L1 |
        |---|---|
        | raw | 0.30 |
        | flow |  |
    """
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows]


def layer_column(layer: int | None) -> str:
    """The column of ``layer``: ``"L3"`` for layer 3, ``"score"`` for a method without layers (None)."""
    return "score" if layer is None else f"L{layer}"


def layer_columns(rows: Iterable[Mapping]) -> list[str]:
    """The columns of ``rows`` (dicts with a ``layer``): ``L<layer>`` for each layer present,
    in order, then ``score`` if some row has no layer."""
    rows = list(rows)
    layers = sorted({row["layer"] for row in rows if row["layer"] is not None})
    return [layer_column(layer) for layer in layers] + (["score"] if any(row["layer"] is None for row in rows) else [])


def layer_row(label: str, cells: Mapping[str, str], columns: Sequence[str]) -> list[str]:
    """One row of a per-layer table: ``label``, then the cell of each column, empty where
    ``cells`` has none (a method without that layer)."""
    return [label] + [cells.get(column, "") for column in columns]


def undefined_counts(rows: Iterable[Mapping]) -> str:
    """``"method: count, ..."``: the methods of ``rows`` (dicts with ``method`` and
    ``nan_count``) with undefined values, in order of appearance, each with its most in any
    one row (layer); ``""`` when every value is defined."""
    most: dict = {}
    for row in rows:
        if row["nan_count"]:
            most[row["method"]] = max(most.get(row["method"], 0), row["nan_count"])
    return ", ".join(f"{method}: {count}" for method, count in most.items())
