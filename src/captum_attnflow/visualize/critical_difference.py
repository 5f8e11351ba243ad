"""The critical-difference diagram (Demšar, JMLR 2006): methods on an axis of average ranks, bars
joining those the tests cannot tell apart, drawn by scikit-posthocs."""

from __future__ import annotations

from typing import Any

import numpy as np

# As the forest plots: 12 inches wide, 1,200 pixels at 100 dpi.
WIDTH_INCHES = 12.0


def plot_critical_difference(result: Any, floor: str | None = "random", ax: Any = None, title: str | None = None):
    """Draw a :class:`~captum_attnflow.evaluate.friedman.CriticalDifference`.

    The axis is the average rank over the blocks, 1 (best) on the left; each method hangs from
    its average rank, the better half labelled on the left, the other half on the right; a
    thick bar joins each group of methods of which no pair the tests separate (``result.groups``:
    a method under no bar differs from every other); the red bar above the axis is Nemenyi's
    critical difference, from rank 1. Drawn by ``scikit_posthocs.critical_difference_diagram``.

    Args:
        result: the comparison, e.g. ``leaderboard.critical_difference()``.
        floor: the name of the chance method, drawn in grey (``"random"`` in the benchmark).
        ax: a matplotlib axes; None (default) makes a new figure, 12 inches wide, not
            registered with pyplot.
        title: the figure's title; by default the counts and Friedman's p-value.

    Returns:
        matplotlib.figure.Figure: the figure drawn on.

    Example::

        >>> from captum_attnflow.evaluate.friedman import critical_difference
        >>> from captum_attnflow.visualize.critical_difference import plot_critical_difference
        >>> table = {f"task {i}": {"a": 0.9 - 0.01 * i, "b": 0.5, "c": 0.1 + 0.01 * i} for i in range(6)}
        >>> figure = plot_critical_difference(critical_difference(table))
        >>> sorted(text.get_text() for text in figure.axes[0].texts)
        ['  critical difference 1.35', '(3) c', 'a (1)', 'b (2)']
    """
    import pandas as pd
    import scikit_posthocs
    from matplotlib.figure import Figure
    from matplotlib.transforms import offset_copy

    names, k = result.names, len(result.names)
    if ax is None:
        levels = sum(1 for group in result.groups if len(group) > 1)
        height = 0.24 * ((k + 1) // 2 + levels) + 1.5
        figure = Figure(figsize=(WIDTH_INCHES, height), layout="constrained")
        ax = figure.subplots()
    figure = ax.figure
    # The groups are the cliques of "not separated": hand the diagram 1 (not significant) and 0
    # (significant) so that it draws those bars, with Friedman's gate already applied.
    separated = pd.DataFrame(np.where(result.separated(), 0.0, 1.0), index=names, columns=names)
    colours = {name: "#888888" if name == floor else "#1f4e8c" for name in names}
    scikit_posthocs.critical_difference_diagram(
        pd.Series(result.average_ranks), separated, alpha=result.alpha, ax=ax, color_palette=colours,
        label_fmt_left="{label} ({rank:.3g})", label_fmt_right="({rank:.3g}) {label}", label_props={"fontsize": 9},
        crossbar_props={"linewidth": 3, "color": "#222222"}, elbow_props={"linewidth": 1},
    )
    ax.set_xlim(1, k)
    ax.set_xticks(range(1, k + 1))
    ax.tick_params(axis="x", labelsize=8)
    # Nemenyi's critical difference as a bar from rank 1, above the tick labels
    above = offset_copy(ax.transData, figure, y=24, units="points")
    ax.plot([1, 1 + result.critical_difference], [0, 0], color="#b03030", linewidth=2, transform=above, clip_on=False,
            marker="|", markersize=8)
    ax.text(1 + result.critical_difference, 0, f"  critical difference {result.critical_difference:.2f}", color="#b03030",
            fontsize=8, va="center", transform=above)
    if title is None:
        title = (f"average ranks of {k} methods in {len(result.blocks)} blocks (1 = best; Friedman p = {result.pvalue:.2g}); "
                 f"bars join methods the Nemenyi test does not separate (alpha = {result.alpha:g})")
    figure.suptitle(title, fontsize=10)
    return figure
