"""Spearman rank correlation per example, over real tokens, ties given average ranks."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor


def as_scores(values: Any, name: str = "attributions") -> Tensor:
    """A tensor or array of scores as a float64 CPU tensor (detached)."""
    if isinstance(values, Tensor):
        return values.detach().to("cpu", torch.float64)
    if isinstance(values, np.ndarray) or isinstance(values, (list, tuple)):
        array = np.asarray(values)
        if not np.issubdtype(array.dtype, np.number) and array.dtype != np.bool_:
            raise TypeError(f"{name} must be numeric, got an array of dtype {array.dtype}.")
        return torch.as_tensor(array, dtype=torch.float64)
    raise TypeError(f"{name} must be a torch tensor or a numpy array, got {type(values).__name__}.")


def average_ranks(values: Tensor, mask: Tensor) -> Tensor:
    """Ranks 1..m of each row's masked entries, ties sharing their average rank (scipy's ``rankdata``).

    Args:
        values: (B, n) float.
        mask: (B, n) bool, True on the entries to rank; the others get rank 0.

    The rank of entry :math:`i` is :math:`\\#\\{j : x_j < x_i\\} + (\\#\\{j : x_j = x_i\\} + 1) / 2`
    over masked :math:`j`, computed by comparing all pairs at once; written out because
    ``scipy.stats.rankdata`` has no per-row mask and would need a Python loop over examples.
    """
    other = mask[:, None, :]
    less = ((values[:, None, :] < values[:, :, None]) & other).sum(-1, dtype=torch.float64)
    equal = ((values[:, None, :] == values[:, :, None]) & other).sum(-1, dtype=torch.float64)
    return (less + (equal + 1) / 2) * mask


def spearman(x: Any, y: Any, mask: Any = None) -> Tensor:
    """Spearman's rank correlation between ``x`` and ``y`` for every example, over masked tokens.

    :math:`\\rho = \\mathrm{pearson}(\\mathrm{rank}(x), \\mathrm{rank}(y))` with average ranks
    for ties, exactly ``scipy.stats.spearmanr(x[b][m], y[b][m]).statistic`` for each row
    :math:`b`, as the paper's tables use it (section 2).

    Args:
        x, y: (B, n) tensors or arrays of token scores.
        mask: optional (B, n) bool (or 0/1), True on the tokens to compare: the attention mask,
            and-ed with ``~special_tokens_mask`` to leave out CLS/SEP. Default: all tokens.

    Returns:
        Tensor: float64 (B,). NaN where a row has fewer than 2 tokens, where ``x`` or ``y`` is
        constant over the masked tokens (the correlation is undefined) or contains NaN; never
        silently 0.

    Example::

        >>> import torch
        >>> from captum_attnflow.evaluate import spearman
        >>> spearman(torch.tensor([[1., 2., 3., 4.]]), torch.tensor([[10., 20., 20., 40.]]))
        tensor([0.9487], dtype=torch.float64)
    """
    x, y = as_scores(x, "x"), as_scores(y, "y")
    if x.dim() == 1 and y.dim() == 1:
        x, y = x[None], y[None]
    if x.dim() != 2 or x.shape != y.shape:
        raise ValueError(
            f"x and y must both be (B, n) with the same shape, got {tuple(x.shape)} and {tuple(y.shape)}; "
            "different token counts mean they come from different tokenizations."
        )
    if mask is None:
        keep = torch.ones(x.shape, dtype=torch.bool)
    else:
        keep = as_scores(mask, "mask").bool()
        if keep.shape != x.shape:
            raise ValueError(f"mask must have the shape of x {tuple(x.shape)}, got {tuple(keep.shape)}.")
    has_nan = ((torch.isnan(x) | torch.isnan(y)) & keep).any(-1)
    rx = average_ranks(x, keep)
    ry = average_ranks(y, keep)
    count = keep.sum(-1).clamp(min=1)
    dx = (rx - rx.sum(-1, keepdim=True) / count[:, None]) * keep
    dy = (ry - ry.sum(-1, keepdim=True) / count[:, None]) * keep
    denominator = torch.sqrt((dx * dx).sum(-1) * (dy * dy).sum(-1))
    rho = (dx * dy).sum(-1) / denominator
    undefined = (denominator == 0) | has_nan | (keep.sum(-1) < 2)
    return rho.clamp(-1.0, 1.0).masked_fill(undefined, float("nan"))
