"""Gradient-weighted attention rollout (Chefer, Gur & Wolf, ICCV 2021, equations 5-6)."""

from __future__ import annotations

import torch
from torch import Tensor

from captum_attnflow.docstrings import fill_docstring
from captum_attnflow.functional.checks import (
    POSITION_DOC,
    Attentions,
    as_mask,
    attention_layers,
    default_position,
    matrix_rows,
)


def relevance_maps(attentions: Attentions, gradients: Attentions, attention_mask: Tensor | None = None) -> Tensor:
    """The relevance maps :math:`R_l` after each layer, (L, B, n, n) float32.

    With :math:`A_l` the attention probabilities (B, H, n, n) of layer l and :math:`\\nabla A_l`
    the gradient of the explained score with respect to them,

    .. math::
        \\bar A_l = \\mathbb{E}_h\\big[(\\nabla A_l \\odot A_l)^+\\big], \\qquad
        R_0 = I, \\qquad R_l = R_{l-1} + \\bar A_l R_{l-1},

    not normalised, as the paper defines it. Padding rows and columns of :math:`\\bar A_l` are
    zero, so padding never receives or passes relevance.

    Args:
        attentions: L tensors (B, H, n, n) (or one (L, B, H, n, n) tensor), row = query.
        gradients: the gradients of the score with respect to them, the same shapes.
        attention_mask: optional (B, n), 1 on real tokens, 0 on padding.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional.gradient_rollout import relevance_maps
        >>> attentions = torch.softmax(torch.randn(2, 1, 4, 3, 3), -1)  # (L, B, H, n, n)
        >>> relevance = relevance_maps(attentions, torch.ones_like(attentions))  # gradient 1: Ā = mean_h A
        >>> expected = torch.eye(3) + attentions[0, 0].mean(0)
        >>> expected = expected + attentions[1, 0].mean(0) @ expected
        >>> torch.allclose(relevance[1, 0], expected)
        True
    """
    layers, grads = attention_layers(attentions), attention_layers(gradients)
    if len(layers) != len(grads) or any(a.shape != g.shape for a, g in zip(layers, grads)):
        raise ValueError(
            "gradients must match attentions: one (B, H, n, n) gradient per layer, "
            f"got {[tuple(g.shape) for g in grads]} for {[tuple(a.shape) for a in layers]}."
        )
    batch, _, n, _ = layers[0].shape
    mask = as_mask(attention_mask, batch, n, layers[0].device)
    keep = (mask[:, :, None] & mask[:, None, :]).float()
    relevance = torch.eye(n, device=mask.device).expand(batch, n, n)
    maps = []
    for attention, gradient in zip(layers, grads):
        weighted = (gradient.float() * attention.float()).clamp(min=0).mean(1) * keep
        relevance = relevance + weighted @ relevance
        maps.append(relevance)
    return torch.stack(maps)


@fill_docstring(position=POSITION_DOC)
def gradient_weighted_rollout(
    attentions: Attentions,
    gradients: Attentions,
    position: int | list[int] | Tensor | None = None,
    layer: int | None = -1,
    attention_mask: Tensor | None = None,
) -> Tensor:
    """Rows of the relevance maps :func:`relevance_maps`: the relevance of each input token for
    the representation of ``position`` after ``layer``.

    Args:
        attentions, gradients, attention_mask: as in :func:`relevance_maps`.
        position: {position}
            None (default): each example's last real token when the attention is causal, else 0.
        layer: 1..L (or negative from the top) for one layer, None for all layers.

    Returns:
        float32 (B, n) for one layer and one position per example; a leading layer axis
        (L, B, n) for ``layer=None`` and a position axis (..., S, n) for a list or (B, S)
        ``position``; padding 0. Equal to ``relevance_maps(...)[l, b, position[b]]``.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional import gradient_weighted_rollout
        >>> attentions = torch.softmax(torch.randn(3, 2, 4, 5, 5), -1)  # (L, B, H, n, n)
        >>> gradient_weighted_rollout(attentions, torch.randn(3, 2, 4, 5, 5), layer=None).shape
        torch.Size([3, 2, 5])
    """
    maps = relevance_maps(attentions, gradients, attention_mask)
    mask = as_mask(attention_mask, maps.shape[1], maps.shape[2], maps.device)
    if position is None:  # causal attention, detected from the attentions (R may lack gradients to show it)
        causal = all(not bool(layer.triu(1).any()) for layer in attention_layers(attentions))
        position = default_position(mask, causal)
    return matrix_rows(maps, position, layer, mask)
