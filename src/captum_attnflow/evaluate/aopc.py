"""Faithfulness without a reference: AOPC comprehensiveness and sufficiency (DeYoung et al. 2020)."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from captum_attnflow.docstrings import fill_docstring
from captum_attnflow.hf import ScoreForward, model_call

ERASER_FRACTIONS = (0.01, 0.05, 0.1, 0.2, 0.5)

_AOPC_ARGS_DOC = """
    Args:
        forward_func: a Hugging Face model returning logits, or an ``nn.Module`` / callable
            ``forward_func(inputs, *additional_forward_args)`` returning (B, C) scores.
        inputs: token ids (B, n).
        attributions: (B, n) token scores of the method being judged.
        target: the class whose probability is measured (Captum style: int, (B,) tensor or
            list); None (default) uses the predicted class on the full ``inputs``.
        additional_forward_args: extra positional arguments for the model, passed unchanged
            (they must not be per-token, since tokens move).
        attention_mask: (B, n), 1 on real tokens; padding is never deleted.
        exclude: (B, n), True on tokens that stay in place and are never candidates, e.g. the
            tokenizer's ``special_tokens_mask`` (CLS/SEP).
        fractions: the k's, each in (0, 1].
        pad_token_id: the id written after the kept tokens.
        softmax: apply a softmax to the scores (default); False when ``forward_func``
            returns probabilities.

    Returns:
        Tensor: float32 (B,) on the inputs' device; NaN for a row without candidate tokens
        or one that some fraction would delete entirely (e.g. ``1.0`` without ``exclude``).
        Tied attributions are ranked by position, earlier first.

    A Hugging Face model gets the shortened sequences with their new ``attention_mask``; any
    other ``forward_func`` gets the ids only, the deleted positions filled with
    ``pad_token_id`` at the end (per-token ``additional_forward_args`` are refused).
