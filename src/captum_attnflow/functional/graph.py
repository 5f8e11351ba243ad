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
    check_attention_values,
    check_residual_alpha,
    stack_attentions,
)

HEAD_FUSIONS = ("mean", "max", "min")


def fuse_heads(attentions: Tensor, head_fusion: str = "mean") -> Tensor:
    """Fuse the heads of (..., H, n, n) attentions into (..., n, n) by ``mean``, ``max`` or ``min``."""
    if head_fusion == "mean":
        return attentions.mean(-3)
    if head_fusion == "max":
        return attentions.amax(-3)
    if head_fusion == "min":
        return attentions.amin(-3)
    raise ValueError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}.")


def add_residual(weights: Tensor, residual_alpha: float = 0.5) -> Tensor:
    """Mix (..., n, n) attention with the identity: ``alpha * W + (1 - alpha) * I``, rows renormalised.

    Rows that are all zero (padding) stay zero.
    """
    check_residual_alpha(residual_alpha)
    eye = torch.eye(weights.shape[-1], dtype=weights.dtype, device=weights.device)
    mixed = residual_alpha * weights + (1.0 - residual_alpha) * eye
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
    stacked = stack_attentions(attentions)
    _, batch, _, n, _ = stacked.shape
    mask = as_mask(attention_mask, batch, n, stacked.device)
    check_attention_values(stacked, mask)
    keep = mask[None, :, :, None] & mask[None, :, None, :]  # (1, B, n, n): real query and real key
    fused = fuse_heads(stacked, head_fusion) * keep
    return add_residual(fused, residual_alpha) * keep


def _renormalise_rows(matrix: Tensor) -> Tensor:
    sums = matrix.sum(-1, keepdim=True)
    return torch.where(sums > 0, matrix / sums.clamp_min(torch.finfo(matrix.dtype).tiny), matrix)
