"""What the plots share: the score arrays they accept, their checks, a figure without ``pyplot``."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor



Scores = Tensor | np.ndarray | Sequence[float] | Sequence[Sequence[float]]


def figure_and_axes(ax: Axes | None, width: float, height: float) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax
    figure = Figure(figsize=(width, height), layout="constrained")
    return figure, figure.add_subplot()


def as_layers(scores: Scores, name: str) -> np.ndarray:
    """Scores as a float (rows, n) array: (n,) becomes one row; anything else but (L, n) raises."""
    if isinstance(scores, Tensor):
        scores = scores.detach().cpu().float().numpy()
    values = np.asarray(scores, dtype=float)
    if values.ndim == 1:
        values = values[None]
    if values.ndim != 2 or values.shape[1] == 0:
        raise ValueError(
            f"{name} must have shape (L, n) or (n,) for one example, got {values.shape}; "
            "for a batch pick one example, e.g. scores[:, 0] of an (L, B, n) result."
        )
    if not np.isfinite(values).all():
        raise ValueError(f"{name} contain NaN or infinite values.")
    return values


def row_count(scores: Scores) -> int:
    return as_layers(scores, "scores").shape[0]


def check_tokens(tokens: Sequence[str], n: int) -> None:
    if isinstance(tokens, str):
        raise TypeError("tokens must be a sequence of token strings, not one string; e.g. sentence.split().")
    if len(tokens) != n:
        raise ValueError(f"got {len(tokens)} tokens for scores over {n} positions; pass one token per position.")
