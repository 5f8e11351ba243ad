"""Per-head raw attention, rollout and flow (Abnar & Zuidema 2020, Appendix A.1) against references
written from the appendix: head k of layer l on top of the head-fused layers below."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import torch

from captum_attnflow.functional import attention_graph, flow, raw_attention, rollout, rollout_rows


def softmax_attentions(*shape, seed=0):
    return torch.softmax(3 * torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), -1)


def mixed(weights, alpha=0.5):
    """alpha W + (1 - alpha) I, rows renormalised, written out."""
    out = alpha * weights + (1 - alpha) * torch.eye(weights.shape[-1])
    return out / out.sum(-1, keepdim=True)


def test_per_head_rollout_is_that_head_times_the_fused_rollout_below():
    attentions = softmax_attentions(3, 2, 4, 5, 5)  # (L, B, H, n, n)
    per_head = rollout(attentions, head="all")  # (L, H, B, n, n)
    assert per_head.shape == (3, 4, 2, 5, 5)
    fused = [mixed(attentions[layer].mean(1)) for layer in range(3)]
    below = torch.eye(5).expand(2, 5, 5)
    for layer in range(3):
        for k in range(4):
            expected = mixed(attentions[layer, :, k]) @ below
            torch.testing.assert_close(per_head[layer, k], expected)
            torch.testing.assert_close(rollout(attentions, head=k)[layer], expected)
        below = fused[layer] @ below


def test_per_head_rows_and_raw_attention_match_the_maps():
    attentions = softmax_attentions(3, 2, 4, 6, 6, seed=1)
    maps = rollout(attentions, head="all")
    rows = rollout_rows(attentions, position=torch.tensor([0, 3]), layer=None, head="all")  # (L, H, B, n)
    torch.testing.assert_close(rows, maps[:, :, [0, 1], [0, 3]])
    torch.testing.assert_close(rollout_rows(attentions, position=2, layer=2, head=1), maps[1, 1, :, 2])
    raw = raw_attention(attentions, position=[1, 4], layer=None, head="all")  # (L, H, B, S, n)
    torch.testing.assert_close(raw, attentions.permute(0, 2, 1, 3, 4)[:, :, :, [1, 4]])


def networkx_flow(capacities, source_layer, source, sink):
    """Max flow from (source_layer, source) to (0, sink) in the layered graph, by networkx."""
    graph = nx.DiGraph()
    for layer, matrix in enumerate(capacities, start=1):
        for i in range(matrix.shape[0]):
            for j in range(matrix.shape[1]):
                graph.add_edge((layer, i), (layer - 1, j), capacity=float(matrix[i, j]))
    return nx.maximum_flow_value(graph, (source_layer, source), (0, sink))


def test_per_head_flow_uses_that_heads_capacities_on_top_of_fused_layers():
    attentions = softmax_attentions(3, 1, 2, 5, 5, seed=2)
    graph = attention_graph(attentions, keep_heads=True)
    values = flow(attentions, layer=3, sources=[1], head=1)  # (B, S, n)
    capacities = [graph.weights[0, 0].double().numpy(), graph.weights[1, 0].double().numpy(),
                  graph.heads[2, 0, 1].double().numpy()]
    expected = [networkx_flow(capacities, 3, 1, sink) for sink in range(5)]
    np.testing.assert_allclose(values[0, 0].numpy(), expected, atol=1e-6)
    every = flow(attentions, layer=None, sources=[1], head="all")  # (L, H, B, S, n)
    assert every.shape == (3, 2, 1, 1, 5)
    torch.testing.assert_close(every[-1, 1], values)
    # With every head equal to head k, the fused layer is head k: the per-head flow is the fused flow.
    same = attentions.clone()
    same[2] = attentions[2, :, 1:2].expand_as(attentions[2])
    torch.testing.assert_close(flow(same, layer=3, sources=[1]), values)


def test_head_errors():
    attentions = softmax_attentions(2, 1, 2, 4, 4)
    with pytest.raises(ValueError, match="out of range for layers of H=2 heads"):
        rollout(attentions, head=2)
    with pytest.raises(TypeError, match='head must be None'):
        rollout_rows(attentions, head="first")
    with pytest.raises(ValueError, match="keep_heads=True"):
        flow(attention_graph(attentions), head=0)


def test_rollout_works_under_autograd():
    attentions = softmax_attentions(3, 1, 2, 4, 4).requires_grad_()
    maps = rollout(attentions)
    maps[-1, 0, 0, 1].backward()
    assert attentions.grad is not None and attentions.grad.abs().sum() > 0
    torch.testing.assert_close(maps.detach(), rollout(attentions.detach()))
    rows = rollout_rows(attentions, position=[0, 2], layer=None)
    torch.testing.assert_close(rows.detach(), rollout(attentions.detach())[:, :, [0, 2]])


def test_raw_attention_is_the_fused_row():
    attentions = softmax_attentions(2, 2, 3, 4, 4, seed=3)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    weights = raw_attention(attentions, position=1, layer=None, attention_mask=mask, residual_alpha=0.5)
    for layer in range(2):
        fused = attentions[layer].mean(1)
        for b in range(2):
            # padding columns removed, then 0.5 W + 0.5 I, the row renormalised over real tokens
            row = 0.5 * fused[b, 1] * mask[b] + 0.5 * torch.nn.functional.one_hot(torch.tensor(1), 4)
            torch.testing.assert_close(weights[layer, b], row / row.sum())
