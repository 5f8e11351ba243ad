"""What adversarial attention means for attributions: Spearman of raw attention, rollout and flow across models.

For a model :math:`g` (an adversary, another seed) and the original :math:`f`, on test
sentences and per layer :math:`l`:

* **vs original**: Spearman correlation over the word tokens between :math:`g`'s and
  :math:`f`'s raw attention (heads averaged), rollout and flow of the explained positions;
* **vs own blank-out**: Spearman between :math:`g`'s own rollout or flow and :math:`g`'s own
  blank-out (the drop of its predicted label's probability when a word becomes ``[UNK]``).

The explained position is ``[CLS]`` for the agreement classifier (as in Abnar & Zuidema's
Table 1) and every word for a tagger (each word's own prediction). If a model predicts as
the original while its rollout and flow correlate weakly with the original's, attention-based
explanations are not exclusive for that model: a different attention, with a different
explanation, gives the same predictions.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from captum_attnflow.adversarial.tasks import Batch, Task, forward
from captum_attnflow.baselines import BlankOut
from captum_attnflow.data.tokenizer import SPECIAL_TOKENS
from captum_attnflow.evaluate import spearman
from captum_attnflow.functional import flow, rollout

UNK_ID = SPECIAL_TOKENS.index("[UNK]")  # the paper's blank, in the tokenizer of both tasks


def attention_scores(model: nn.Module, task: Task, batch: Batch) -> dict[str, Tensor]:
    """Raw attention, rollout and flow of the explained positions, every layer.

    Args:
        model: eager attention.
        task: the task (which positions are explained).
        batch: test batch.

    Returns:
        ``{"raw", "rollout", "flow"}``, each (L, B, S, n): S explained positions (1 for the
        classifier's ``[CLS]``, n for a tagger; padding rows are 0).
    """
    with torch.no_grad():
        attentions = torch.stack(forward(model, batch, output_attentions=True).attentions).float()
    mask = batch["attention_mask"]
    raw = attentions.mean(2) * mask[None, :, :, None]
    maps = rollout(attentions, attention_mask=mask)
    flows = flow(attentions, layer=None, sources=None if task.per_token else [0], attention_mask=mask, show_progress=False)
    if task.per_token:
        return {"raw": raw, "rollout": maps, "flow": flows}
    return {"raw": raw[:, :, :1], "rollout": maps[:, :, :1], "flow": flows}


def blank_out_scores(model: nn.Module, task: Task, batch: Batch) -> Tensor:
    """Drop in each explained position's predicted-label probability when each word is blanked (``[UNK]``).

    Returns:
        (B, S, n), S as in :func:`attention_scores`.
    """
    ids, mask = batch["input_ids"], batch["attention_mask"]
    if not task.per_token:
        return BlankOut(model, token=UNK_ID).attribute(ids, attention_mask=mask)[:, None]
    with torch.no_grad():
        probabilities = forward(model, batch).logits.softmax(-1)
        predicted = probabilities.argmax(-1, keepdim=True)
        base = probabilities.gather(-1, predicted)[..., 0]
        drops = torch.zeros(*ids.shape, ids.shape[1])
        for j in range(ids.shape[1]):
            blanked = ids.clone()
            blanked[:, j] = torch.where(mask[:, j].bool(), torch.full_like(ids[:, j], UNK_ID), ids[:, j])
            after = forward(model, {"input_ids": blanked, "attention_mask": mask}).logits.softmax(-1)
            drops[:, :, j] = base - after.gather(-1, predicted)[..., 0]
    return drops * mask[:, None, :] * mask[:, :, None]


def attribution_table(
    original: nn.Module, models: dict[str, nn.Module], task: Task, num_batches: int = 1
) -> list[dict[str, object]]:
    """Mean Spearman correlations of item 6 (module docstring) for every model, layer and method.

    Args:
        original: the original model, eager attention.
        models: compared models by name (eager attention), e.g. ``{"lambda=0.2": adversary}``;
            the original is added as ``"original"`` for the blank-out rows.
        task: the task; the first ``num_batches`` test batches are used.
        num_batches: how many test batches.

    Returns:
        rows ``{"model", "comparison", "method", "layer", "spearman"}`` with ``comparison``
        ``"vs original"`` or ``"vs own blank-out"``, ``layer`` from 1, ``spearman`` the mean
        over explained positions (NaN ones, e.g. constant scores, left out).

    Example::

        >>> from captum_attnflow.adversarial.tasks import chunking_task
        >>> from captum_attnflow.models.tagger import TaggerModel, yang_tagger_config
        >>> task = chunking_task(train_examples=8, test_examples=4)
        >>> model = TaggerModel(yang_tagger_config(attn_implementation="eager")).eval()
        >>> rows = attribution_table(model, {"itself": model}, task)
        >>> [row["spearman"] for row in rows if row["model"] == "itself" and row["comparison"] == "vs original"]
        [1.0, 1.0, 1.0]
    """
    rows = []
    for batch in task.test[:num_batches]:
        words = batch["attention_mask"].bool().clone()
        words[:, 0] = False  # [CLS] is not a word
        reference = attention_scores(original, task, batch)
        for name, model in {"original": original, **models}.items():
            scores = reference if model is original else attention_scores(model, task, batch)
            blank = blank_out_scores(model, task, batch)
            explained = words if task.per_token else torch.ones(words.shape[0], 1, dtype=torch.bool)
            for method, values in scores.items():
                for layer in range(values.shape[0]):
                    pairs = []
                    if name != "original":
                        pairs.append(("vs original", reference[method][layer]))
                    if method != "raw":
                        pairs.append(("vs own blank-out", blank))
                    for comparison, other in pairs:
                        rho = _spearman_rows(values[layer], other, words, explained)
                        rows.append(dict(model=name, comparison=comparison, method=method, layer=layer + 1, spearman=rho))
    return _mean_over_batches(rows)


def _spearman_rows(x: Tensor, y: Tensor, words: Tensor, explained: Tensor) -> list[float]:
    """Spearman over the word tokens of every explained row; (B, S, n) inputs."""
    batch, sources, n = x.shape
    keep = words[:, None, :].expand(batch, sources, n)
    rho = spearman(x.reshape(-1, n), y.reshape(-1, n), keep.reshape(-1, n)).reshape(batch, sources)
    return rho[explained & ~rho.isnan()].tolist()


def _mean_over_batches(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    merged: dict[tuple, list[float]] = {}
    for row in rows:
        merged.setdefault((row["model"], row["comparison"], row["method"], row["layer"]), []).extend(row["spearman"])
    return [
        dict(model=m, comparison=c, method=method, layer=layer, spearman=sum(v) / len(v) if v else float("nan"))
        for (m, c, method, layer), v in merged.items()
    ]
