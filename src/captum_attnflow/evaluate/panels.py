"""The one-row grid of panels that the per-layer plots of the evaluation results draw on, and
what each panel shows: per method, a line and band over the layers (or a level for a method
without layers), with the same colours, ticks and labels in every plot."""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Mapping

import numpy as np


def panel_axes(ax: Any, count: int, what: str) -> tuple[Any, list[Any]]:
    """``(figure, axes)``: ``count`` panels side by side, 5 x 3.5 inches each, in a new figure
    that pyplot does not register (``ax`` None), or the caller's ``ax`` (one axes, or an array
    of them), which must hold one axes per ``what`` (e.g. ``"reference"``)."""
    from matplotlib.figure import Figure

    if ax is None:
        figure = Figure(figsize=(5 * count, 3.5), layout="constrained")
        return figure, list(figure.subplots(1, count, squeeze=False)[0])
    axes = list(np.atleast_1d(ax))
    if len(axes) != count:
        raise ValueError(f"pass one axes per {what} ({count}), got {len(axes)}.")
    return axes[0].figure, axes


def method_rows(rows: Iterable[Mapping]) -> Iterator[tuple[str, str, list[Mapping]]]:
    """``(colour, method, rows)`` for each method of ``rows`` (dicts with ``method`` and
    ``layer``) in order of first appearance: its colour ``C0``, ``C1``, ... and its rows by layer."""
    rows = list(rows)
    for index, method in enumerate(dict.fromkeys(row["method"] for row in rows)):
        yield f"C{index}", method, sorted((row for row in rows if row["method"] == method), key=lambda row: row["layer"] or 0)


def draw_method(axes: Any, points: list[Mapping], mean: Any, low: Any, high: Any, color: str, label: str) -> None:
    """One method on a panel, from its rows ``points`` (by layer) and their ``mean``, ``low``
    and ``high`` arrays: over the layers a line with markers and a band from low to high, the
    layers as ticks ``L1``..``Ln``; for a method without layers a dashed level at its mean and
    a lighter band."""
    if points[0]["layer"] is None:
        axes.axhline(mean[0], linestyle="--", color=color, label=label)
        axes.axhspan(low[0], high[0], color=color, alpha=0.1)
        return
    layers = np.array([row["layer"] for row in points])
    axes.plot(layers, mean, marker="o", color=color, label=label)
    axes.fill_between(layers, low, high, color=color, alpha=0.2)
    axes.set_xticks(layers, [f"L{layer}" for layer in layers])


def label_panel(axes: Any, ylabel: str, title: str) -> None:
    """Layers on x, ``ylabel`` on y, ``title`` above and the methods' legend."""
    axes.set_xlabel("layer")
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.legend()
