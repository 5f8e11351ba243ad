"""Faithfulness by token deletion beside AOPC: log-odds (Shrikumar et al. 2017) and the area
between the most- and least-relevant-first deletion curves (Achtibat et al. 2024, AttnLRP)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from captum_attnflow.docstrings import fill_docstring
from captum_attnflow.evaluate._deletion import DELETION_ARGS_DOC, DELETION_NOTES_DOC, check_fractions, deleting

LOG_ODDS_FRACTIONS = (0.2,)


@fill_docstring(args=DELETION_ARGS_DOC, notes=DELETION_NOTES_DOC)
def log_odds(
    forward_func: Callable[..., Any],
    inputs: Tensor,
    attributions: Tensor,
    target: Any = None,
    additional_forward_args: Any = None,
    attention_mask: Tensor | None = None,
    exclude: Tensor | None = None,
    fractions: Sequence[float] = LOG_ODDS_FRACTIONS,
    deletion: int | str = "remove",
    tokenizer: Any = None,
    pad_token_id: int = 0,
    softmax: bool = True,
) -> Tensor:
    """Log-odds: the log of the ratio of the target's probability with the top-k% tokens
    deleted to that on the full input (Shrikumar et al. 2017, DeepLIFT, section 4.2; Chen et
    al. 2020 for text). Lower (more negative) is better.

    :math:`\\frac{1}{|K|} \\sum_{k \\in K} \\log \\frac{p(t \\mid x \\setminus r_k)}{p(t \\mid x)}`,
    with :math:`r_k` the :math:`\\lceil k m \\rceil` highest-attributed of the :math:`m`
    candidate tokens and :math:`K` = ``fractions`` (default the top 20%). The papers replace
    the tokens (``deletion="mask"`` or a token id); the default removes them, as
    :func:`~captum_attnflow.evaluate.aopc_comprehensiveness` does. Computed from
    log-probabilities, so a probability that underflows to 0 gives a large negative value,
    not :math:`-\\infty`.

    Args:{args}
        fractions: the k's, each in (0, 1].

    Returns:
        Tensor: float32 (B,) on the inputs' device.
{notes}
    Example::

        >>> from captum_attnflow import load_agreement_model
        >>> from captum_attnflow.baselines import BlankOut
        >>> from captum_attnflow.evaluate import aopc_comprehensiveness, log_odds
        >>> model, tokenizer = load_agreement_model()
        >>> batch = tokenizer(["the keys to the cabinet"], return_special_tokens_mask=True, return_tensors="pt")
        >>> ids, special = batch["input_ids"], batch["special_tokens_mask"].bool()  # [CLS]: never deleted
        >>> drops = BlankOut(model, tokenizer=tokenizer).attribute(ids)
        >>> best = log_odds(model, ids, drops, exclude=special, deletion="unk", tokenizer=tokenizer)  # [UNK] in their place
        >>> worst = log_odds(model, ids, -drops, exclude=special, deletion="unk", tokenizer=tokenizer)
        >>> bool(best < worst)
        True
        >>> drop = aopc_comprehensiveness(model, ids, drops, exclude=special, fractions=[0.2], deletion="unk", tokenizer=tokenizer)
        >>> bool((best < 0) == (drop > 0))  # the same deletion, as a log-ratio instead of a difference
        True
    """
    fractions = check_fractions(fractions)
    with deleting(
        forward_func, inputs, attributions, target, additional_forward_args, attention_mask, exclude,
        deletion, tokenizer, pad_token_id, softmax,
    ) as tokens:
        full = tokens.score(log=True)
        total = sum(tokens.score(tokens.top(fraction), log=True) - full for fraction in fractions)
    return total / len(fractions)


@fill_docstring(args=DELETION_ARGS_DOC, notes=DELETION_NOTES_DOC)
def deletion_area(
    forward_func: Callable[..., Any],
    inputs: Tensor,
    attributions: Tensor,
    target: Any = None,
    additional_forward_args: Any = None,
    attention_mask: Tensor | None = None,
    exclude: Tensor | None = None,
    steps: int = 10,
    deletion: int | str = "remove",
    tokenizer: Any = None,
    pad_token_id: int = 0,
    softmax: bool = True,
) -> Tensor:
    """The area between the least- and the most-relevant-first deletion curves (LeRF minus
    MoRF; Achtibat et al. 2024, AttnLRP, section 4.1, after Samek et al. 2017). Higher is better.

    The MoRF curve is the target's probability as the candidate tokens are deleted from the
    highest-attributed on, the LeRF curve the same from the lowest-attributed on, both over the
    deleted fraction :math:`f \\in [0, 1]` on ``steps`` equal steps. Both curves start at the
    full input and end with every candidate deleted, so their difference vanishes at the ends
    and the trapezoid rule gives

    :math:`\\frac{1}{S} \\sum_{j=1}^{S-1} p(t \\mid x \\setminus \\ell_{j/S}) - p(t \\mid x \\setminus r_{j/S})`,

    with :math:`r_f` the :math:`\\lceil f m \\rceil` highest- and :math:`\\ell_f` as many
    lowest-attributed of the :math:`m` candidates and :math:`S` = ``steps``: in [-1, 1] for
    probabilities, 0 for a ranking no better than its reverse. A step that deletes every
    candidate adds 0 (the curves meet there), also where removing would leave no input. ``softmax=False`` on a model
    returning logits measures the logits' curves, as AttnLRP does.

    Args:{args}
        steps: :math:`S` >= 2, the number of steps from 0 to all candidates deleted; 2(S - 1)
            forward passes over the batch.

    Returns:
        Tensor: float32 (B,) on the inputs' device.
{notes}
    Example::

        >>> import torch
        >>> from captum_attnflow import load_agreement_model
        >>> from captum_attnflow.baselines import BlankOut
        >>> from captum_attnflow.evaluate import deletion_area
        >>> model, tokenizer = load_agreement_model()
        >>> batch = tokenizer(["the keys to the cabinet near the door", "the key to the doors"], padding=True, return_tensors="pt")
        >>> ids, mask = batch["input_ids"], batch["attention_mask"]
        >>> drops = BlankOut(model, tokenizer=tokenizer).attribute(ids, attention_mask=mask)
        >>> cls = ids == tokenizer.cls_token_id
        >>> area = deletion_area(model, ids, drops, attention_mask=mask, exclude=cls)
        >>> reversed_area = deletion_area(model, ids, -drops, attention_mask=mask, exclude=cls)
        >>> bool((area > 0).all()), torch.allclose(area, -reversed_area)  # the reverse ranking swaps the curves
        (True, True)
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps must be an int >= 2, got {steps!r}.")
    with deleting(
        forward_func, inputs, attributions, target, additional_forward_args, attention_mask, exclude,
        deletion, tokenizer, pad_token_id, softmax,
    ) as tokens:
        total = torch.zeros(tokens.inputs.shape[0], device=tokens.inputs.device)
        for step in range(1, steps):
            top = tokens.top(step / steps)
            difference = tokens.score(tokens.bottom(step / steps)) - tokens.score(top)
            # Both curves at "everything deleted": the same point, even where removing leaves no input.
            everything = (top.sum(-1) == tokens.count) & (tokens.count > 0)
            total += difference.masked_fill(everything, 0.0)
    return total / steps
