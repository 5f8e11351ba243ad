"""The attention graph of Abnar & Zuidema (2020), section 3: head fusion and residual mixing.

Every method of the paper starts from the same per-layer matrices

.. math::

    A_l = \\operatorname{renorm}\\big(\\alpha \\, \\bar W_l + (1 - \\alpha) I\\big),

where :math:`\\bar W_l` fuses the heads of layer :math:`l` (the paper averages them),
:math:`\\alpha = 0.5` accounts for the residual connection and ``renorm`` rescales each row
to sum to 1. Row :math:`i` holds the edges from position :math:`i` at layer :math:`l` to the
positions of layer :math:`l - 1`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from captum_attnflow.functional._checks import (
    Attentions,
    as_mask,
    attention_layers,
    check_attention_values,
    check_residual_alpha,
)

HEAD_FUSIONS = ("mean", "max", "min")


def fuse_heads(attentions: Tensor, head_fusion: str = "mean") -> Tensor:
    """Fuse the heads of (..., H, n, n) attentions into (..., n, n) by ``mean``, ``max`` or ``min``."""
    check_head_fusion(head_fusion)
    if head_fusion == "mean":
        # A vector-matrix product over the flattened maps reads them once at BLAS speed;
        # mean(-3), a reduction over a middle axis, is several times slower on CPU.
        *batch, heads, n, _ = attentions.shape
        flat = attentions.reshape(-1, heads, n * n)
        weights = torch.full((flat.shape[0], 1, heads), 1.0 / heads, dtype=flat.dtype, device=flat.device)
        return torch.bmm(weights, flat).view(*batch, n, n)
    if head_fusion == "max":
        return attentions.amax(-3)
    return attentions.amin(-3)


def check_head_fusion(head_fusion: str) -> None:
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}.")


def add_residual(weights: Tensor, residual_alpha: float = 0.5) -> Tensor:
    """Mix (..., n, n) attention with the identity: ``alpha * W + (1 - alpha) * I``, rows renormalised.

    A row that is all zero becomes the identity row (or stays zero for ``residual_alpha=1``);
    :func:`attention_graph` zeroes padding rows afterwards.
    """
    check_residual_alpha(residual_alpha)
    mixed = weights * residual_alpha
    mixed.diagonal(dim1=-2, dim2=-1).add_(1.0 - residual_alpha)
    return _renormalise_rows(mixed)


def attention_graph(
    attentions: Attentions,
    residual_alpha: float = 0.5,
    head_fusion: str = "mean",
    attention_mask: Tensor | None = None,
) -> Tensor:
    """Residual-adjusted, head-fused attention matrices :math:`A_l`, shape (L, B, n, n).

    Args:
        attentions: L tensors (B, H, n, n) as returned by transformers for
            ``output_attentions=True`` (row = query), or one (L, B, H, n, n) tensor.
        residual_alpha: weight :math:`\\alpha` of attention against the residual identity;
            0.5 is the paper's, 1.0 keeps raw attention.
        head_fusion: ``"mean"`` (paper), ``"max"`` or ``"min"`` over heads.
        attention_mask: optional (B, n), 1 on real tokens, 0 on padding. Padding positions
            are removed from the graph: their rows and columns are zero, and the rows of real
            tokens are renormalised over real tokens only.

    Returns:
        float32 tensor (L, B, n, n); rows of real tokens sum to 1.
    """
    layers = attention_layers(attentions)
    batch, _, n, _ = layers[0].shape
    device = layers[0].device
    mask = as_mask(attention_mask, batch, n, device)
    check_head_fusion(head_fusion)
    check_residual_alpha(residual_alpha)
    # Layer by layer rather than on a stacked copy: each (B, H, n, n) map is checked and fused
    # while it is still in cache, and only the fused (L, B, n, n) graph is ever allocated.
    graph = torch.empty(len(layers), batch, n, n, dtype=torch.float32, device=device)
    for index, layer in enumerate(layers):
        layer = layer.float()
        check_attention_values(layer, mask)
        graph[index] = fuse_heads(layer, head_fusion)
    if not mask.all():
        keep = mask[:, :, None] & mask[:, None, :]  # (B, n, n): real query and real key
        graph *= keep
        return add_residual(graph, residual_alpha) * keep
    return add_residual(graph, residual_alpha)


def _renormalise_rows(matrix: Tensor) -> Tensor:
    sums = matrix.sum(-1, keepdim=True)
    return matrix / torch.where(sums > 0, sums, torch.ones_like(sums))
