"""The attention graph of a short sentence drawn with the flow (or rollout) value of each node."""

from __future__ import annotations

from typing import Sequence

import networkx as nx
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from captum_attnflow.functional import attention_graph
from captum_attnflow.functional.checks import Attentions, stack_attentions
from captum_attnflow.visualize._layout import Scores, as_layers, check_tokens, figure_and_axes
from captum_attnflow.visualize.heatmaps import SEQUENTIAL


# Beyond this many tokens the (L + 1) x n node grid of the attention graph is unreadable.
MAX_GRAPH_TOKENS = 16


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
    check_tokens(tokens, n)
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

    figure, ax = figure_and_axes(ax, width=0.9 * n + 2.5, height=0.8 * num_layers + 1.5)
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
        values = as_layers(scores, "scores")
        if values.shape != (1, n):
            raise ValueError(f"scores must be (n,) = ({n},) values for the input nodes, got {values.shape[1:]}.")
        collection = nx.draw_networkx_nodes(
            drawing, coordinates, nodelist=inputs, ax=ax, node_size=220, node_color=values[0],
            cmap=SEQUENTIAL, vmin=min(0.0, values.min()), edgecolors="black",
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
