"""The tables, CSV files and figures of a :class:`~captum_attnflow.evaluate.ComparisonResult`,
drawn from its summary rows (:meth:`~captum_attnflow.evaluate.ComparisonResult.summary`): the
paper's layout, one table (or panel) per reference, methods as rows, layers as columns."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from captum_attnflow.evaluate.panels import draw_method, label_panel, method_rows, panel_axes
from captum_attnflow.evaluate.tables import layer_column, layer_columns, layer_row, markdown_table, undefined_counts

# Published values to show beside the measured ones: {(method, reference, layer): (mean, std)},
# layer 1..L, or None for a method without layers.
Beside = Mapping[tuple, tuple]


def _references(summary: list[dict]) -> list[str]:
    return list(dict.fromkeys(row["reference"] for row in summary))


def comparison_markdown(
    summary: list[dict], examples: int, digits: int = 2, beside: Beside | None = None,
    names: tuple[str, str] = ("ours", "paper"),
) -> str:
    """The tables of :meth:`ComparisonResult.to_markdown` from its ``summary`` rows over ``examples`` examples."""
    blocks = []
    for reference in _references(summary):
        rows = [row for row in summary if row["reference"] == reference]
        columns = layer_columns(rows)
        table = []
        for method in dict.fromkeys(row["method"] for row in rows):
            mine = [row for row in rows if row["method"] == method]
            cells = {layer_column(row["layer"]): f"{row['mean']:.{digits}f} ± {row['std']:.{digits}f}" for row in mine}
            published = {
                layer_column(row["layer"]): "{:.{d}f} ± {:.{d}f}".format(*beside[key], d=digits)
                for row in mine
                if beside and (key := (method, reference, row["layer"])) in beside
            }
            table.append(layer_row(f"{method} ({names[0]})" if published else method, cells, columns))
            if published:
                table.append(layer_row(f"{method} ({names[1]})", published, columns))
        lines = [
            f"Spearman correlation with {reference} ({examples} examples, mean ± std)",
            "",
            *markdown_table(["method", *columns], table),
        ]
        if worst := undefined_counts(rows):
            lines += [
                "",
                "Left out as undefined (constant scores, < 2 tokens or NaN; examples, most in any layer): " + worst,
            ]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def write_comparison_csv(
    summary: list[dict], path: str | Path, beside: Beside | None = None, names: tuple[str, str] = ("ours", "paper")
) -> None:
    """The file of :meth:`ComparisonResult.to_csv` from its ``summary`` rows."""
    fields = ["method", "reference", "layer", "mean", "std", "count", "nan_count"]
    extra = [f"{names[1]}_mean", f"{names[1]}_std"] if beside is not None else []
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fields + extra)
        writer.writeheader()
        for row in summary:
            published = beside.get((row["method"], row["reference"], row["layer"]), ("", "")) if extra else ()
            writer.writerow({**row, "layer": "" if row["layer"] is None else row["layer"], **dict(zip(extra, published))})


def plot_comparison(
    summary: list[dict], ax: Any = None, beside: Beside | None = None, names: tuple[str, str] = ("ours", "paper")
) -> Any:
    """The figure of :meth:`ComparisonResult.plot` from its ``summary`` rows."""
    references = _references(summary)
    figure, axes = panel_axes(ax, len(references), "reference")
    for axes_, reference in zip(axes, references):
        rows = [row for row in summary if row["reference"] == reference]
        for color, method, mine in method_rows(rows):
            mean, std = (np.array([row[name] for row in mine]) for name in ("mean", "std"))
            layered = mine[0]["layer"] is not None
            published = [beside.get((method, reference, row["layer"])) for row in mine] if beside and layered else []
            draw_method(axes_, mine, mean, mean - std, mean + std, color, f"{method} ({names[0]})" if any(published) else method)
            if any(published):
                drawn = [(row["layer"], value[0]) for row, value in zip(mine, published) if value]
                axes_.plot(*zip(*drawn), linestyle=":", marker="x", color=color, label=f"{method} ({names[1]})")
        label_panel(axes_, f"Spearman with {reference}", reference)
    return figure

