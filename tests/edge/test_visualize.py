"""Tests of the plots: right axes and cells, the drawn values are the scores, headless, clear errors."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from captum.attr import visualization
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.figure import Figure

from captum_attnflow.visualize import (
    MAX_GRAPH_TOKENS,
    plot_flow_graph,
    plot_layer_heatmap,
    plot_methods,
    plot_patch_heatmap,
    to_visualization_record,
)
from captum_attnflow.visualize.html import NEGATIVE, POSITIVE

TOKENS = ["[CLS]", "the", "keys", "to", "the"]


def _png_bytes(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def test_layer_heatmap_draws_the_scores_layers_by_tokens():
    scores = torch.rand(6, len(TOKENS))
    figure = plot_layer_heatmap(scores, TOKENS, title="rollout")
    assert isinstance(figure, Figure)
    assert len(figure.axes) == 2  # heatmap and colorbar
    ax = figure.axes[0]
    np.testing.assert_allclose(ax.images[0].get_array(), scores.numpy(), rtol=1e-6)
    assert [label.get_text() for label in ax.get_xticklabels()] == TOKENS
    assert [label.get_text() for label in ax.get_yticklabels()] == [f"L{i}" for i in range(1, 7)]
    assert ax.get_title() == "rollout"
    assert _png_bytes(figure).startswith(b"\x89PNG")


def test_layer_heatmap_single_row_into_given_axes_without_colorbar():
    figure = Figure()
    ax = figure.add_subplot()
    assert plot_layer_heatmap(np.arange(5.0), TOKENS, ax=ax, colorbar=False) is figure
    assert len(figure.axes) == 1
    assert ax.images[0].get_array().shape == (1, 5)
    assert [label.get_text() for label in ax.get_yticklabels()] == ["output"]


@pytest.mark.parametrize(
    "scores, tokens, message",
    [
        (torch.rand(6, 4), TOKENS, "got 5 tokens for scores over 4 positions"),
        (torch.rand(6, 2, 5), TOKENS, "must have shape"),
        (torch.full((2, 5), float("nan")), TOKENS, "NaN"),
    ],
)
def test_layer_heatmap_rejects_bad_input(scores, tokens, message):
    with pytest.raises(ValueError, match=message):
        plot_layer_heatmap(scores, tokens)


def test_layer_heatmap_rejects_a_string_of_tokens():
    with pytest.raises(TypeError, match="sequence of token strings"):
        plot_layer_heatmap(torch.rand(1, 3), "the keys to")


def test_methods_side_by_side_one_panel_and_colorbar_each():
    scores = {"raw": torch.rand(6, 5), "rollout": torch.rand(6, 5), "blank-out": torch.rand(5)}
    figure = plot_methods(scores, TOKENS, title="the keys to the")
    assert len(figure.axes) == 6
    heatmaps = [ax for ax in figure.axes if ax.images]
    assert [ax.get_title() for ax in heatmaps] == list(scores)
    assert [ax.images[0].get_array().shape for ax in heatmaps] == [(6, 5), (6, 5), (1, 5)]
    np.testing.assert_allclose(heatmaps[1].images[0].get_array(), scores["rollout"].numpy(), rtol=1e-6)
    _png_bytes(figure)


def test_signed_scores_are_centred_at_zero_and_unsigned_keep_their_range():
    relevance = torch.tensor([0.1, -0.94, 1.6, 0.0, 0.2])
    weights = torch.tensor([[0.2, 0.1, 0.3, 0.2, 0.2], [0.1, 0.1, 0.6, 0.1, 0.1]])
    figure = plot_methods({"attnlrp": relevance, "raw": weights, "positive": relevance.abs()}, TOKENS, signed=["attnlrp", "positive"])
    images = {ax.get_title(): ax.images[0] for ax in figure.axes if ax.images}
    assert images["attnlrp"].get_cmap().name == "RdBu_r" and images["attnlrp"].get_clim() == pytest.approx((-1.6, 1.6))
    assert images["positive"].get_cmap().name == "RdBu_r"  # declared signed: white stays 0 on this input too
    assert images["raw"].get_cmap().name == "Reds" and images["raw"].get_clim() == pytest.approx((0.1, 0.6))
    # Undeclared: decided from the data, a negative score makes a method signed.
    by_data = plot_methods({"attnlrp": relevance, "positive": relevance.abs()}, TOKENS)
    assert [ax.images[0].get_cmap().name for ax in by_data.axes if ax.images] == ["RdBu_r", "Reds"]
    # All zeros, signed: a scale around 0 rather than an empty one.
    assert plot_layer_heatmap(torch.zeros(5), TOKENS, signed=True).axes[0].images[0].get_clim() == (-1.0, 1.0)
    # A colormap given by the caller is kept, centred all the same.
    image = plot_layer_heatmap(relevance, TOKENS, cmap="coolwarm").axes[0].images[0]
    assert image.get_cmap().name == "coolwarm" and image.get_clim() == pytest.approx((-1.6, 1.6))


def _hue(rgba) -> str:
    """``red``, ``blue`` or ``white`` (all channels near 1) for a matplotlib RGBA colour."""
    red, green, blue = rgba[:3]
    return "white" if min(red, green, blue) > 0.9 else "red" if red > max(green, blue) + 0.2 else "blue" if blue > red + 0.2 else "other"


def test_one_colour_convention_red_high_or_positive_blue_negative_as_in_the_html_view():
    relevance = torch.tensor([0.1, -0.94, 1.6, 0.0, 0.2])
    weights = torch.tensor([[0.2, 0.1, 0.3, 0.2, 0.2], [0.1, 0.1, 0.6, 0.1, 0.1]])
    figure = plot_methods({"attnlrp": relevance, "raw": weights}, TOKENS)
    images = {ax.get_title(): ax.images[0] for ax in figure.axes if ax.images}
    signed, unsigned = images["attnlrp"], images["raw"]
    assert [_hue(signed.to_rgba(value)) for value in (-1.6, 0.0, 1.6)] == ["blue", "white", "red"]
    assert [_hue(unsigned.to_rgba(value)) for value in (0.1, 0.6)] == ["white", "red"]
    assert [_hue(np.array(rgb) / 255) for rgb in (NEGATIVE, POSITIVE)] == ["blue", "red"]  # the HTML view's ends
    scores = torch.rand(len(TOKENS))
    graph = plot_flow_graph(torch.softmax(torch.randn(2, 1, 2, 5, 5), -1), TOKENS, scores=scores)
    nodes = next(c for c in graph.axes[0].collections if isinstance(c, PathCollection) and c.get_array() is not None)
    assert _hue(nodes.to_rgba(scores.max().item())) == "red"


def test_methods_rejects_empty_dict():
    with pytest.raises(ValueError, match="scores is empty"):
        plot_methods({}, TOKENS)


def test_visualization_record_scales_into_captums_colour_range():
    scores = torch.tensor([0.5, -2.0, 1.0, 0.0, 0.25])
    record = to_visualization_record(scores, TOKENS, pred_prob=0.8, pred_class="plural", true_class="singular")
    assert isinstance(record, visualization.VisualizationDataRecord)
    torch.testing.assert_close(record.word_attributions, scores / 2.0)
    assert record.raw_input_ids == TOKENS
    assert (record.pred_class, record.true_class, record.attr_class) == ("plural", "singular", "plural")
    assert record.attr_score == pytest.approx(-0.25)
    html = visualization.format_word_importances(record.raw_input_ids, record.word_attributions)
    assert html.count("<mark") == len(TOKENS)


def test_visualization_record_keeps_zero_scores_and_rejects_layers():
    record = to_visualization_record(np.zeros(5), TOKENS, pred_prob=0.5, pred_class=0)
    assert record.word_attributions.abs().sum() == 0
    with pytest.raises(ValueError, match="pick a layer"):
        to_visualization_record(torch.rand(6, 5), TOKENS, pred_prob=0.5, pred_class=0)


def _reference_graph(attentions: torch.Tensor, alpha: float = 0.5) -> np.ndarray:
    """Residual-adjusted head-mean graph of example 0, computed independently in numpy, (L, n, n)."""
    weights = attentions[:, 0].numpy().astype(float).mean(1)
    mixed = alpha * weights + (1 - alpha) * np.eye(weights.shape[-1])
    return mixed / mixed.sum(-1, keepdims=True)


def test_flow_graph_draws_one_edge_per_heavy_enough_graph_weight():
    torch.manual_seed(0)
    num_layers, n = 3, len(TOKENS)
    attentions = torch.softmax(3 * torch.randn(num_layers, 2, 4, n, n), -1)
    scores = torch.rand(n)
    figure = plot_flow_graph(attentions, TOKENS, scores=scores, min_weight=0.05)
    assert len(figure.axes) == 2  # graph and colorbar
    ax = figure.axes[0]
    edges = [c for c in ax.collections if isinstance(c, LineCollection)]
    assert len(edges) == 1
    reference = _reference_graph(attentions)
    kept = np.sort(reference[reference >= 0.05])
    np.testing.assert_allclose(np.sort(edges[0].get_linewidths()) / 4.0, kept, rtol=1e-5)
    nodes = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert sum(len(c.get_offsets()) for c in nodes) == (num_layers + 1) * n + 1  # + the ring on the explained node
    input_nodes = next(c for c in nodes if c.get_array() is not None)
    np.testing.assert_allclose(input_nodes.get_array(), scores.numpy(), rtol=1e-6)
    _png_bytes(figure)


def test_flow_graph_takes_the_transformers_tuple_and_no_scores():
    attentions = tuple(torch.softmax(torch.randn(1, 2, 3, 3), -1) for _ in range(2))
    figure = plot_flow_graph(attentions, ["[CLS]", "a", "b"], position=-1, min_weight=0.0)
    assert len(figure.axes) == 1
    edges = next(c for c in figure.axes[0].collections if isinstance(c, LineCollection))
    assert len(edges.get_segments()) == 2 * 3 * 3


def test_flow_graph_rejects_long_inputs_and_bad_indices():
    n = MAX_GRAPH_TOKENS + 1
    with pytest.raises(ValueError, match="too dense"):
        plot_flow_graph(torch.softmax(torch.randn(1, 1, 1, n, n), -1), [str(i) for i in range(n)])
    attentions = torch.softmax(torch.randn(1, 1, 1, 3, 3), -1)
    with pytest.raises(ValueError, match="example=1"):
        plot_flow_graph(attentions, ["a", "b", "c"], example=1)
    with pytest.raises(ValueError, match="position=3"):
        plot_flow_graph(attentions, ["a", "b", "c"], position=3)
    with pytest.raises(ValueError, match="scores must be"):
        plot_flow_graph(attentions, ["a", "b", "c"], scores=torch.rand(4))


def test_patch_heatmap_lays_the_patch_scores_out_row_major_over_the_image():
    scores = torch.arange(17, dtype=torch.float32)  # [CLS] then patches 1..16
    figure = plot_patch_heatmap(scores, image=torch.rand(3, 32, 48), grid=(4, 4), title="rollout")
    background, heatmap = figure.axes[0].images
    assert background.get_array().shape == (32, 48, 3)
    np.testing.assert_array_equal(heatmap.get_array(), np.arange(1, 17).reshape(4, 4))
    assert heatmap.get_extent() == [0, 48, 32, 0]  # stretched over the whole image
    assert _png_bytes(figure)


def test_patch_heatmap_without_image_with_two_special_tokens_and_a_wide_grid():
    figure = plot_patch_heatmap(np.arange(8.0), grid=(2, 3), special_tokens=2)
    (heatmap,) = figure.axes[0].images
    np.testing.assert_array_equal(heatmap.get_array(), [[2, 3, 4], [5, 6, 7]])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(scores=torch.rand(11)), r"10 patch scores \(n = 11 minus 1 special tokens\) do not fill a 3 x 3 grid"),
        (dict(scores=torch.rand(2, 17)), r"one example's \(n,\) scores"),
        (dict(scores=torch.rand(17), image=torch.rand(2, 3, 8, 8)), "image must be"),
    ],
)
def test_patch_heatmap_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        plot_patch_heatmap(**kwargs)


def test_patch_heatmap_of_a_vision_transformers_rollout():
    from transformers import ViTConfig, ViTModel

    from captum_attnflow import AttentionRollout

    torch.manual_seed(0)
    config = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=64)
    pixels = torch.randn(1, 3, 16, 16)
    scores = AttentionRollout(ViTModel(config).eval()).attribute(pixels)  # (1, 1 + 16)
    heatmap = plot_patch_heatmap(scores[0], image=pixels[0]).axes[0].images[1]
    np.testing.assert_allclose(heatmap.get_array(), scores[0, 1:].reshape(4, 4).numpy())
