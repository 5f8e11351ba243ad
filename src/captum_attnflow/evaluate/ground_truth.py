"""A score with a ground truth: does a method put the verb's subject above the agreement attractors?"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from captum_attnflow.evaluate.spearman import as_scores

# Scores this close count as tied: flow gives many tokens the source's whole unit of flow,
# equal up to float32 rounding of the attention rows (~1e-7).
TIE_ATOL = 1e-6


def subject_first(attributions: Any, subject_positions: Any, attractor_positions: Any, atol: float = TIE_ATOL) -> Tensor:
    """Whether each example's subject is scored above every one of its agreement attractors.

    The agreement data (:func:`~captum_attnflow.data.encode_examples`) marks, per example,
    the token position of the verb's subject (the token that decides the label) and of the
    nouns whose number differs from it (the attractors, which would mislead a model). A
    faithful explanation of a correct prediction scores the subject above them. Per example

    :math:`g = 1` if :math:`s_{\\text{subject}} > \\max_a s_a + \\text{atol}`, :math:`0` if
    :math:`s_{\\text{subject}} < \\max_a s_a - \\text{atol}`, and :math:`\\frac12` for a tie
    (within ``atol``), the chance of winning the tie broken at random. The mean over
    examples is the fraction a method gets right (ties counted half); in random order it
    is about :math:`\\frac{1}{1 + \\#\\text{attractors}}`.

    Args:
        attributions: (B, n) token scores.
        subject_positions: (B,) the subject's token position in each example.
        attractor_positions: (B, A) the attractors' token positions, padded with -1 (an
            example without attractors is all -1).
        atol: scores this close to the highest attractor score count as tied.

    Returns:
        Tensor: float64 (B,) of 1, 0.5 or 0 on the CPU; NaN for an example without attractors
        (no contest) or with a NaN score at the subject or an attractor.

    Example::

        >>> import torch
        >>> from captum_attnflow.evaluate import subject_first
        >>> scores = torch.tensor([[0.1, 0.6, 0.2, 0.1], [0.1, 0.2, 0.6, 0.1], [0.1, 0.3, 0.3, 0.3],
        ...                        [0.1, 0.3, 0.3, 0.3]])
        >>> subject = torch.tensor([1, 1, 1, 1])  # the subject at token 1; attractors padded with -1
        >>> subject_first(scores, subject, torch.tensor([[2, -1], [2, 3], [3, -1], [-1, -1]])).tolist()
        [1.0, 0.0, 0.5, nan]
    """
    scores = as_scores(attributions, "attributions")
    subject = as_scores(subject_positions, "subject_positions")
    attractors = as_scores(attractor_positions, "attractor_positions")
    if scores.dim() != 2:
        raise ValueError(f"attributions must be (B, n) token scores, got shape {tuple(scores.shape)}.")
    batch, n = scores.shape
    if attractors.dim() == 1:
        attractors = attractors[:, None]
    if subject.shape != (batch,) or attractors.dim() != 2 or attractors.shape[0] != batch:
        raise ValueError(
            f"subject_positions must be (B,) = ({batch},) and attractor_positions (B, A), got "
            f"{tuple(subject.shape)} and {tuple(attractors.shape)}."
        )
    positions = torch.cat([subject[:, None], attractors], 1)
    if bool((positions != positions.round()).any()) or bool((positions >= n).any()) or bool((subject < 0).any()):
        raise ValueError(f"positions must be token positions 0..{n - 1} (attractors padded with -1).")
    subject, attractors = subject.long(), attractors.long()
    present = attractors >= 0
    attractor_scores = scores.gather(1, attractors.clamp(min=0)).masked_fill(~present, -torch.inf)
    best = attractor_scores.max(-1).values
    own = scores.gather(1, subject[:, None]).squeeze(1)
    value = torch.where(own > best + atol, 1.0, torch.where(own < best - atol, 0.0, 0.5)).double()
    undefined = ~present.any(-1) | torch.isnan(own) | torch.isnan(attractor_scores).any(-1)
    return value.masked_fill(undefined, torch.nan)
