"""Captum's text-visualisation records from attention scores."""

from __future__ import annotations

from typing import Sequence

import torch
from captum.attr import visualization

from captum_attnflow.visualize._layout import Scores, as_layers, check_tokens


def to_visualization_record(
    scores: Scores,
    tokens: Sequence[str],
    pred_prob: float,
    pred_class: str | int,
    true_class: str | int | None = None,
    attr_class: str | int | None = None,
    convergence_score: float | None = None,
) -> visualization.VisualizationDataRecord:
    """One example's token scores as Captum's :class:`VisualizationDataRecord`, for ``visualize_text``.

    Captum colours a word by its importance clipped to [-1, 1], so the scores are divided by
    their largest absolute value (all-zero scores stay zero); ``attr_score`` is the sum of the
    unscaled scores, as Captum's tutorials report it.

    Args:
        scores: (n,) scores of one example, one layer.
        tokens: the n token strings.
        pred_prob: probability of the predicted class.
        pred_class: the predicted class (name or index).
        true_class: the gold class; defaults to ``pred_class``.
        attr_class: the class the attribution explains; defaults to ``pred_class``.
        convergence_score: Captum's convergence delta; None (shown as such) for attention methods.

    Returns:
        captum.attr.visualization.VisualizationDataRecord: the scaled scores as
        ``word_attributions``, for :func:`captum.attr.visualization.visualize_text`.

    Example::

        >>> import torch
        >>> from captum.attr import visualization
        >>> from captum_attnflow.visualize import to_visualization_record
        >>> record = to_visualization_record(torch.tensor([0.1, 0.6, 0.3]), ["the", "keys", "to"],
        ...                                  pred_prob=0.9, pred_class="plural")
        >>> record.word_attributions.max().item()
        1.0
        >>> html = visualization.format_word_importances(record.raw_input_ids, record.word_attributions)
    """
    values = torch.as_tensor(as_layers(scores, "scores"), dtype=torch.float32)
    if values.shape[0] != 1:
        raise ValueError(
            f"scores must be one example's (n,) scores, got shape {tuple(values.shape)}; "
            "pick a layer, e.g. scores[-1] for the last one."
        )
    values = values[0]
    check_tokens(tokens, values.numel())
    largest = values.abs().max()
    scaled = values / largest if largest > 0 else values
    return visualization.VisualizationDataRecord(
        scaled,
        float(pred_prob),
        pred_class,
        pred_class if true_class is None else true_class,
        pred_class if attr_class is None else attr_class,
        float(values.sum()),
        list(tokens),
        convergence_score,
    )
