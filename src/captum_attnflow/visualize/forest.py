"""The leaderboard as forest plots: per metric, the methods from best mean (top) to worst, each
mean a point with its confidence interval as a bar, the random floor as a line, the group letters
of the methods no test separates on the right."""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

# Readable at 1,200 pixels wide: the figure is 12 inches at 100 dpi.
WIDTH_INCHES = 12.0
MAX_COLUMNS = 4
_BANDS = ("#e8eef7", "#ffffff")


def plot_forest(
    leaderboard: Any,
    metrics: Sequence[str] | None = None,
    floor: str | None = "random",
    columns: int = 3,
    title: str | None = None,
    ax: Any = None,
):
    """Forest plots of a :class:`~captum_attnflow.evaluate.Leaderboard`, one panel per metric.

    In each panel the entries (methods, or ``method L<k>``) run down the vertical axis by mean,
    best on top; the mean is a point and the bootstrap interval (``leaderboard.confidence``,
    95 % by default) a horizontal bar, on alternately shaded rows. On the right of each row
    are its group letters: entries sharing a letter are not separated by the Holm-adjusted
    Wilcoxon tests (see :func:`~captum_attnflow.evaluate.rank_methods`). The ``floor`` entry's
    mean is a dashed vertical line across the panel, so what beats chance shows at a glance.
    The axis says whether higher or lower is better.

    Args:
        leaderboard: a Leaderboard (e.g. ``result.leaderboard()`` or a benchmark's).
        metrics: the metrics to draw, in order; default all of them.
        floor: the name of the chance entry (``"random"`` in the benchmark); None or an
            absent name draws no line.
        columns: panels per row, 1 to 4; more metrics wrap into further rows.
        title: the figure's title.
        ax: one matplotlib axes per metric (an array of them); None (default) makes a new
            figure, 12 inches wide (1,200 px at 100 dpi), not registered with pyplot.

    Returns:
        matplotlib.figure.Figure: the figure drawn on.

    Example::

        >>> import numpy as np
        >>> from captum_attnflow.evaluate import Leaderboard
        >>> from captum_attnflow.visualize.forest import plot_forest
        >>> noise = np.random.default_rng(0).normal(0, 0.05, (3, 30))
        >>> board = Leaderboard.from_values({"comprehensiveness": {
        ...     "rollout": 0.3 + noise[0], "raw": 0.29 + noise[1], "random": 0.1 + noise[2]}}, n_resamples=99)
        >>> figure = plot_forest(board)
        >>> [label.get_text() for label in figure.axes[0].get_yticklabels()]  # best on top
        ['raw', 'rollout', 'random']
    """
    from matplotlib.figure import Figure

    metrics = list(leaderboard.metrics if metrics is None else metrics)
    unknown = [metric for metric in metrics if metric not in leaderboard.metrics]
    if unknown or not metrics:
        raise ValueError(f"unknown or no metrics {unknown}: the leaderboard holds {leaderboard.metrics}.")
    if isinstance(columns, bool) or not isinstance(columns, int) or not 1 <= columns <= MAX_COLUMNS:
        raise ValueError(f"columns must be an int from 1 to {MAX_COLUMNS}, got {columns!r}.")
    if ax is None:
        columns = min(columns, len(metrics))
        rows = -(-len(metrics) // columns)
        entries = max(len(leaderboard.ranking(metric).names) for metric in metrics)
        height = 0.27 * entries + 1.3
        figure = Figure(figsize=(WIDTH_INCHES, rows * height + (0.4 if title else 0)), layout="constrained")
        axes = list(figure.subplots(rows, columns, squeeze=False).ravel())
        for unused in axes[len(metrics):]:
            unused.set_visible(False)
    else:
        axes = list(np.atleast_1d(ax))
        figure = axes[0].figure
        if len(axes) != len(metrics):
            raise ValueError(f"pass one axes per metric ({len(metrics)}), got {len(axes)}.")
    for axes_, metric in zip(axes, metrics):
        draw_forest(axes_, leaderboard.ranking(metric), metric, floor, leaderboard.confidence)
    if title:
        figure.suptitle(title)
    return figure


def draw_forest(axes: Any, ranking: Any, metric: str, floor: str | None = "random", confidence: float = 0.95) -> None:
    """One panel of :func:`plot_forest` on ``axes`` for one metric's ``ranking``."""
    names = ranking.names
    y = np.arange(len(names))[::-1]  # best on top
    for number, (position, name) in enumerate(zip(y, names)):
        axes.axhspan(position - 0.5, position + 0.5, color=_BANDS[number % 2], zorder=0, linewidth=0)
        axes.text(1.01, position, ranking.groups[name], transform=axes.get_yaxis_transform(), va="center", ha="left",
                  fontsize=8, color="#444")
        interval = ranking.intervals[name]
        chance = floor is not None and name == floor
        color = "#888888" if chance else "#1f4e8c"
        if math.isfinite(interval.mean):
            low = interval.low if math.isfinite(interval.low) else interval.mean
            high = interval.high if math.isfinite(interval.high) else interval.mean
            axes.plot([low, high], [position, position], color=color, linewidth=2, solid_capstyle="butt", zorder=2)
            axes.plot([interval.mean], [position], "o", color=color, markersize=5, zorder=3)
    if floor is not None and floor in ranking.intervals and math.isfinite(ranking.intervals[floor].mean):
        axes.axvline(ranking.intervals[floor].mean, color="#888888", linestyle="--", linewidth=1, zorder=1)
    axes.set_yticks(y, [name if math.isfinite(ranking.intervals[name].mean) else f"{name} (undefined)" for name in names], fontsize=8)
    axes.set_ylim(-0.5, len(names) - 0.5)
    arrow = "higher is better →" if ranking.higher_is_better else "← lower is better"
    line = f"; dashed line: {floor}" if floor is not None and floor in ranking.intervals else ""
    axes.set_xlabel(f"{arrow}\nmean, {confidence:.0%} CI{line}; right: groups", fontsize=8)
    axes.tick_params(axis="x", labelsize=8)
    axes.set_title(metric, fontsize=10)
    axes.grid(axis="x", color="#dddddd", linewidth=0.6, zorder=0)
    axes.set_axisbelow(True)
