"""Global adversarial models (Wiegreffe & Pinter 2019; Yang section 4.2) and how far they are from the original.

For each :math:`\\lambda` of a grid, an adversary starts from the original's weights and is
trained with :func:`~captum_attnflow.adversarial.training.adversarial_loss`: predictions kept,
attention pushed away. :func:`compare_models` measures any model against the original on the
test batches: its score (chunk F1 or accuracy), the mean JSD and KL of its attention rows to
the original's per layer, and the mean TVD of its predictions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from captum_attnflow.adversarial.metrics import jsd, tvd
from captum_attnflow.adversarial.tasks import AttentionSource, Task, forward
from captum_attnflow.adversarial.training import copy_model, mean_attention_divergence, train


@dataclass
class ModelComparison:
    """One model against the original on the test batches.

    Attributes:
        name: e.g. ``"adversarial"``, ``"other seed"``, ``"uniform"``.
        lam: :math:`\\lambda` for adversaries, None otherwise.
        score: chunk F1 or accuracy.
        jsd: per layer, mean JSD of its attention rows to the original's (heads, real queries).
        kl: per layer, mean :math:`\\mathrm{KL}(\\alpha_{orig} \\| \\alpha)` (the model's rows floored at 1e-12).
        tvd: mean TVD of its predicted distributions to the original's.
        same: fraction of test predictions (tokens or sentences) whose label is the original's.
    """

    name: str
    lam: float | None
    score: float
    jsd: list[float] = field(default_factory=list)
    kl: list[float] = field(default_factory=list)
    tvd: float = 0.0
    same: float = 1.0


def compare_models(
    original: nn.Module, model: nn.Module, task: Task, name: str, lam: float | None = None,
    attention: AttentionSource | None = None,
) -> ModelComparison:
    """Score of ``model`` and its attention and prediction distances to ``original`` (see :class:`ModelComparison`).

    Args:
        original: the original model, eager attention.
        model: the compared model, eager attention.
        task: the task; its test batches are used.
        name, lam: labels for the row.
        attention: the attention source ``model`` runs with (uniform), or None.

    Returns:
        ModelComparison

    Example::

        >>> from captum_attnflow.adversarial.tasks import chunking_task
        >>> from captum_attnflow.models.tagger import TaggerModel, yang_tagger_config
        >>> task = chunking_task(train_examples=32, test_examples=32)
        >>> model = TaggerModel(yang_tagger_config(attn_implementation="eager")).eval()
        >>> row = compare_models(model, model, task, "itself")
        >>> row.jsd, row.tvd
        ([0.0], 0.0)
    """
    jsd_sum = kl_sum = None
    tvd_sum, count, same, predicted = 0.0, 0, 0, 0
    with torch.no_grad():
        for batch in task.test:
            reference = forward(original, batch, output_attentions=True)
            output = forward(model, batch, attention, output_attentions=True)
            mask = batch["attention_mask"]
            weight = int(mask.sum())
            layer_jsd = mean_attention_divergence(reference.attentions, output.attentions, mask, jsd) * weight
            layer_kl = mean_attention_divergence(reference.attentions, output.attentions, mask) * weight
            jsd_sum = layer_jsd if jsd_sum is None else jsd_sum + layer_jsd
            kl_sum = layer_kl if kl_sum is None else kl_sum + layer_kl
            count += weight
            predictions = task.prediction_mask(batch)
            p, q = task.probabilities(reference.logits), task.probabilities(output.logits)
            tvd_sum += float(tvd(p, q, predictions).sum() / predictions.sum()) * len(batch["labels"])
            same += int(((p.argmax(-1) == q.argmax(-1)) & predictions).sum())
            predicted += int(predictions.sum())
    examples = sum(len(batch["labels"]) for batch in task.test)
    return ModelComparison(
        name, lam, task.score(model, attention), (jsd_sum / count).tolist(), (kl_sum / count).tolist(), tvd_sum / examples,
        same / predicted,
    )


def adversarial_models(
    original: nn.Module, task: Task, lambdas: list[float], steps: int, lr: float = 1e-3, seed: int = 0,
    progress: bool = True,
    name: str = "adversary",
) -> dict[float, nn.Module]:
    """One adversary per :math:`\\lambda`, each initialised at the original's weights and trained ``steps`` steps.

    Args:
        original: the original model (its weights are not changed).
        task: the task; its training batches are used.
        lambdas: the grid, e.g. ``[0, 0.2, 0.5, 1, 2, 3]``.
        steps, lr, seed: as :func:`~captum_attnflow.adversarial.training.train`.
        progress: progress bars.
        name: label of the progress bars.

    Returns:
        dict from :math:`\\lambda` to the trained adversary (eager attention, eval mode).
    """
    reference = copy_model(original).requires_grad_(False)
    return {
        lam: train(copy_model(original).requires_grad_(True), task, steps, lr, seed, original=reference, lam=lam,
                   progress=progress, desc=f"{name} lambda={lam:g}")
        for lam in lambdas
    }


def layer_mean(values: list[float]) -> float:
    """Mean over layers of a per-layer list (the x axis of the TVD-vs-JSD plot)."""
    return float(torch.tensor(values).mean()) if values else float("nan")
