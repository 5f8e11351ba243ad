"""Head fusion and residual mixing (Abnar & Zuidema 2020, section 3): the two steps that turn one
layer's attentions (B, H, n, n) into its matrix of the attention graph,

.. math::

    A_l = \\operatorname{renorm}\\big(\\alpha \\, \\bar W_l + (1 - \\alpha) I\\big),

with :math:`\\bar W_l` the fused heads. :mod:`~captum_attnflow.functional.graph` applies them to
every layer.
"""

from __future__ import annotations

import torch
from torch import Tensor

from captum_attnflow.functional.checks import check_residual_alpha

HEAD_FUSIONS = ("mean", "max", "min")


def fuse_heads(attentions: Tensor, head_fusion: str = "mean", out: Tensor | None = None) -> Tensor:
    """Fuse the heads of (..., H, n, n) attentions into (..., n, n): :math:`\\bar W = \\operatorname{mean}_h W^h`
    (the paper's), or the element-wise ``max`` or ``min`` over heads.

    Args:
        attentions: (..., H, n, n) attention weights, heads on dimension -3.
        head_fusion: ``"mean"`` (default), ``"max"`` or ``"min"``.
        out: optional (..., n, n) tensor to write the result into.

    Returns:
        Tensor: (..., n, n), same dtype and device (``out`` if given).

    Example::

        >>> import torch
        >>> from captum_attnflow.functional import fuse_heads
        >>> heads = torch.tensor([[[0.2, 0.8], [1.0, 0.0]], [[0.6, 0.4], [0.0, 1.0]]])  # (H, n, n)
        >>> fuse_heads(heads)
        tensor([[0.4000, 0.6000],
                [0.5000, 0.5000]])
        >>> fuse_heads(heads, "max")
        tensor([[0.6000, 0.8000],
                [1.0000, 1.0000]])
    """
    check_head_fusion(head_fusion)
    reduce = {"mean": torch.mean, "max": torch.amax, "min": torch.amin}[head_fusion]
    return reduce(attentions, -3) if out is None else reduce(attentions, -3, out=out)


def check_head_fusion(head_fusion: str) -> None:
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}.")


def add_residual(weights: Tensor, residual_alpha: float = 0.5) -> Tensor:
    """Mix (..., n, n) attention with the identity for the residual connection (paper, section 3):
    :math:`A = \\operatorname{renorm}(\\alpha W + (1 - \\alpha) I)`, each row rescaled to sum to 1.

    A row that is all zero becomes the identity row (or stays zero for ``residual_alpha=1``);
    :func:`attention_graph` zeroes padding rows afterwards.

    Args:
        weights: (..., n, n) attention weights (heads already fused), row = query.
        residual_alpha: :math:`\\alpha` in [0, 1]; 0.5 (default) is the paper's, 1.0 leaves
            the weights as they are (rows renormalised).

    Returns:
        Tensor: a new (..., n, n) tensor; ``weights`` is not modified.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional import add_residual
        >>> add_residual(torch.tensor([[0.2, 0.8], [1.0, 0.0]]))  # 0.5 W + 0.5 I
        tensor([[0.6000, 0.4000],
                [0.5000, 0.5000]])
    """
    check_residual_alpha(residual_alpha)
    mixed = weights * residual_alpha
    mixed.diagonal(dim1=-2, dim2=-1).add_(1.0 - residual_alpha)
    return _renormalise_rows(mixed)


def _mix_in_place(layer: Tensor, mask: Tensor, residual_alpha: float, positions: Tensor | None = None) -> Tensor:
    """(B, n, n) fused probabilities -> :math:`A`: padding removed, :math:`\\alpha W + (1 - \\alpha) I`,
    rows renormalised, all in place; returns ``layer``. With ``positions`` (B, S), ``layer`` is
    (B, S, n), the rows of those positions only."""
    row_mask = mask if positions is None else mask.gather(1, positions)
    keep = None if mask.all() else row_mask[:, :, None] & mask[:, None, :]
    if keep is not None:
        layer.mul_(keep)
    layer.mul_(residual_alpha)
    if positions is None:
        layer.diagonal(dim1=-2, dim2=-1).add_(1.0 - residual_alpha)
    else:  # the residual's 1 - alpha sits in each row's own column
        layer.scatter_add_(-1, positions[..., None], torch.full_like(layer[..., :1], 1.0 - residual_alpha))
    sums = layer.sum(-1, keepdim=True)
    layer.div_(torch.where(sums > 0, sums, torch.ones_like(sums)))
    if keep is not None:
        layer.mul_(keep)
    return layer


def _mixed(weights: Tensor, residual_alpha: float, mask: Tensor) -> Tensor:
    """Residual mixing of (..., B, [H,] n, n) weights with padding rows and columns removed."""
    if not mask.all():
        keep = mask[..., :, None] & mask[..., None, :]  # real query and real key
        return add_residual(weights * keep, residual_alpha) * keep
    return add_residual(weights, residual_alpha)


def _renormalise_rows(matrix: Tensor) -> Tensor:
    sums = matrix.sum(-1, keepdim=True)
    return matrix / torch.where(sums > 0, sums, torch.ones_like(sums))