"""


@fill_docstring(args=_AOPC_ARGS_DOC)
def aopc_comprehensiveness(
    forward_func: Callable[..., Any],
    inputs: Tensor,
    attributions: Tensor,
    target: Any = None,
    additional_forward_args: Any = None,
    attention_mask: Tensor | None = None,
    exclude: Tensor | None = None,
    fractions: Sequence[float] = ERASER_FRACTIONS,
    pad_token_id: int = 0,
    softmax: bool = True,
) -> Tensor:
    """AOPC comprehensiveness: how much the target's probability drops when the top-k% tokens
    are deleted, averaged over k (DeYoung et al. 2020, ERASER, section 4.2). Higher is better.

    :math:`\\frac{1}{|K|} \\sum_{k \\in K} p(t \\mid x) - p(t \\mid x \\setminus r_k)`, with
    :math:`r_k` the :math:`\\lceil k m \\rceil` highest-attributed of the :math:`m` candidate
    tokens (real, not excluded) and :math:`K` = ``fractions`` (ERASER's 1, 5, 10, 20, 50%).
    Deleting means removing the tokens and closing the gap (the sequence gets shorter, its
    end padded with ``pad_token_id`` and attention mask 0), as ERASER does, not replacing them.
{args}
    Example::

        >>> from captum_attnflow import load_agreement_model
        >>> from captum_attnflow.baselines import BlankOut
        >>> from captum_attnflow.evaluate import aopc_comprehensiveness
        >>> model, tokenizer = load_agreement_model()
        >>> ids = tokenizer(["the keys to the cabinet"], return_tensors="pt")["input_ids"]
        >>> drops = BlankOut(model, tokenizer=tokenizer).attribute(ids)
        >>> cls = ids == tokenizer.cls_token_id  # never deleted
        >>> best = aopc_comprehensiveness(model, ids, drops, exclude=cls)
        >>> worst = aopc_comprehensiveness(model, ids, -drops, exclude=cls)  # the ranking reversed
        >>> best.shape, bool(best > worst)
        (torch.Size([1]), True)
    """
    return _aopc(
        forward_func, inputs, attributions, target, additional_forward_args, attention_mask, exclude,
        fractions, pad_token_id, softmax, keep_top=False,
    )


@fill_docstring(args=_AOPC_ARGS_DOC)
def aopc_sufficiency(
    forward_func: Callable[..., Any],
    inputs: Tensor,
    attributions: Tensor,
    target: Any = None,
    additional_forward_args: Any = None,
    attention_mask: Tensor | None = None,
    exclude: Tensor | None = None,
    fractions: Sequence[float] = ERASER_FRACTIONS,
    pad_token_id: int = 0,
    softmax: bool = True,
) -> Tensor:
    """AOPC sufficiency: how much the target's probability drops when only the top-k% tokens
    are kept, averaged over k (DeYoung et al. 2020, ERASER, section 4.2). Lower is better.

    :math:`\\frac{1}{|K|} \\sum_{k \\in K} p(t \\mid x) - p(t \\mid r_k)`, with :math:`r_k` the
    :math:`\\lceil k m \\rceil` top-attributed of the :math:`m` candidate tokens kept in their
    order (plus the ``exclude`` tokens, which always stay) and everything else deleted, as in
    :func:`aopc_comprehensiveness`.
{args}
    Example::

        >>> from captum_attnflow import AttentionRollout, load_agreement_model
        >>> from captum_attnflow.evaluate import aopc_sufficiency
        >>> model, tokenizer = load_agreement_model()
        >>> batch = tokenizer(["the keys to the cabinet", "the key"], padding=True, return_tensors="pt")
        >>> ids, mask = batch["input_ids"], batch["attention_mask"]
        >>> scores = AttentionRollout(model).attribute(ids, attention_mask=mask)
        >>> aopc_sufficiency(model, ids, scores, attention_mask=mask, exclude=ids == tokenizer.cls_token_id).shape
        torch.Size([2])
    """
    return _aopc(
        forward_func, inputs, attributions, target, additional_forward_args, attention_mask, exclude,
        fractions, pad_token_id, softmax, keep_top=True,
    )


def _aopc(
    forward_func, inputs, attributions, target, additional_forward_args, attention_mask, exclude,
    fractions, pad_token_id, softmax, keep_top,
) -> Tensor:
    forward = ScoreForward(forward_func, probabilities=softmax)
    inputs, mask, extra_args = forward.prepare(inputs, attention_mask, additional_forward_args)
    for argument in extra_args[1:]:
        if isinstance(argument, Tensor) and argument.dim() >= 2 and tuple(argument.shape[:2]) == tuple(inputs.shape):
            raise ValueError(
                f"additional_forward_args holds a per-token tensor of shape {tuple(argument.shape)}; deleting "
                "tokens would misalign it. Pass the attention mask as attention_mask= with a Hugging Face "
                "model (AOPC rebuilds it), or compute per-token inputs inside forward_func."
            )
    candidates = mask & ~_bool(exclude, mask, "exclude")
    scores = _scores(attributions, mask)
    fractions = list(fractions)
    if not fractions or any(not 0 < float(f) <= 1 for f in fractions):
        raise ValueError(f"fractions must be a non-empty list of values in (0, 1], got {fractions}.")
    # Rank 0 = highest score among the candidates; the rest sort last.
    order = scores.masked_fill(~candidates, -math.inf).argsort(dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(inputs.shape[1], device=inputs.device).expand_as(order))
    total = torch.zeros(inputs.shape[0], device=inputs.device)
    # No candidate means nothing to delete or keep, and no token left means no input to judge:
    # both undefined, reported as NaN rather than as a perfect 0 or a prediction on nothing.
    undefined = ~candidates.any(-1)
    with torch.no_grad(), model_call(forward_func):
        target = forward.target(inputs, extra_args, target)
        full = _probability(forward, inputs, mask, extra_args, target)
        for fraction in fractions:
            # Rounded first: 0.28 * 25 is 7.000000000000001 in floating point, and 28% of 25 tokens is 7, not 8.
            k = torch.ceil((float(fraction) * candidates.sum(-1).double()).round(decimals=9)).long()
            top = candidates & (rank < k[:, None])
            kept = (mask & ~candidates) | top if keep_top else mask & ~top
            undefined |= ~kept.any(-1)
            ids, kept_mask = _delete(inputs, kept, pad_token_id)
            total += full - _probability(forward, ids, kept_mask, (kept_mask.long(), *extra_args[1:]), target)
    return (total / len(fractions)).masked_fill(undefined, math.nan)


def _delete(inputs: Tensor, kept: Tensor, pad_token_id: int) -> tuple[Tensor, Tensor]:
    """Move each row's kept tokens to the front, in order, and pad the rest."""
    order = (~kept).long().argsort(dim=-1, stable=True)
    ids = inputs.gather(1, order)
    kept_mask = kept.gather(1, order)
    return ids.masked_fill(~kept_mask, pad_token_id), kept_mask


def _probability(forward: ScoreForward, ids: Tensor, mask: Tensor, extra_args: tuple, target: Any) -> Tensor:
    probabilities = forward(ids, mask.long(), *extra_args[1:]).float()
    if isinstance(target, int):
        return probabilities[:, target]
    target = torch.as_tensor(target, device=probabilities.device).long().reshape(-1)
    if target.numel() == 1:
        return probabilities[:, target.item()]
    if target.shape[0] != probabilities.shape[0]:
        raise ValueError(f"target must give one class per example (B = {probabilities.shape[0]}), got {target.numel()}.")
    return probabilities.gather(1, target[:, None]).squeeze(1)


def _bool(values: Tensor | None, mask: Tensor, name: str) -> Tensor:
    if values is None:
        return torch.zeros_like(mask)
    values = torch.as_tensor(values, device=mask.device).bool()
    if values.shape != mask.shape:
        raise ValueError(f"{name} must have shape (B, n) = {tuple(mask.shape)}, got {tuple(values.shape)}.")
    return values


def _scores(attributions: Tensor, mask: Tensor) -> Tensor:
    scores = torch.as_tensor(attributions, device=mask.device).detach().float()
    if scores.shape != mask.shape:
        raise ValueError(
            f"attributions must be (B, n) = {tuple(mask.shape)} token scores for these inputs, got "
            f"{tuple(scores.shape)}; for per-layer attributions pick one layer, e.g. scores[-1]."
        )
    if torch.isnan(scores[mask]).any():
        raise ValueError("attributions contain NaN on real tokens; the top-k tokens are undefined.")
    return scores
