"""Plots of attention-based attributions: layer heatmaps, methods side by side, the attention
graph, patch heatmaps of vision transformers.

Every function returns a :class:`matplotlib.figure.Figure` built without ``pyplot``, so it
works headless (no display, no global figure state) and shows inline in a notebook. Scores
are the (L, n) outputs of the attributions with ``layer=None`` for one example, e.g.
``AttentionRollout(model).attribute(input_ids, layer=None)[:, 0]``.
"""

from captum_attnflow.visualize.graph import MAX_GRAPH_TOKENS, plot_flow_graph
from captum_attnflow.visualize.heatmaps import plot_layer_heatmap, plot_methods, plot_position_maps
from captum_attnflow.visualize.patches import plot_patch_heatmap
from captum_attnflow.visualize.records import to_visualization_record

__all__ = [
    "MAX_GRAPH_TOKENS",
    "plot_flow_graph",
    "plot_layer_heatmap",
    "plot_methods",
    "plot_patch_heatmap",
    "plot_position_maps",
    "to_visualization_record",
]
