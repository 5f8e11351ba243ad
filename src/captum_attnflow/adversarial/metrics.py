"""Distances between distributions over the last dimension: KL, Jensen-Shannon, total variation.

Jain & Wallace (2019) and Wiegreffe & Pinter (2019) compare attention rows by the
Jensen-Shannon divergence (JSD) and predictions by the total variation distance (TVD); Yang's
global adversarial loss uses the KL divergence. All three take batched distributions
``(..., k)`` and give one value per distribution ``(...)``; natural logarithms throughout, so
the JSD is bounded by :math:`\\ln 2`. ``mask`` marks which distributions count (1) and which
are padding (0): padding gets the value 0, so ``value.sum() / mask.sum()`` is the mean over
the real ones.
"""

from __future__ import annotations

import torch
from torch import Tensor

from captum_attnflow.docstrings import fill_docstring

# The arguments of every distance below.
_ARGS_DOC = """Args:
        p, q: (..., k) distributions (non-negative, each summing to 1), same shape.
        mask: optional (...) with 1 for real distributions and 0 for padding."""


@fill_docstring(args=_ARGS_DOC)
def kl(p: Tensor, q: Tensor, mask: Tensor | None = None) -> Tensor:
    """Kullback-Leibler divergence :math:`\\mathrm{KL}(p \\| q) = \\sum_i p_i \\ln(p_i / q_i)` over the last dimension.

    Terms with :math:`p_i = 0` are 0; a :math:`q_i = 0` where :math:`p_i > 0` gives ``inf``.

    {args}

    Returns:
        Tensor: (...) divergences, 0 where ``mask`` is 0.

    Example::

        >>> kl(torch.tensor([0.5, 0.5]), torch.tensor([0.25, 0.75]))  # 0.5 ln 2 + 0.5 ln(2/3)
        tensor(0.1438)
    """
    _check(p, q, mask)
    value = (torch.xlogy(p, p) - torch.xlogy(p, q)).sum(-1)
    return _masked(value, mask)


@fill_docstring(args=_ARGS_DOC)
def jsd(p: Tensor, q: Tensor, mask: Tensor | None = None) -> Tensor:
    """Jensen-Shannon divergence over the last dimension, natural log, in :math:`[0, \\ln 2]`.

    .. math:: \\mathrm{JSD}(p, q) = \\tfrac12 \\mathrm{KL}(p \\| m) + \\tfrac12 \\mathrm{KL}(q \\| m),
        \\quad m = \\tfrac12 (p + q)

    (the square of ``scipy.spatial.distance.jensenshannon`` with its default natural log).

    {args}

    Returns:
        Tensor: (...) divergences, 0 where ``mask`` is 0.

    Example::

        >>> jsd(torch.tensor([[1.0, 0.0], [0.5, 0.5]]), torch.tensor([[0.0, 1.0], [0.5, 0.5]]))
        tensor([0.6931, 0.0000])
    """
    _check(p, q, mask)
    m = (p + q) / 2
    value = 0.5 * (_plogp_over(p, m) + _plogp_over(q, m)).sum(-1)
    # Rounding can leave -1e-8 for equal distributions; the divergence is non-negative.
    return _masked(value.clamp_min(0.0), mask)


def _plogp_over(p: Tensor, m: Tensor) -> Tensor:
    """:math:`p \\ln(p / m)` with :math:`m \\ge p / 2`, 0 where :math:`p = 0`, with finite gradients there too.

    ``xlogy`` would give the value but a NaN gradient at 0 (its derivative is ``log 0``), and an
    optimised attention (per-instance adversary) has exact zeros on padding.
    """
    tiny = torch.finfo(p.dtype).tiny
    return p * (p.clamp_min(tiny).log() - m.clamp_min(tiny).log())


@fill_docstring(args=_ARGS_DOC)
def tvd(p: Tensor, q: Tensor, mask: Tensor | None = None) -> Tensor:
    """Total variation distance :math:`\\tfrac12 \\sum_i |p_i - q_i|` over the last dimension, in [0, 1].

    {args}

    Returns:
        Tensor: (...) distances, 0 where ``mask`` is 0.

    Example::

        >>> tvd(torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.3, 0.5]))
        tensor(0.3000)
    """
    _check(p, q, mask)
    return _masked(0.5 * (p - q).abs().sum(-1), mask)


def _check(p: Tensor, q: Tensor, mask: Tensor | None) -> None:
    if not isinstance(p, Tensor) or not isinstance(q, Tensor):
        raise TypeError(f"p and q must be tensors of distributions, got {type(p).__name__} and {type(q).__name__}.")
    if p.shape != q.shape or p.dim() == 0:
        raise ValueError(
            f"p and q must have the same shape (..., k), got {tuple(p.shape)} and {tuple(q.shape)}; "
            "the distributions run over the last dimension."
        )
    if mask is not None and tuple(mask.shape) != tuple(p.shape[:-1]):
        raise ValueError(
            f"mask must have shape {tuple(p.shape[:-1])} (one entry per distribution), got {tuple(mask.shape)}."
        )


def _masked(value: Tensor, mask: Tensor | None) -> Tensor:
    if mask is None:
        return value
    # where(), not a product: a padding row may hold NaN or inf, which times 0 stays NaN.
    return torch.where(mask.bool(), value, torch.zeros((), dtype=value.dtype, device=value.device))
