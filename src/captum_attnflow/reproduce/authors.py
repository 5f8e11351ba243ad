"""The authors' protocol (their released code): the gradient-sum reference and their Spearman formula
on dense ranks, and the correlations it gives every attention method."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

from captum_attnflow.data.agreement import PLURAL, SINGULAR
from captum_attnflow.reproduce.paper import DENSE, PAPER_REFERENCES


def gradient_sum(model: Any, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """The authors' gradient reference: :math:`|\\sum_d \\partial (p_{sg} - p_{pl}) / \\partial e_{i,d}|`
    for every token :math:`i`, in the model's dtype.

    :math:`e_i` is the output of the token embedding layer for token :math:`i` and
    :math:`p_{sg}, p_{pl}` the softmax probabilities of the two classes. The sum over the
    embedding dimensions is taken before the absolute value. In a model whose input reaches
    the output only through LayerNorms, as the paper's pre-LayerNorm GPT-2 blocks, adding
    :math:`c \\mathbf{1}` to :math:`e_i` changes nothing (every LayerNorm subtracts the
    mean), so the gradient is orthogonal to :math:`\\mathbf{1}` and this sum is 0 in exact
    arithmetic: in float32 it is rounding, about 1e-7 of the gradient's norm; in float64
    about 1e-16.

    Args:
        model: a two-class model taking ``inputs_embeds`` (e.g. the agreement model); run
            as it is (put it in eval mode first). Its parameters get no ``.grad``.
        input_ids: (B, n) token ids.
        attention_mask: optional (B, n), 1 on real tokens; padding gets 0.

    Returns:
        Tensor: (B, n) non-negative scores, the model's dtype.

    Example::

        >>> import copy
        >>> from captum_attnflow import load_agreement_model
        >>> model, tokenizer = load_agreement_model()
        >>> ids = tokenizer(["the keys to the cabinet"], return_tensors="pt")["input_ids"]
        >>> bool(gradient_sum(model, ids).max() < 1e-4)  # float32 rounding of an exact 0
        True
        >>> bool(gradient_sum(copy.deepcopy(model).double(), ids).max() < 1e-12)
        True
    """
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    embeddings = model.get_input_embeddings()(input_ids).detach().requires_grad_()
    probabilities = torch.softmax(model(inputs_embeds=embeddings, attention_mask=mask).logits, -1)
    # Examples do not see each other: the gradient of the batch's sum is each example's own.
    difference = (probabilities[:, SINGULAR] - probabilities[:, PLURAL]).sum()
    (gradient,) = torch.autograd.grad(difference, embeddings)
    return gradient.sum(-1).abs() * mask


def dense_rank_spearman(x: Any, y: Any, mask: Any = None) -> Tensor:
    """The authors' Spearman formula: the no-ties formula on dense ranks, undefined values as 0.

    :math:`\\rho = 1 - 6 \\sum_i d_i^2 / (m (m^2 - 1))` with :math:`d_i` the difference of the
    dense ranks (tied values share a rank, the next value gets the next integer) of
    :math:`x_i` and :math:`y_i` over the :math:`m` masked tokens. With ties it is not
    Pearson's correlation of the ranks (:func:`captum_attnflow.evaluate.spearman`) and can
    leave [-1, 1]; rows with fewer than 2 tokens or NaN scores give 0, as NaN counted as 0.

    Args:
        x, y: (B, n) scores (tensors or arrays).
        mask: optional (B, n), True on the tokens to rank; default all.

    Returns:
        Tensor: float64 (B,).

    Example::

        >>> import torch
        >>> dense_rank_spearman(torch.tensor([[1., 2., 3., 4.]]), torch.tensor([[10., 20., 20., 40.]]))
        tensor([0.8000], dtype=torch.float64)
    """
    x = torch.as_tensor(np.asarray(x), dtype=torch.float64)
    y = torch.as_tensor(np.asarray(y), dtype=torch.float64)
    keep = torch.ones(x.shape, dtype=torch.bool) if mask is None else torch.as_tensor(np.asarray(mask)).bool()
    if x.dim() != 2 or x.shape != y.shape or keep.shape != x.shape:
        raise ValueError(f"x, y and mask must all be (B, n), got {tuple(x.shape)}, {tuple(y.shape)}, {tuple(keep.shape)}.")
    count = keep.sum(-1).double()
    difference = _dense_ranks(x, keep) - _dense_ranks(y, keep)
    rho = 1 - 6 * (difference**2 * keep).sum(-1) / (count * (count**2 - 1))
    undefined = (count < 2) | ((torch.isnan(x) | torch.isnan(y)) & keep).any(-1)
    return rho.masked_fill(undefined, 0.0)


def _dense_ranks(values: Tensor, keep: Tensor) -> Tensor:
    """1 + the number of distinct masked values below each entry, per row."""
    below = (values[:, None, :] < values[:, :, None]) & keep[:, None, :]
    # Count each distinct smaller value once: an entry counts if no earlier masked entry equals it.
    equal_earlier = (values[:, None, :] == values[:, :, None]) & keep[:, None, :] & keep[:, :, None]
    first = ~torch.tril(equal_earlier, diagonal=-1).any(-1)
    return 1 + (below & first[:, None, :]).sum(-1).double()


def _dense_correlations(records: Sequence[dict[str, Any]], methods: tuple[str, ...]) -> dict[tuple, np.ndarray]:
    """The authors' references against the attention methods with :func:`dense_rank_spearman`,
    every real token ranked; (N,) per key, in the order of ``records`` (the batches')."""
    parts: dict[tuple, list[np.ndarray]] = {}
    for record in records:
        for method in methods:
            for reference in PAPER_REFERENCES:
                for layer, values in enumerate(record["scores"][method], start=1):
                    rho = dense_rank_spearman(values, record["scores"][reference], record["mask"]).cpu().numpy()
                    parts.setdefault((method, reference + DENSE, layer), []).append(rho)
    return {key: np.concatenate(values) for key, values in parts.items()}
