"""Plots of attention-based attributions: layer heatmaps, methods side by side, the attention
graph, patch heatmaps of vision transformers.

Every function returns a :class:`matplotlib.figure.Figure` built without ``pyplot``, so it
works headless (no display, no global figure state) and shows inline in a notebook. Scores
are the (L, n) outputs of the attributions with ``layer=None`` for one example, e.g.
``AttentionRollout(model).attribute(input_ids, layer=None)[:, 0]``.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import networkx as nx
import numpy as np
import torch
from captum.attr import visualization
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

from captum_attnflow.functional import attention_graph
from captum_attnflow.functional.checks import Attentions, stack_attentions

Scores = Tensor | np.ndarray | Sequence[float] | Sequence[Sequence[float]]

# Beyond this many tokens the (L + 1) x n node grid of the attention graph is unreadable.
MAX_GRAPH_TOKENS = 16


def plot_layer_heatmap(
    scores: Scores,
    tokens: Sequence[str],
    ax: Axes | None = None,
    title: str | None = None,
    layer_labels: Sequence[str] | None = None,
    cmap: str = "Blues",
    colorbar: bool = True,
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
        cmap: a matplotlib colormap name.
        colorbar: add a colorbar (one more axes in the figure).

    Returns:
        Figure: the figure holding ``ax``.

    Example::

        >>> import torch
        >>> from captum_attnflow.visualize import plot_layer_heatmap
        >>> fig = plot_layer_heatmap(torch.rand(6, 4), ["[CLS]", "the", "keys", "to"], title="rollout")
        >>> len(fig.axes)
        2
    """
    values = _as_layers(scores, "scores")
    num_layers, n = values.shape
    _check_tokens(tokens, n)
    if layer_labels is None:
        layer_labels = ["output"] if num_layers == 1 else [f"L{index + 1}" for index in range(num_layers)]
    if len(layer_labels) != num_layers:
        raise ValueError(f"layer_labels has {len(layer_labels)} labels for {num_layers} rows of scores.")
    figure, ax = _figure_and_axes(ax, width=0.55 * n + 2.0, height=0.35 * num_layers + 1.4)
    image = ax.imshow(values, cmap=cmap, aspect="auto", origin="lower", interpolation="nearest")
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
    cmap: str = "Blues",
    layer_labels: Mapping[str, Sequence[str]] | None = None,
    columns: int = 3,
    value_labels: Mapping[str, str] | None = None,
) -> Figure:
    """Layer heatmaps of several methods, one panel (with its colorbar) per method, ``columns``
    panels a row (the paper's Figures 2 and 3 for raw attention, rollout and flow).

    Each method keeps its own colour scale: raw attention, rollout and flow live on
    different scales (flow is not normalised to sum to 1), so a shared scale would wash
    out all but one of them.

    Args:
        scores: method name -> (L, n) scores (or (n,) for single-output methods) for one example.
        tokens: the n token strings.
        title: the figure title.
        cmap: a matplotlib colormap name.
        layer_labels: method name -> its row labels, bottom to top, for methods whose rows
            are not layers 1..L (e.g. ``{"flow": ["L6"]}`` for one layer); see
            :func:`plot_layer_heatmap`.
        columns: panels per row; more methods wrap into further rows, so the figure stays
            readable when embedded.
        value_labels: method name -> what its colour bar shows; default ``"<name> score"``.

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
    height = 0.35 * max(_rows(values) for values in scores.values()) + 2.2
    figure = Figure(figsize=(columns * (0.55 * n + 2.8), rows * height + (0.4 if title else 0)), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax in axes[len(scores) :]:
        ax.set_visible(False)
    for ax, (name, values) in zip(axes, scores.items()):
        labels = None if layer_labels is None else layer_labels.get(name)
        plot_layer_heatmap(values, tokens, ax=ax, title=name, layer_labels=labels, cmap=cmap)
        ax.set_xlabel("input token")
        ax.set_ylabel("layer" if _rows(values) > 1 else "")
        colorbar = figure.axes[-1]
        colorbar.set_ylabel((value_labels or {}).get(name, f"{name} score"))
    if title is not None:
        figure.suptitle(title)
    return figure


def plot_position_maps(
    maps: Mapping[str, Scores],
    tokens: Sequence[str],
    title: str | None = None,
    cmap: str = "Blues",
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
        _check_tokens(tokens, values.shape[2])
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


def to_visualization_record(
    scores: Scores,
    tokens: Sequence[str],
    pred_prob: float,
    pred_class: str | int,
    true_class: str | int | None = None,
    attr_class: str | int | None = None,
    convergence_score: float | None = None,
) -> visualization.VisualizationDataRecord:
    """One example's token scores as Captum's :class:`VisualizationDataRecord`, for ``visualize_text``.

    Captum colours a word by its importance clipped to [-1, 1], so the scores are divided by
    their largest absolute value (all-zero scores stay zero); ``attr_score`` is the sum of the
    unscaled scores, as Captum's tutorials report it.

    Args:
        scores: (n,) scores of one example, one layer.
        tokens: the n token strings.
        pred_prob: probability of the predicted class.
        pred_class: the predicted class (name or index).
        true_class: the gold class; defaults to ``pred_class``.
        attr_class: the class the attribution explains; defaults to ``pred_class``.
        convergence_score: Captum's convergence delta; None (shown as such) for attention methods.

    Returns:
        captum.attr.visualization.VisualizationDataRecord: the scaled scores as
        ``word_attributions``, for :func:`captum.attr.visualization.visualize_text`.

    Example::

        >>> import torch
        >>> from captum.attr import visualization
        >>> from captum_attnflow.visualize import to_visualization_record
        >>> record = to_visualization_record(torch.tensor([0.1, 0.6, 0.3]), ["the", "keys", "to"],
        ...                                  pred_prob=0.9, pred_class="plural")
        >>> record.word_attributions.max().item()
        1.0
        >>> html = visualization.format_word_importances(record.raw_input_ids, record.word_attributions)
    """
    values = torch.as_tensor(_as_layers(scores, "scores"), dtype=torch.float32)
    if values.shape[0] != 1:
        raise ValueError(
            f"scores must be one example's (n,) scores, got shape {tuple(values.shape)}; "
            "pick a layer, e.g. scores[-1] for the last one."
        )
    values = values[0]
    _check_tokens(tokens, values.numel())
    largest = values.abs().max()
    scaled = values / largest if largest > 0 else values
    return visualization.VisualizationDataRecord(
        scaled,
        float(pred_prob),
        pred_class,
        pred_class if true_class is None else true_class,
        pred_class if attr_class is None else attr_class,
        float(values.sum()),
        list(tokens),
        convergence_score,
    )


def plot_flow_graph(
    attentions: Attentions,
    tokens: Sequence[str],
    scores: Scores | None = None,
    position: int = 0,
    example: int = 0,
    residual_alpha: float = 0.5,
    head_fusion: str = "mean",
    min_weight: float = 0.02,
    ax: Axes | None = None,
    title: str | None = None,
) -> Figure:
    """Draw the layered attention graph of one short input (Abnar & Zuidema 2020, section 3, Figure 1).

    Nodes are the n positions at each of the L + 1 levels (input embeddings at the bottom);
    the edge from position j at level l - 1 to position i at level l has the weight
    :math:`A_l[i, j]` of the residual-adjusted attention graph
    (:func:`captum_attnflow.functional.attention_graph`), drawn with width proportional to
    it. Attention flow treats these weights as capacities, rollout as proportions. The input
    nodes are coloured by ``scores``, e.g. the flow values of the explained position, which
    is ringed at the top level.

    Args:
        attentions: what a transformers model returns for ``output_attentions=True``: L
            tensors (B, H, n, n), or one (L, B, H, n, n) tensor.
        tokens: the n token strings.
        scores: (n,) values for the input nodes, e.g. ``AttentionFlow(model).attribute(...)[example]``.
        position: the explained position, ringed at the top level.
        example: which example of the batch to draw.
        residual_alpha: the residual weight of the attention graph (the paper's 0.5).
        head_fusion: ``"mean"`` (the paper's), ``"max"`` or ``"min"``.
        min_weight: edges lighter than this are left out to keep the drawing readable.
        ax: draw into this axes; a new figure is made when None.
        title: the axes title.

    Returns:
        Figure: the figure holding the drawing (one axes, plus a colorbar when ``scores`` is given).

    Example::

        >>> import torch
        >>> from captum_attnflow.visualize import plot_flow_graph
        >>> attentions = torch.softmax(torch.randn(2, 1, 2, 3, 3), -1)
        >>> fig = plot_flow_graph(attentions, ["[CLS]", "the", "keys"], scores=torch.tensor([0.2, 0.3, 0.5]))
        >>> len(fig.axes)
        2
    """
    stacked = stack_attentions(attentions)
    num_layers, batch, _, n, _ = stacked.shape
    _check_tokens(tokens, n)
    if n > MAX_GRAPH_TOKENS:
        raise ValueError(
            f"the attention graph of {n} tokens is too dense to draw; pass at most {MAX_GRAPH_TOKENS} tokens "
            "(plot_layer_heatmap shows long inputs)."
        )
    if not 0 <= example < batch:
        raise ValueError(f"example={example} is out of range for a batch of {batch}.")
    if not -n <= position < n:
        raise ValueError(f"position={position} is out of range for n={n} tokens.")
    graph = attention_graph(stacked[:, example : example + 1], residual_alpha, head_fusion).weights[:, 0].numpy()

    drawing = nx.DiGraph()
    coordinates = {}
    for level in range(num_layers + 1):
        for index in range(n):
            drawing.add_node((level, index))
            coordinates[(level, index)] = (index, level)
    for level in range(1, num_layers + 1):
        for target in range(n):
            for source in range(n):
                weight = float(graph[level - 1, target, source])
                if weight >= min_weight:
                    drawing.add_edge((level - 1, source), (level, target), weight=weight)

    figure, ax = _figure_and_axes(ax, width=0.9 * n + 2.5, height=0.8 * num_layers + 1.5)
    widths = [4.0 * data["weight"] for _, _, data in drawing.edges(data=True)]
    nx.draw_networkx_edges(
        drawing, coordinates, ax=ax, width=widths, edge_color="tab:gray", alpha=0.7, arrows=False
    )
    upper = [node for node in drawing if node[0] > 0]
    nx.draw_networkx_nodes(drawing, coordinates, nodelist=upper, ax=ax, node_size=120, node_color="white",
                           edgecolors="black")
    inputs = [(0, index) for index in range(n)]
    if scores is None:
        nx.draw_networkx_nodes(drawing, coordinates, nodelist=inputs, ax=ax, node_size=220, node_color="white",
                               edgecolors="black")
    else:
        values = _as_layers(scores, "scores")
        if values.shape != (1, n):
            raise ValueError(f"scores must be (n,) = ({n},) values for the input nodes, got {values.shape[1:]}.")
        collection = nx.draw_networkx_nodes(
            drawing, coordinates, nodelist=inputs, ax=ax, node_size=220, node_color=values[0],
            cmap="Blues", vmin=min(0.0, values.min()), edgecolors="black",
        )
        figure.colorbar(collection, ax=ax, fraction=0.046, pad=0.03)
    nx.draw_networkx_nodes(drawing, coordinates, nodelist=[(num_layers, position % n)], ax=ax, node_size=260,
                           node_color="none", edgecolors="tab:red", linewidths=2.0)
    ax.set_xticks(range(n), labels=list(tokens), rotation=45, ha="right")
    ax.set_yticks(range(num_layers + 1), labels=["input"] + [f"L{level}" for level in range(1, num_layers + 1)])
    ax.tick_params(left=True, bottom=True, labelleft=True, labelbottom=True)
    ax.set_frame_on(False)
    if title is not None:
        ax.set_title(title)
    return figure


def plot_patch_heatmap(
    scores: Scores,
    image: Tensor | np.ndarray | None = None,
    grid: tuple[int, int] | None = None,
    special_tokens: int = 1,
    ax: Axes | None = None,
    title: str | None = None,
    cmap: str = "inferno",
    alpha: float = 0.6,
) -> Figure:
    """A vision transformer's token scores as a heatmap over its patch grid, on the image.

    The attention methods give an image model one score per token, [CLS] and the patches in
    row-major order (``AttentionRollout(vit).attribute(pixel_values)[b]``); this drops the
    first ``special_tokens`` ([CLS]; 2 for DeiT's [CLS] and distillation tokens) and lays the
    rest out as the patch grid, stretched over the image when one is given.

    Args:
        scores: (n,) one example's scores over the model's tokens.
        image: optional, the example's pixels, (C, H, W) as fed to the model or (H, W, C) /
            (H, W) as an image array; shown beneath, rescaled to [0, 1].
        grid: (rows, columns) of patches; default a square grid.
        special_tokens: how many tokens before the patches to leave out.
        ax: draw into this axes; a new figure is made when None.
        title: the axes title.
        cmap: a matplotlib colormap name.
        alpha: opacity of the heatmap over the image.

    Returns:
        Figure: the figure holding ``ax``.

    Example::

        >>> import torch
        >>> from captum_attnflow.visualize import plot_patch_heatmap
        >>> scores = torch.rand(17)  # [CLS] + a 4 x 4 grid of patches
        >>> fig = plot_patch_heatmap(scores, image=torch.rand(3, 32, 32), title="rollout")
        >>> fig.axes[0].images[1].get_array().shape  # the patch grid over the image
        (4, 4)
    """
    values = _as_layers(scores, "scores")
    if values.shape[0] != 1:
        raise ValueError(f"scores must be one example's (n,) scores over the tokens, got shape {values.shape}.")
    patches = values[0, special_tokens:]
    if grid is None:
        side = int(round(np.sqrt(patches.size)))
        grid = (side, side)
    if grid[0] * grid[1] != patches.size:
        raise ValueError(
            f"{patches.size} patch scores (n = {values.shape[1]} minus {special_tokens} special tokens) do not fill "
            f"a {grid[0]} x {grid[1]} grid; pass grid=(rows, columns) or the model's special_tokens."
        )
    figure, ax = _figure_and_axes(ax, width=4.5, height=4.0)
    extent = None
    if image is not None:
        pixels = _as_image(image)
        extent = (0, pixels.shape[1], pixels.shape[0], 0)
        ax.imshow(pixels, cmap="gray" if pixels.ndim == 2 else None, extent=extent)
    heatmap = ax.imshow(
        patches.reshape(grid), cmap=cmap, alpha=alpha if image is not None else 1.0, extent=extent,
        interpolation="nearest",
    )
    figure.colorbar(heatmap, ax=ax, fraction=0.046, pad=0.03)
    ax.set_xticks([])
    ax.set_yticks([])
    if title is not None:
        ax.set_title(title)
    return figure


def _as_image(image: Tensor | np.ndarray) -> np.ndarray:
    """An image as an (H, W) or (H, W, C) float array in [0, 1]; (C, H, W) tensors are transposed."""
    if isinstance(image, Tensor):
        image = image.detach().cpu().float().numpy()
        if image.ndim == 3:
            image = image.transpose(1, 2, 0)
    pixels = np.asarray(image, dtype=float)
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[..., 0]
    if pixels.ndim not in (2, 3) or (pixels.ndim == 3 and pixels.shape[2] not in (3, 4)):
        raise ValueError(
            f"image must be (C, H, W) pixel values or an (H, W, C) / (H, W) array, got shape {np.shape(image)}."
        )
    low, high = pixels.min(), pixels.max()
    return (pixels - low) / (high - low) if high > low else np.zeros_like(pixels)


def _figure_and_axes(ax: Axes | None, width: float, height: float) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax
    figure = Figure(figsize=(width, height), layout="constrained")
    return figure, figure.add_subplot()


def _as_layers(scores: Scores, name: str) -> np.ndarray:
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


def _rows(scores: Scores) -> int:
    return _as_layers(scores, "scores").shape[0]


def _check_tokens(tokens: Sequence[str], n: int) -> None:
    if isinstance(tokens, str):
        raise TypeError("tokens must be a sequence of token strings, not one string; e.g. sentence.split().")
    if len(tokens) != n:
        raise ValueError(f"got {len(tokens)} tokens for scores over {n} positions; pass one token per position.")
