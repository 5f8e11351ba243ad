"""Faithfulness for vision transformers: positive and negative perturbation (Chefer et al. 2021)."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from captum_attnflow.hf import class_scores, model_call, target_indices


def perturbation_auc(
    forward_func: Callable[..., Any],
    inputs: Tensor,
    attributions: Tensor,
    target: Any = None,
    order: str = "positive",
    steps: int = 10,
    baseline: float | str = 0.0,
    special_tokens: int = 1,
    patch_size: int | None = None,
) -> Tensor:
    """Chefer et al.'s perturbation test: the area under the curve of whether the model still
    predicts the target as ever more patches are blanked, most relevant first (``"positive"``,
    lower is better) or least relevant first (``"negative"``, higher is better) (Chefer,
    Gur and Wolf 2021, "Transformer Interpretability Beyond Attention Visualization", section 5).

    Per example, with :math:`f_j = j / S` for :math:`j = 0, \\dots, S - 1` (S = ``steps``: 0 to
    90% in the paper) and :math:`a_j = 1` when the model's top class on the image with its
    :math:`\\lceil f_j P \\rceil` most (positive) or least (negative) relevant of :math:`P`
    patches blanked is the target, else 0, the trapezoid rule over :math:`f`:

    :math:`\\mathrm{AUC} = \\sum_{j=1}^{S-1} \\frac{a_{j-1} + a_j}{2 S}`, in [0, (S - 1) / S].

    Its mean over examples is the paper's area under the accuracy curve. Patches are the
    model's tokens after the ``special_tokens`` ([CLS], a distillation token), in row-major
    order over the image; the relevance of a patch is its token's score, as the attention
    methods give it (:func:`~captum_attnflow.visualize.plot_patch_heatmap` draws the same
    grid). Ties are broken by position, earlier first. One forward pass over the batch per step.

    Args:
        forward_func: a vision model returning (B, C) class scores (e.g. a Hugging Face
            ``ViTForImageClassification``), called as ``forward_func(pixels)``.
        inputs: pixel values (B, C, H, W), as the model takes them (normalised).
        attributions: (B, n) token scores: ``special_tokens`` scores, then one per patch.
        target: the class to keep (int, list or (B,) tensor); None (default): each image's
            predicted class.
        order: ``"positive"`` (most relevant first) or ``"negative"`` (least relevant first).
        steps: S >= 2, the number of steps from 0 to 100% of the patches (the last one, all
            patches blanked, is not measured, as in the paper).
        baseline: what a blanked patch becomes: a number (default 0, the normalised
            dataset mean for a model trained on normalised pixels, as in the paper) or
            ``"mean"``, each image's own mean per channel.
        special_tokens: how many tokens come before the patches.
        patch_size: the side of a square patch in pixels; None: ``config.patch_size`` of
            the model.

    Returns:
        Tensor: float32 (B,) on the inputs' device.

    Example::

        >>> import torch
        >>> from transformers import ViTConfig, ViTForImageClassification
        >>> from captum_attnflow import AttentionRollout
        >>> from captum_attnflow.evaluate import perturbation_auc
        >>> model = ViTForImageClassification(ViTConfig(image_size=8, patch_size=4, hidden_size=32,
        ...     num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, num_labels=3)).eval()
        >>> pixels = torch.randn(2, 3, 8, 8)
        >>> scores = AttentionRollout(model).attribute(pixels)  # (2, 5): [CLS] + 2 x 2 patches
        >>> perturbation_auc(model, pixels, scores, order="negative", steps=4).shape
        torch.Size([2])
    """
    if order not in ("positive", "negative"):
        raise ValueError(f'order must be "positive" (most relevant first) or "negative", got {order!r}.')
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps must be an int >= 2, got {steps!r}.")
    if not isinstance(inputs, Tensor) or not inputs.dtype.is_floating_point or inputs.dim() != 4:
        shape = tuple(inputs.shape) if isinstance(inputs, Tensor) else type(inputs).__name__
        raise TypeError(f"inputs must be float pixel values (B, C, H, W), got {shape}.")
    patches = _patch_scores(forward_func, inputs, attributions, special_tokens, patch_size)
    blank = _baseline(inputs, baseline)
    side = inputs.shape[2] // patches.shape[1], inputs.shape[3] // patches.shape[2]
    batch, rows, columns = patches.shape
    # rank 0 = the first patch to blank.
    ranking = patches.reshape(batch, -1).argsort(dim=-1, descending=order == "positive", stable=True)
    positions = torch.arange(rows * columns, device=inputs.device).expand_as(ranking)
    rank = torch.empty_like(ranking).scatter_(1, ranking, positions)
    hits = []
    with torch.no_grad(), model_call(forward_func):
        target = _target(forward_func, inputs, target)
        for step in range(steps):
            count = math.ceil(round(step / steps * rows * columns, 9))
            hidden = (rank < count).reshape(batch, 1, rows, columns)
            hidden = hidden.repeat_interleave(side[0], 2).repeat_interleave(side[1], 3)
            pixels = torch.where(hidden, blank, inputs)
            hits.append((class_scores(forward_func(pixels)).argmax(-1) == target).float())
    curve = torch.stack(hits, -1)
    return (curve[:, 1:] + curve[:, :-1]).sum(-1) / (2 * steps)


def _patch_scores(forward_func: Any, inputs: Tensor, attributions: Any, special_tokens: int, patch_size: int | None) -> Tensor:
    """The patch scores as a (B, rows, columns) grid, checked against the image and the patch size."""
    if patch_size is None:
        patch_size = getattr(getattr(forward_func, "config", None), "patch_size", None)
        if patch_size is None:
            raise ValueError("pass patch_size=: the model has no config.patch_size.")
    patch_size = patch_size[0] if isinstance(patch_size, (tuple, list)) else int(patch_size)
    height, width = inputs.shape[2], inputs.shape[3]
    if height % patch_size or width % patch_size:
        raise ValueError(f"the image ({height} x {width}) is not a whole number of {patch_size}-pixel patches.")
    rows, columns = height // patch_size, width // patch_size
    scores = torch.as_tensor(attributions, device=inputs.device).detach().float()
    if scores.dim() != 2 or scores.shape[0] != inputs.shape[0] or scores.shape[1] != special_tokens + rows * columns:
        raise ValueError(
            f"attributions must be (B, n) = ({inputs.shape[0]}, {special_tokens + rows * columns}): "
            f"{special_tokens} special token(s), then one score per patch of the {rows} x {columns} grid; "
            f"got {tuple(scores.shape)}. Set special_tokens= (e.g. 2 for DeiT's distillation token)."
        )
    patches = scores[:, special_tokens:]
    if torch.isnan(patches).any():
        raise ValueError("attributions contain NaN on patches; the most relevant patches are undefined.")
    return patches.reshape(-1, rows, columns)


def _baseline(inputs: Tensor, baseline: float | str) -> Tensor:
    if isinstance(baseline, str):
        if baseline != "mean":
            raise ValueError(f'baseline must be a number or "mean", got {baseline!r}.')
        return inputs.mean(dim=(2, 3), keepdim=True).expand_as(inputs)
    if isinstance(baseline, bool) or not isinstance(baseline, (int, float, np.floating)):
        raise TypeError(f'baseline must be a number or "mean", got {type(baseline).__name__}.')
    return torch.full_like(inputs, float(baseline))


def _target(forward_func: Any, inputs: Tensor, target: Any) -> Tensor:
    batch = inputs.shape[0]
    if target is None:
        return class_scores(forward_func(inputs)).argmax(-1)
    return target_indices(target, batch, inputs.device).long().expand(batch)
