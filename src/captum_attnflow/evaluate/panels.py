"""The one-row grid of panels that the per-layer plots of the evaluation results draw on."""

from __future__ import annotations

from typing import Any

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
