"""The tables, CSV files and figures of a :class:`~captum_attnflow.evaluate.results.ComparisonResult`:
the paper's layout, one table (or panel) per reference, methods as rows, layers as columns."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from captum_attnflow.evaluate.panels import panel_axes

if TYPE_CHECKING:
    from captum_attnflow.evaluate.results import Beside, ComparisonResult


def comparison_markdown(
    result: ComparisonResult, digits: int = 2, beside: Beside | None = None, names: tuple[str, str] = ("ours", "paper")
) -> str:
    """The tables of :meth:`ComparisonResult.to_markdown`."""
    blocks = []
    for reference in result.references:
        rows = [row for row in result.summary() if row["reference"] == reference]
        layers = sorted({row["layer"] for row in rows if row["layer"] is not None})
        columns = [f"L{layer}" for layer in layers] + (["score"] if any(r["layer"] is None for r in rows) else [])
        lines = [
            f"Spearman correlation with {reference} ({len(result)} examples, mean ± std)",
            "",
            "| method | " + " | ".join(columns) + " |",
            "|---|" + "---|" * len(columns),
        ]
        for method in dict.fromkeys(row["method"] for row in rows):
            mine = [row for row in rows if row["method"] == method]
            cells = {_column(row["layer"]): f"{row['mean']:.{digits}f} ± {row['std']:.{digits}f}" for row in mine}
            published = {
                _column(row["layer"]): "{:.{d}f} ± {:.{d}f}".format(*beside[key], d=digits)
                for row in mine
                if beside and (key := (method, reference, row["layer"])) in beside
            }
            label = f"{method} ({names[0]})" if published else method
            lines.append(f"| {label} | " + " | ".join(cells.get(column, "") for column in columns) + " |")
            if published:
                lines.append(
                    f"| {method} ({names[1]}) | " + " | ".join(published.get(column, "") for column in columns) + " |"
                )
        undefined: dict = {}
        for row in rows:
            if row["nan_count"]:
                undefined[row["method"]] = max(undefined.get(row["method"], 0), row["nan_count"])
        if undefined:
            worst = ", ".join(f"{method}: {count}" for method, count in undefined.items())
            lines += [
                "",
                "Left out as undefined (constant scores, < 2 tokens or NaN; examples, most in any layer): " + worst,
            ]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def write_comparison_csv(
    result: ComparisonResult, path: str | Path, beside: Beside | None = None, names: tuple[str, str] = ("ours", "paper")
) -> None:
    """The file of :meth:`ComparisonResult.to_csv`."""
    fields = ["method", "reference", "layer", "mean", "std", "count", "nan_count"]
    extra = [f"{names[1]}_mean", f"{names[1]}_std"] if beside is not None else []
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fields + extra)
        writer.writeheader()
        for row in result.summary():
            published = beside.get((row["method"], row["reference"], row["layer"]), ("", "")) if extra else ()
            writer.writerow({**row, "layer": "" if row["layer"] is None else row["layer"], **dict(zip(extra, published))})


def plot_comparison(
    result: ComparisonResult, ax: Any = None, beside: Beside | None = None, names: tuple[str, str] = ("ours", "paper")
) -> Any:
    """The figure of :meth:`ComparisonResult.plot`."""
    references = result.references
    figure, axes = panel_axes(ax, len(references), "reference")
    for axes_, reference in zip(axes, references):
        rows = [row for row in result.summary() if row["reference"] == reference]
        for index, method in enumerate(dict.fromkeys(row["method"] for row in rows)):
            color = f"C{index}"
            mine = sorted((r for r in rows if r["method"] == method), key=lambda r: r["layer"] or 0)
            mean = np.array([r["mean"] for r in mine])
            std = np.array([r["std"] for r in mine])
            if mine[0]["layer"] is None:
                axes_.axhline(mean[0], linestyle="--", color=color, label=method)
                axes_.axhspan(mean[0] - std[0], mean[0] + std[0], color=color, alpha=0.1)
            else:
                layers = np.array([r["layer"] for r in mine])
                published = [beside.get((method, reference, layer)) for layer in layers] if beside else []
                label = f"{method} ({names[0]})" if any(published) else method
                axes_.plot(layers, mean, marker="o", color=color, label=label)
                axes_.fill_between(layers, mean - std, mean + std, color=color, alpha=0.2)
                if any(published):
                    drawn = [(layer, value[0]) for layer, value in zip(layers, published) if value]
                    axes_.plot(*zip(*drawn), linestyle=":", marker="x", color=color, label=f"{method} ({names[1]})")
                axes_.set_xticks(layers, [f"L{layer}" for layer in layers])
        axes_.set_xlabel("layer")
        axes_.set_ylabel(f"Spearman with {reference}")
        axes_.set_title(reference)
        axes_.legend()
    return figure


def _column(layer: int | None) -> str:
    return "score" if layer is None else f"L{layer}"
