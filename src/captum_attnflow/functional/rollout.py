"""Attention rollout (Abnar & Zuidema 2020, section 3, equation 1).

.. math::

    \\tilde A_l = A_l \\, \\tilde A_{l-1}, \\qquad \\tilde A_1 = A_1,

with :math:`A_l` the residual-adjusted attention of :func:`~captum_attnflow.functional.attention_graph`.
Entry :math:`\\tilde A_l[p, j]` is the share of input token :math:`j` in the representation of
position :math:`p` after layer :math:`l`, summed over all paths, each path weighted by the
product of its edges.
"""

from __future__ import annotations

import bisect

import numpy as np
import torch
from numba import njit
from torch import Tensor

from captum_attnflow.functional._checks import Attentions, as_mask, layer_indices, position_indices
from captum_attnflow.functional.graph import attention_graph


def rollout(
    attentions: Attentions,
    residual_alpha: float = 0.5,
    head_fusion: str = "mean",
    attention_mask: Tensor | None = None,
) -> Tensor:
    """Full attention rollout maps of every layer.

    Costs O(L n^3) per example; for the rows of a few positions use :func:`rollout_rows`.

    Args:
        attentions: L tensors (B, H, n, n) in the transformers layout (row = query), or one
            (L, B, H, n, n) tensor.
        residual_alpha: :math:`\\alpha` in :math:`A = \\alpha W + (1 - \\alpha) I` (rows
            renormalised); 0.5 is the paper's.
        head_fusion: ``"mean"`` (paper), ``"max"`` or ``"min"`` over heads.
        attention_mask: optional (B, n), 1 on real tokens, 0 on padding; padding gets 0 and
            never influences real tokens.

    Returns:
        (L, B, n, n) float32: entry ``[l, b, p, j]`` is the rollout of position ``p`` after
        layer ``l + 1`` onto input token ``j``.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional import rollout
        >>> attentions = torch.softmax(torch.randn(6, 2, 8, 5, 5), -1)  # (L, B, H, n, n)
        >>> rollout(attentions).shape
        torch.Size([6, 2, 5, 5])
    """
    graph = attention_graph(attentions, residual_alpha, head_fusion, attention_mask)
    maps = torch.empty_like(graph)
    maps[0] = graph[0]
    for index in range(1, graph.shape[0]):
        torch.matmul(graph[index], maps[index - 1], out=maps[index])
    return maps


def rollout_rows(
    attentions: Attentions,
    position: int | Tensor = 0,
    layer: int | None = -1,
    residual_alpha: float = 0.5,
    head_fusion: str = "mean",
    attention_mask: Tensor | None = None,
) -> Tensor:
    """Rollout of one position per example onto the input tokens, top-down.

    Propagates the row vector :math:`e_p` down through the layers,
    :math:`r_l = e_p A_l A_{l-1} \\cdots A_1`, which costs O(l n^2) per explained layer
    instead of the O(L n^3) of the full maps. For ``layer=None`` the rows of all layers travel
    down together, so each :math:`A_l` is read once.

    Args:
        attentions: as in :func:`rollout`.
        position: the explained position: an int for all examples (negative counts from n) or a
            (B,) LongTensor, one per example. It must not fall on padding.
        layer: 1..L (or negative from the top) for one layer, None for all layers.
        residual_alpha, head_fusion, attention_mask: as in :func:`rollout`.

    Returns:
        (B, n) for one layer, (L, B, n) for ``layer=None``; equal to
        ``rollout(...)[l, b, position[b]]``.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional import rollout_rows
        >>> attentions = torch.softmax(torch.randn(6, 2, 8, 5, 5), -1)  # (L, B, H, n, n)
        >>> rollout_rows(attentions, position=0, layer=None).shape
        torch.Size([6, 2, 5])
    """
    graph = attention_graph(attentions, residual_alpha, head_fusion, attention_mask)
    num_layers, batch, n, _ = graph.shape
    positions = position_indices(position, as_mask(attention_mask, batch, n, graph.device))
    layers = layer_indices(layer, num_layers)
    if graph.device.type == "cpu" and not graph.requires_grad:
        rows = np.empty((len(layers), batch, n), dtype=np.float32)
        _propagate_rows_kernel(graph.numpy(), positions.numpy(), np.asarray(layers), rows)
        scores = torch.from_numpy(rows)
    else:
        scores = _propagate_rows(graph, positions, layers)
    return scores[0] if layer is not None else scores


def _propagate_rows(graph: Tensor, positions: Tensor, layers: list[int]) -> Tensor:
    """Rows of ``positions`` (B,) after each of ``layers`` (sorted, 0-based) through ``graph``: (len(layers), B, n)."""
    n = graph.shape[-1]
    # rows[:, k] explains the output of layers[k]; it is multiplied by A_l for every l <= layers[k].
    rows = torch.nn.functional.one_hot(positions, n).to(graph.dtype)[:, None, :].repeat(1, len(layers), 1)
    for index in range(layers[-1], -1, -1):
        first = bisect.bisect_left(layers, index)
        rows[:, first:] = torch.bmm(rows[:, first:], graph[index])
    return rows.transpose(0, 1).contiguous()


# The same products as _propagate_rows for CPU tensors, serial on purpose: they are tiny (O(L^2 n^2)
# in all), and torch hands each one to a multithreaded BLAS whose threads, when other processes
# share the cores, wait for a time slice each call; that made 12 products of 2 ms take 200 ms.
@njit(cache=True, fastmath={"reassoc", "contract", "nsz", "arcp"})
def _propagate_rows_kernel(graph, positions, layers, rows):  # pragma: no cover
    _, batch, n, _ = graph.shape
    count = len(layers)
    step = np.empty((count, n), dtype=np.float32)
    for b in range(batch):
        rows[:, b] = 0.0
        rows[:, b, positions[b]] = 1.0
        first = count
        for index in range(layers[-1], -1, -1):
            while first > 0 and layers[first - 1] >= index:
                first -= 1
            step[first:] = 0.0
            for i in range(n):
                edges = graph[index, b, i]
                for k in range(first, count):
                    weight = rows[k, b, i]
                    if weight != 0.0:  # one-hot starts and padding make many rows sparse
                        target = step[k]
                        for j in range(n):
                            target[j] += weight * edges[j]
            rows[first:, b] = step[first:]
