"""Per-instance adversarial attention (Jain & Wallace 2019, section 4): same prediction, most different attention.

For one input and a frozen model, optimise a replacement :math:`\\tilde\\alpha` of the
attention of one layer (all heads, or one) to

.. math:: \\max_{\\tilde\\alpha}\\ \\overline{\\mathrm{JSD}}(\\alpha, \\tilde\\alpha)
    \\quad \\text{s.t.} \\quad \\mathrm{TVD}(\\hat y(\\alpha), \\hat y(\\tilde\\alpha)) \\le \\epsilon

where :math:`\\overline{\\mathrm{JSD}}` averages over the replaced heads and real query rows and
the TVD is the prediction's (for a tagger: the largest over its words). :math:`\\tilde\\alpha`
is a softmax of free logits over the real keys, so its rows are distributions; the
constraint enters as a penalty :math:`c \\cdot \\max(0, \\mathrm{TVD} - \\epsilon)` and each
example keeps the most divergent attention found that satisfies it; a final bisection along
the mixture of the original and the last iterate finds a feasible attention with positive
JSD where the search ended outside the constraint. The attention is put into the model with
:func:`~captum_attnflow.capture.attention_injection.inject_attention`; the model is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from captum_attnflow.adversarial.metrics import jsd, tvd
from captum_attnflow.adversarial.tasks import Batch, Task, forward
from captum_attnflow.capture import inject_attention

_BISECTIONS = 10


@dataclass
class PerInstanceResult:
    """Result of :func:`per_instance_adversary` for a batch.

    Attributes:
        jsd: (B,) mean JSD of the found attention to the original (replaced heads, real queries).
        tvd: (B,) the prediction's TVD with the found attention, <= epsilon.
        attention: (B, H', n, n) the found attention of the replaced heads, rows are distributions.
    """

    jsd: Tensor
    tvd: Tensor
    attention: Tensor


def per_instance_adversary(
    model: nn.Module,
    task: Task,
    batch: Batch,
    layer: int = -1,
    head: int | None = None,
    epsilon: float = 0.01,
    steps: int = 100,
    lr: float = 1.0,
    penalty: float = 50.0,
    init_scale: float = 3.0,
) -> PerInstanceResult:
    """Jain & Wallace's adversarial attention for every example of ``batch`` (module docstring).

    Args:
        model: a Hugging Face model of the task (frozen: no weight changes, gradients only to
            the attention logits).
        task: the task (how predictions are read).
        batch: inputs, ``input_ids`` and ``attention_mask`` (B, n).
        layer: the replaced layer, 0-based (negative from the top).
        head: the replaced head, or None for all heads of the layer.
        epsilon: largest allowed TVD of the prediction (a tagger's: of any word).
        steps: Adam steps on the attention logits.
        lr: their learning rate.
        penalty: weight :math:`c` of the constraint violation.
        init_scale: standard deviation of the Gaussian noise added to the original's log
            attention to start the search.

    Returns:
        PerInstanceResult

    Example::

        >>> from captum_attnflow.adversarial.tasks import chunking_task
        >>> from captum_attnflow.models.tagger import TaggerModel, yang_tagger_config
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <...>
        >>> task = chunking_task(train_examples=8, test_examples=4)
        >>> model = TaggerModel(yang_tagger_config()).eval()
        >>> found = per_instance_adversary(model, task, task.test[0], epsilon=0.05, steps=20)
        >>> bool((found.tvd <= 0.05).all()), bool((found.jsd > 0).all())
        (True, True)
        >>> torch.allclose(found.attention.sum(-1), torch.ones(()))  # rows are distributions
        True
    """
    if not 0 < epsilon <= 1:
        raise ValueError(f"epsilon bounds a total variation distance, so it must lie in (0, 1], got {epsilon}.")
    captured: dict[str, Tensor] = {}
    num_layers = model.config.num_hidden_layers
    if not -num_layers <= layer < num_layers:
        raise ValueError(f"layer {layer} is out of range for {num_layers} layers (0-based, negative from the top).")
    layer = layer % num_layers

    def capture(index: int, weights: Tensor) -> Tensor:
        if index == layer:
            captured["weights"] = weights.detach()
        return weights

    model_grad = [p.requires_grad for p in model.parameters()]
    model.requires_grad_(False)
    try:
        with torch.no_grad(), inject_attention(model, capture):
            original = task.probabilities(forward(model, batch).logits)
        weights = captured["weights"]
        heads = slice(None) if head is None else slice(head, head + 1)
        target = weights[:, heads]
        keys = batch["attention_mask"].bool()[:, None, None, :]
        queries = batch["attention_mask"].bool()[:, None, :].expand(target.shape[:-1])
        predictions = task.prediction_mask(batch)
        # The JSD has zero gradient where the two attentions are equal: start from a random
        # perturbation of the original instead (Jain & Wallace start from random attention).
        logits = (target.clamp_min(1e-6).log() + init_scale * torch.randn_like(target)).requires_grad_(True)
        optimizer = torch.optim.Adam([logits], lr=lr)

        def evaluate(attention: Tensor) -> tuple[Tensor, Tensor]:
            """(B,) prediction TVD and mean attention JSD with ``attention`` in place of the original's."""

            def replace(index: int, w: Tensor) -> Tensor:
                if index != layer:
                    return w
                out = w.clone()
                out[:, heads] = attention
                return out

            with inject_attention(model, replace):
                probabilities = task.probabilities(forward(model, batch).logits)
            distance = tvd(original, probabilities, predictions).amax(-1)
            return distance, jsd(target, attention, queries).sum((-1, -2)) / queries.sum((-1, -2))

        best_jsd = torch.zeros(target.shape[0])
        best_tvd = torch.zeros(target.shape[0])
        best = target.clone()

        def keep_best(attention: Tensor, distance: Tensor, divergence: Tensor) -> None:
            better = (distance <= epsilon) & (divergence > best_jsd)
            best_jsd.copy_(torch.where(better, divergence, best_jsd))
            best_tvd.copy_(torch.where(better, distance, best_tvd))
            best[better] = attention[better]

        for _ in range(steps):
            attention = logits.masked_fill(~keys, float("-inf")).softmax(-1)
            distance, divergence = evaluate(attention)
            with torch.no_grad():
                keep_best(attention, distance, divergence)
            loss = (-divergence + penalty * (distance - epsilon).clamp_min(0)).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        # Where the search ended outside the constraint, walk back towards the original along
        # the mixture (1 - t) alpha + t alpha_found (still distributions), bisecting on t: the
        # JSD grows with t and the prediction is continuous in it, so a feasible t > 0 exists.
        with torch.no_grad():
            found = logits.masked_fill(~keys, float("-inf")).softmax(-1)
            low, high = torch.zeros(target.shape[0]), torch.ones(target.shape[0])
            for _ in range(_BISECTIONS):
                t = ((low + high) / 2)[:, None, None, None]
                mixture = (1 - t) * target + t * found
                distance, divergence = evaluate(mixture)
                keep_best(mixture, distance, divergence)
                feasible = distance <= epsilon
                low, high = torch.where(feasible, t.flatten(), low), torch.where(feasible, high, t.flatten())
    finally:
        for parameter, flag in zip(model.parameters(), model_grad):
            parameter.requires_grad_(flag)
    return PerInstanceResult(best_jsd.detach(), best_tvd.detach(), best.detach())
