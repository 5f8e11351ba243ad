"""Attention rollout (Abnar & Zuidema 2020, section 3, equation 1).

.. math::

    \\tilde A_l = A_l \\, \\tilde A_{l-1}, \\qquad \\tilde A_1 = A_1,

with :math:`A_l` the residual-adjusted attention of :func:`~captum_attnflow.functional.attention_graph`.
Entry :math:`\\tilde A_l[p, j]` is the share of input token :math:`j` in the representation of
position :math:`p` after layer :math:`l`, summed over all paths, each path weighted by the
product of its edges.
"""

from __future__ import annotations

import torch
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
    maps = [graph[0]]
    for layer_matrix in graph[1:]:
        maps.append(layer_matrix @ maps[-1])
    return torch.stack(maps)


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
    :math:`r = e_p A_l A_{l-1} \\cdots A_1`, which costs O(l n^2) per layer instead of the
    O(l n^3) of the full maps.

    Args:
        attentions: as in :func:`rollout`.
        position: the explained position: an int for all examples (negative counts from n) or a
            (B,) LongTensor, one per example. It must not fall on padding.
        layer: 1..L (or negative from the top) for one layer, None for all layers.
        residual_alpha, head_fusion, attention_mask: as in :func:`rollout`.

    Returns:
        (B, n) for one layer, (L, B, n) for ``layer=None``; equal to
        ``rollout(...)[l, b, position[b]]``.
    """
    graph = attention_graph(attentions, residual_alpha, head_fusion, attention_mask)
    positions = position_indices(position, as_mask(attention_mask, *graph.shape[1:3], graph.device))
    rows = [_rollout_row(graph[: index + 1], positions) for index in layer_indices(layer, graph.shape[0])]
    return rows[0] if layer is not None else torch.stack(rows)


def _rollout_row(graph: Tensor, positions: Tensor) -> Tensor:
    """Propagate one-hot rows (B, n) down through the (l, B, n, n) matrices of ``graph``."""
    row = torch.nn.functional.one_hot(positions, graph.shape[-1]).to(graph.dtype)
    for layer_matrix in graph.flip(0):
        row = torch.bmm(row[:, None, :], layer_matrix).squeeze(1)
    return row
