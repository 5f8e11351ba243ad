"""One training loop for every model of the study: plain, adversarial (Yang section 4.2) or with injected attention.

* plain: cross-entropy with the gold labels;
* adversarial (Wiegreffe & Pinter 2019, as Yang section 4.2): with the original model
  :math:`f` frozen, train :math:`g` on

  .. math:: \\mathcal{L} = \\mathrm{NLL}(\\hat y_f, g(x)) - \\lambda\\,
      \\overline{\\mathrm{KL}}(\\alpha_f \\| \\alpha_g)

  where :math:`\\hat y_f` are the original's predicted labels and :math:`\\overline{\\mathrm{KL}}`
  is the KL divergence between the attention rows of the two models averaged over layers,
  heads and real query tokens (the adversary's weights are clamped at 1e-12 inside the log,
  so the objective is bounded);
* with an attention source (uniform, or another model's stored attention for probing):
  the given attention replaces the model's own in every layer
  (:func:`~captum_attnflow.capture.attention_injection.inject_attention`) while all weights train.

Training runs with dropout off: the data are generated, so there is no shortage of them to
regularise against, and the attention rows stay distributions (attention dropout would zero
entries and make the KL infinite).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from captum_attnflow.adversarial.metrics import kl
from captum_attnflow.adversarial.tasks import AttentionSource, Batch, Task, forward
from captum_attnflow.data.chunking import IGNORE_INDEX
from captum_attnflow.models.training import adamw_with_schedule, optimizer_step

_ATTENTION_FLOOR = 1e-12


def train(
    model: nn.Module,
    task: Task,
    steps: int,
    lr: float = 1e-3,
    seed: int = 0,
    attention: AttentionSource | None = None,
    original: nn.Module | None = None,
    lam: float = 0.0,
    progress: bool = True,
    desc: str = "training",
) -> nn.Module:
    """Train ``model`` in place for ``steps`` AdamW steps on ``task.train`` and return it in eval mode.

    Args:
        model: a Hugging Face model returning ``logits``; eager attention when ``original`` is
            given (the adversarial loss needs its attention weights).
        task: the :class:`~captum_attnflow.adversarial.tasks.Task`.
        steps: optimizer steps; batches are drawn in a random order, reshuffled every epoch.
        lr: peak learning rate, linear warm-up over the first 10 % of the steps, then linear decay.
        seed: seed of the batch order.
        attention: an attention source injected in every forward pass (uniform, probing), or None.
        original: the frozen original model; given, the loss is the adversarial one above.
        lam: :math:`\\lambda` of the adversarial loss.
        progress: show a tqdm progress bar.
        desc: its label.

    Returns:
        the trained ``model`` (eval mode).

    Example::

        >>> from captum_attnflow.adversarial.tasks import chunking_task
        >>> from captum_attnflow.models.tagger import TaggerModel, yang_tagger_config
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <...>
        >>> task = chunking_task(train_examples=256, test_examples=64)
        >>> model = train(TaggerModel(yang_tagger_config()), task, steps=40, lr=3e-3, progress=False)
        >>> task.score(model) > 0.5  # chunk F1 after 40 steps
        True
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}.")
    if original is not None:
        original = original.eval().requires_grad_(False)
    model.eval()
    optimizer, schedule = adamw_with_schedule(model, lr, 0.01, max(1, steps // 10), steps)
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    bar = tqdm(range(steps), desc=desc, disable=not progress, mininterval=2, leave=False)
    for _ in bar:
        if not order:
            order = torch.randperm(len(task.train), generator=generator).tolist()
        batch = task.train[order.pop()]
        if original is None:
            loss = _label_loss(forward(model, batch, attention).logits, batch["labels"])
        else:
            loss = adversarial_loss(model, original, task, batch, lam)
        optimizer_step(loss, model, optimizer, schedule)
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    return model.eval()


def adversarial_loss(model: nn.Module, original: nn.Module, task: Task, batch: Batch, lam: float) -> Tensor:
    """:math:`\\mathrm{NLL}(\\hat y_f, g(x)) - \\lambda \\overline{\\mathrm{KL}}(\\alpha_f \\| \\alpha_g)` for one batch (module docstring).

    Args:
        model: the adversary :math:`g`, eager attention.
        original: the frozen original :math:`f`, eager attention.
        task: the task (how predictions are read).
        batch: one batch of the task.
        lam: :math:`\\lambda`.

    Returns:
        scalar Tensor with gradients for ``model``.
    """
    with torch.no_grad():
        reference = forward(original, batch, output_attentions=True)
    output = forward(model, batch, output_attentions=True)
    targets = reference.logits.argmax(-1)
    if task.per_token:
        targets = targets.masked_fill(batch["labels"] == IGNORE_INDEX, IGNORE_INDEX)
    loss = _label_loss(output.logits, targets)
    if lam:
        loss = loss - lam * mean_attention_divergence(reference.attentions, output.attentions, batch["attention_mask"]).mean()
    return loss


def mean_attention_divergence(
    reference: tuple[Tensor, ...], other: tuple[Tensor, ...], attention_mask: Tensor, metric=None
) -> Tensor:
    """Per-layer mean over heads and real query rows of ``metric(reference row, other row)``.

    Args:
        reference, other: L tensors (B, H, n, n) each.
        attention_mask: (B, n), 1 on real tokens.
        metric: ``metric(p, q, mask)`` as :func:`~captum_attnflow.adversarial.kl` (default:
            KL with ``q`` floored at 1e-12, as the adversarial loss uses).

    Returns:
        (L,) Tensor.

    Example::

        >>> from captum_attnflow.adversarial import jsd
        >>> a = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])  # (B=1, H=1, n=2, n=2)
        >>> b = torch.tensor([[[[0.0, 1.0], [0.5, 0.5]]]])
        >>> mean_attention_divergence((a,), (b,), torch.ones(1, 2), metric=jsd)  # (ln 2 + 0) / 2
        tensor([0.3466])
    """
    if metric is None:
        # The floored q sums to slightly more than 1, so rounding can dip the KL below 0.
        metric = lambda p, q, mask: kl(p, q.clamp_min(_ATTENTION_FLOOR), mask).clamp_min(0.0)
    rows = attention_mask.bool()[:, None, :]  # (B, 1, n): real queries
    values = []
    for p, q in zip(reference, other):
        mask = rows.expand(p.shape[:-1])
        values.append(metric(p, q, mask).sum() / mask.sum())
    return torch.stack(values)


def uniform_attention(batch: Batch):
    """Attention source: every query attends uniformly to the real tokens of its sentence.

    Example::

        >>> replace = uniform_attention({"attention_mask": torch.tensor([[1, 1, 0]])})
        >>> replace(0, torch.zeros(1, 2, 3, 3))[0, 0]
        tensor([[0.5000, 0.5000, 0.0000],
                [0.5000, 0.5000, 0.0000],
                [0.5000, 0.5000, 0.0000]])
    """
    keys = batch["attention_mask"].float()[:, None, None, :]
    rows = keys / keys.sum(-1, keepdim=True)

    def replace(layer: int, weights: Tensor) -> Tensor:
        return rows.expand_as(weights).to(weights.dtype)

    return replace


def stored_attention(source: nn.Module):
    """Attention source for probing: the attention the frozen ``source`` model computes on the batch.

    The maps are computed once per batch and kept (keyed by the batch's identity), as Yang
    stores the original's and the adversaries' attention before training the probes.

    Args:
        source: a model with eager attention (original, adversarial, ...).

    Returns:
        an :data:`~captum_attnflow.adversarial.tasks.AttentionSource`.
    """
    source = source.eval()
    cache: dict[int, tuple[Tensor, ...]] = {}

    def attention(batch: Batch):
        key = id(batch["input_ids"])
        if key not in cache:
            with torch.no_grad():
                cache[key] = forward(source, batch, output_attentions=True).attentions
        maps = cache[key]
        return lambda layer, weights: maps[layer].to(weights.dtype)

    return attention


def _label_loss(logits: Tensor, labels: Tensor) -> Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE_INDEX)


def copy_model(model: nn.Module) -> nn.Module:
    """A deep copy with eager attention, for an adversary initialised at the original's weights."""
    clone = copy.deepcopy(model)
    clone.set_attn_implementation("eager")
    return clone
