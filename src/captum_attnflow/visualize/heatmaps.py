"""Layers x tokens heatmaps: one method, several side by side, every position at every layer.

One colour convention, the HTML view's: red is a high or positive score, blue a negative one.
Scores that can be negative (AttnLRP's relevance, blank-out's change of probability, input x
gradient) are drawn on a diverging scale centred at 0 (``RdBu_r``: red above 0, blue below,
white at 0), so a strongly negative token is not mistaken for an irrelevant one; scores that
cannot (attention weights, rollout, flow, norms) are drawn on the sequential ``Reds`` scale,
white to red, from their smallest to their largest value.
"""

from __future__ import annotations

from typing import Collection, Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

from captum_attnflow.visualize._layout import Scores, as_layers, check_tokens, figure_and_axes, row_count

SEQUENTIAL, DIVERGING = "Reds", "RdBu_r"


def plot_layer_heatmap(
    scores: Scores,
    tokens: Sequence[str],
    ax: Axes | None = None,
    title: str | None = None,
    layer_labels: Sequence[str] | None = None,
    cmap: str | None = None,
    colorbar: bool = True,
    signed: bool | None = None,
) -> Figure:
    """Heatmap of one method's scores, layers (rows, top layer on top) x tokens (columns).

    The layout of the paper's Figures 2 and 3 (Abnar & Zuidema 2020, section 2): row ``l``
    holds the attribution of the explained position after layer ``l`` to each input token.

    Args:
        scores: (L, n) scores, or (n,) for a method with a single output (e.g. blank-out).
        tokens: the n token strings, the column labels.
        ax: draw into this axes; a new figure is made when None.
        title: the axes title.
        layer_labels: the L row labels, bottom to top; default ``L1`` .. ``L<L>`` (a single
            row is labelled ``output``).
        cmap: a matplotlib colormap name; default ``Reds`` for unsigned scores, ``RdBu_r``
            for signed ones.
        colorbar: add a colorbar (one more axes in the figure).
        signed: True draws the scores on a scale centred at 0, from ``-m`` to ``m`` with
            ``m`` their largest absolute value; False from their minimum to their maximum;
            None (default) decides from the data: signed when a score is negative. Pass the
            method's own property when it is known (``Method.signed`` of
            :mod:`captum_attnflow.methods`), so that a method with signed scores keeps its
            diverging scale on an input where all of them happen to be positive.

    Returns:
        Figure: the figure holding ``ax``.

    Example::

        >>> import torch
        >>> from captum_attnflow.visualize import plot_layer_heatmap
        >>> fig = plot_layer_heatmap(torch.rand(6, 4), ["[CLS]", "the", "keys", "to"], title="rollout")
        >>> len(fig.axes), fig.axes[0].images[0].get_cmap().name
        (2, 'Reds')
        >>> fig = plot_layer_heatmap(torch.tensor([0.125, -0.5, 0.25, 0.0]), ["[CLS]", "the", "keys", "to"])
        >>> image = fig.axes[0].images[0]  # AttnLRP-like relevance: white at 0
        >>> image.get_cmap().name, image.get_clim()
        ('RdBu_r', (-0.5, 0.5))
    """
    values = as_layers(scores, "scores")
    num_layers, n = values.shape
    check_tokens(tokens, n)
    if layer_labels is None:
        layer_labels = ["output"] if num_layers == 1 else [f"L{index + 1}" for index in range(num_layers)]
    if len(layer_labels) != num_layers:
        raise ValueError(f"layer_labels has {len(layer_labels)} labels for {num_layers} rows of scores.")
    figure, ax = figure_and_axes(ax, width=0.55 * n + 2.0, height=0.35 * num_layers + 1.4)
    image = ax.imshow(values, aspect="auto", origin="lower", interpolation="nearest", **colour_scale(values, signed, cmap))
    ax.set_xticks(range(n), labels=list(tokens), rotation=45, ha="right")
    ax.set_yticks(range(num_layers), labels=list(layer_labels))
    if title is not None:
        ax.set_title(title)
    if colorbar:
        figure.colorbar(image, ax=ax, fraction=0.046, pad=0.03)
    return figure


def plot_methods(
    scores: Mapping[str, Scores],
    tokens: Sequence[str],
    title: str | None = None,
    cmap: str | None = None,
    layer_labels: Mapping[str, Sequence[str]] | None = None,
    columns: int = 3,
    value_labels: Mapping[str, str] | None = None,
    signed: Collection[str] | None = None,
) -> Figure:
    """Layer heatmaps of several methods, one panel (with its colorbar) per method, ``columns``
    panels a row (the paper's Figures 2 and 3 for raw attention, rollout and flow).

    Each method keeps its own colour scale: raw attention, rollout and flow live on
    different scales (flow is not normalised to sum to 1), so a shared scale would wash
    out all but one of them. Methods with signed scores are drawn on a diverging scale
    centred at 0, the others on a sequential one (see :func:`plot_layer_heatmap`).

    Args:
        scores: method name -> (L, n) scores (or (n,) for single-output methods) for one example.
        tokens: the n token strings.
        title: the figure title.
        cmap: a matplotlib colormap name for every panel; default ``Reds`` for unsigned
            methods and ``RdBu_r`` for signed ones.
        layer_labels: method name -> its row labels, bottom to top, for methods whose rows
            are not layers 1..L (e.g. ``{"flow": ["L6"]}`` for one layer); see
            :func:`plot_layer_heatmap`.
        columns: panels per row; more methods wrap into further rows, so the figure stays
            readable when embedded.
        value_labels: method name -> what its colour bar shows; default ``"<name> score"``.
        signed: the names of the methods whose scores can be negative, drawn centred at 0;
            the rest from their minimum to their maximum. None (default) decides each method
            from its data (signed when a score is negative); ``captum-attnflow explain``
            passes the methods declared signed in :mod:`captum_attnflow.methods`.

    Returns:
        Figure: 2 axes per method (heatmap and colorbar), in the order of ``scores``.

    Example::

        >>> import torch
        >>> from captum_attnflow.visualize import plot_methods
        >>> tokens = ["[CLS]", "the", "keys", "to"]
        >>> fig = plot_methods({"raw": torch.rand(6, 4), "rollout": torch.rand(6, 4)}, tokens)
        >>> len(fig.axes)
        4
    """
    if not scores:
        raise ValueError("scores is empty: pass a dict method name -> (L, n) scores.")
    if isinstance(columns, bool) or not isinstance(columns, int) or columns < 1:
        raise ValueError(f"columns must be a positive int, got {columns!r}.")
    n = len(tokens)
    columns = min(columns, len(scores))
    rows = -(-len(scores) // columns)
    height = 0.35 * max(row_count(values) for values in scores.values()) + 2.2
    figure = Figure(figsize=(columns * (0.55 * n + 2.8), rows * height + (0.4 if title else 0)), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax in axes[len(scores) :]:
        ax.set_visible(False)
    for ax, (name, values) in zip(axes, scores.items()):
        labels = None if layer_labels is None else layer_labels.get(name)
        plot_layer_heatmap(values, tokens, ax=ax, title=name, layer_labels=labels, cmap=cmap,
                           signed=None if signed is None else name in signed)
        ax.set_xlabel("input token")
        ax.set_ylabel("layer" if row_count(values) > 1 else "")
        colorbar = figure.axes[-1]
        colorbar.set_ylabel((value_labels or {}).get(name, f"{name} score"))
    if title is not None:
        figure.suptitle(title)
    return figure


def colour_scale(values: np.ndarray, signed: bool | None, cmap: str | None) -> dict:
    """``imshow``'s ``cmap``, ``vmin`` and ``vmax`` for ``values``: centred at 0 when ``signed``
    (or, for None, when a value is negative), from the minimum to the maximum otherwise."""
    if signed is None:
        signed = bool((values < 0).any())
    if not signed:
        return dict(cmap=cmap or SEQUENTIAL, vmin=float(values.min()), vmax=float(values.max()))
    largest = float(np.abs(values).max()) or 1.0  # all zeros: a scale around 0 still
    return dict(cmap=cmap or DIVERGING, vmin=-largest, vmax=largest)


def plot_position_maps(
    maps: Mapping[str, Scores],
    tokens: Sequence[str],
    title: str | None = None,
    cmap: str = SEQUENTIAL,
    value_labels: Mapping[str, str] | None = None,
) -> Figure:
    """The paper's Figure 1: for each method (a row) and layer (a column), the scores of every
    position (rows of a panel) over the input tokens (its columns).

    Panel ``(method, l)`` is the (n, n) map whose row ``i`` is the method's attribution of
    position ``i`` after layer ``l`` to each input token: raw attention is the head-fused
    attention matrix of layer ``l``, rollout the product :math:`\tilde A_l`, flow the max-flow
    values from node ``(l, i)`` (paper, sections 2-3). Each method has one colour scale over
    its layers, shown by its colour bar.

    Args:
        maps: method name -> (L, n, n) scores, e.g. ``torch.stack([AttentionRollout(model)
            .attribute(ids, position=i, layer=None)[:, 0] for i in range(n)], 1)``.
        tokens: the n token strings.
        title: the figure title.
        cmap: a matplotlib colormap name.
        value_labels: method name -> what its colour bar shows; default ``"<name> score"``.

    Returns:
        Figure: L heatmaps per method plus one colour bar per method.

    Example::

        >>> import torch
        >>> from captum_attnflow.visualize import plot_position_maps
        >>> tokens = ["[CLS]", "the", "keys"]
        >>> fig = plot_position_maps({"raw": torch.rand(2, 3, 3), "rollout": torch.rand(2, 3, 3)}, tokens)
        >>> len(fig.axes)  # 2 methods x 2 layers + 2 colour bars
        6
    """
    if not maps:
        raise ValueError("maps is empty: pass a dict method name -> (L, n, n) scores.")
    arrays = {}
    for name, values in maps.items():
        values = values.detach().cpu().float().numpy() if isinstance(values, Tensor) else np.asarray(values, float)
        if values.ndim != 3 or values.shape[1] != values.shape[2]:
            raise ValueError(f"maps[{name!r}] must be (L, n, n) scores, got shape {values.shape}.")
        check_tokens(tokens, values.shape[2])
        arrays[name] = values
    num_layers = max(values.shape[0] for values in arrays.values())
    n = len(tokens)
    size = 0.3 * n + 1.2
    figure = Figure(figsize=(num_layers * size + 1.5, len(arrays) * (size + 0.3) + 0.6), layout="constrained")
    axes = figure.subplots(len(arrays), num_layers, squeeze=False)
    for row, (name, values) in enumerate(arrays.items()):
        low, high = float(values.min()), float(values.max())
        for layer in range(num_layers):
            ax = axes[row, layer]
            if layer >= values.shape[0]:
                ax.set_visible(False)
                continue
            image = ax.imshow(values[layer], cmap=cmap, vmin=low, vmax=high, interpolation="nearest")
            ax.set_xticks(range(n), labels=list(tokens), rotation=90, fontsize="small")
            ax.set_yticks(range(n), labels=list(tokens) if layer == 0 else [], fontsize="small")
            if row == 0:
                ax.set_title(f"L{layer + 1}")
            if row == len(arrays) - 1:
                ax.set_xlabel("input token")
            if layer == 0:
                ax.set_ylabel(f"{name}\nexplained position")
        figure.colorbar(image, ax=list(axes[row]), shrink=0.9).set_label((value_labels or {}).get(name, f"{name} score"))
    if title is not None:
        figure.suptitle(title)
    return figure
