"""Token deletion shared by AOPC and the other faithfulness metrics: rank the candidate tokens
once, then score the model on the batch with a chosen set of them removed or replaced, one
forward pass per set (only of the rows not scored before inside :func:`shared_forward_passes`)."""

from __future__ import annotations

import math
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch import Tensor

from captum_attnflow.hf import ScoreForward, check_token_ids, model_call, target_indices, token_id
from captum_attnflow.hf.scores import check_softmax_applies

# The deletion settings a metric accepts: remove and close the gap, or replace by a token.
DELETIONS = ("remove", "mask", "unk", "pad")

DELETION_ARGS_DOC = """
        forward_func: a Hugging Face model returning logits, or an ``nn.Module`` / callable
            ``forward_func(inputs, *additional_forward_args)`` returning (B, C) scores.
        inputs: token ids (B, n).
        attributions: (B, n) token scores of the method being judged.
        target: the class whose probability is measured (Captum style: int, (B,) tensor or
            list); None (default) uses the predicted class on the full ``inputs``.
        additional_forward_args: extra positional arguments for the model, passed unchanged
            (with ``deletion="remove"`` they must not be per-token, since tokens move).
        attention_mask: (B, n), 1 on real tokens; padding is never deleted.
        exclude: (B, n), True on tokens that stay in place and are never candidates, e.g. the
            tokenizer's ``special_tokens_mask`` (CLS/SEP).
        deletion: how a token is deleted: ``"remove"`` (default) takes it out and closes the
            gap, as ERASER does; a token id, or ``"mask"``, ``"unk"``, ``"pad"`` (looked up on
            ``tokenizer``, then on the model's config), writes that token in its place and keeps
            the sequence's length and positions, as Chefer et al. (2021) and DecompX do.
        tokenizer: where ``deletion``'s token names are looked up first; None: the model's config.
        pad_token_id: the id written after the kept tokens when removing.
        softmax: apply a softmax to the scores (default); False when ``forward_func``
            returns probabilities (or to measure its raw scores, e.g. logits, as they are)."""

DELETION_NOTES_DOC = """
    The candidates of a row are its real tokens that are not excluded; ranks are taken among
    them, ties broken by position (earlier first), and "the :math:`k` top tokens" are the
    :math:`\\lceil f m \\rceil` highest-attributed of the :math:`m` candidates for a fraction
    :math:`f`. A row without candidates, or one a deletion would leave without any token
    (``"remove"`` only), scores NaN. A Hugging Face model gets the shortened sequences with
    their new ``attention_mask``; any other ``forward_func`` gets the ids only, the deleted
    positions filled with ``pad_token_id`` at the end (per-token ``additional_forward_args`` are
    refused).
"""


# The model's scores of rows already run, while shared_forward_passes() is open.
_SHARED: ContextVar[dict | None] = ContextVar("shared_forward_passes", default=None)


@contextmanager
def shared_forward_passes() -> Iterator[None]:
    """Inside the block, the deletion metrics run the model only on rows it has not scored yet.

    Many metrics, layers and methods delete the same tokens of a row (the top token of a
    ranking, the top half): the first forward pass of such a row is kept (its scores, keyed
    by the model, the row's token ids and mask and the identity of the extra arguments) and
    reused, so a row is run once however many of them ask for it. Rows missing from the store
    run together in one smaller batch; the values equal a full-batch run up to float rounding.
    Extra arguments whose first axis is the batch are taken per row, others whole. Open it
    around the metrics of one batch, as the :class:`~captum_attnflow.evaluate.Evaluator` does:
    the store lives as long as the block.
    """
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


@contextmanager
def deleting(forward_func: Callable[..., Any], *arguments: Any) -> Iterator[TokenDeletion]:
    """The :class:`TokenDeletion` of ``forward_func`` and the other arguments of its constructor,
    built and scored inside the block without gradients and on ``model_call(forward_func)``
    (the model alone, in eval mode, restored afterwards)."""
    with torch.no_grad(), model_call(forward_func):
        yield TokenDeletion(forward_func, *arguments)


class TokenDeletion:
    """The checked inputs of one metric call and the model's score of the target on them, with
    any set of candidate tokens deleted. Build it with :func:`deleting`: it runs the model for a
    target of None."""

    def __init__(
        self,
        forward_func: Callable[..., Any],
        inputs: Tensor,
        attributions: Tensor,
        target: Any,
        additional_forward_args: Any,
        attention_mask: Tensor | None,
        exclude: Tensor | None,
        deletion: int | str,
        tokenizer: Any,
        pad_token_id: int,
        softmax: bool,
    ) -> None:
        self.forward = ScoreForward(forward_func)
        self.inputs, self.mask, self.extra_args = self.forward.prepare(inputs, attention_mask, additional_forward_args)
        self.replacement = _replacement(forward_func, deletion, tokenizer)
        if self.replacement is None:
            _refuse_per_token_args(self.extra_args[1:], self.inputs.shape)
        self.pad_token_id = pad_token_id
        self.softmax = softmax
        self.candidates = self.mask & ~_bool(exclude, self.mask, "exclude")
        self.count = self.candidates.sum(-1)
        scores = _scores(attributions, self.mask)
        order = scores.masked_fill(~self.candidates, -math.inf).argsort(dim=-1, descending=True, stable=True)
        positions = torch.arange(self.inputs.shape[1], device=self.inputs.device).expand_as(order)
        # rank 0 = the highest-attributed candidate; the other tokens sort after every candidate.
        self.rank = torch.empty_like(order).scatter_(1, order, positions)
        target = self.forward.target(self.inputs, self.extra_args, target)
        self.target = target_indices(target, self.inputs.shape[0], self.inputs.device).long().expand(self.inputs.shape[0])

    def top(self, fraction: float) -> Tensor:
        """(B, n) bool: the :math:`\\lceil f m \\rceil` highest-attributed candidates."""
        return self.candidates & (self.rank < self._k(fraction)[:, None])

    def bottom(self, fraction: float) -> Tensor:
        """(B, n) bool: the :math:`\\lceil f m \\rceil` lowest-attributed candidates (the
        complement of the top ones in the same order, so ties break the same way)."""
        return self.candidates & (self.rank >= (self.count - self._k(fraction))[:, None])

    def score(self, deleted: Tensor | None = None, log: bool = False) -> Tensor:
        """(B,) float32: the target's probability (its log with ``log=True``) with the ``deleted``
        tokens (B, n) deleted; None scores the full inputs. NaN where a row has no candidate
        or no token left."""
        if deleted is None:
            ids, mask = self.inputs, self.mask
        elif self.replacement is None:
            ids, mask = _remove(self.inputs, self.mask & ~deleted, self.pad_token_id)
        else:
            ids, mask = self.inputs.masked_fill(deleted, self.replacement), self.mask
        output = self._run(ids, mask)
        if self.softmax:
            check_softmax_applies(output)
            output = torch.log_softmax(output, -1) if log else torch.softmax(output, -1)
        elif log:
            output = output.log()
        value = output.gather(1, self.target[:, None]).squeeze(1)
        if deleted is None:
            return value
        return value.masked_fill((self.count == 0) | ~mask.any(-1), math.nan)

    def _run(self, ids: Tensor, mask: Tensor) -> Tensor:
        """(B, C) float scores of the rows, from the store of :func:`shared_forward_passes` where it has them."""
        args = self.extra_args[1:]
        store = _SHARED.get()
        if store is None:
            return self.forward(ids, mask.long(), *args).float()
        model = (id(self.forward.forward_func), tuple(id(arg) for arg in args))
        keys = [(model, row, *key) for row, key in enumerate(_row_keys(ids, mask))]
        missing = [row for row, key in enumerate(keys) if key not in store]
        if missing:
            rows = torch.tensor(missing, device=ids.device)
            batch = ids.shape[0]
            # Captum-style extra arguments: per example when their first axis is the batch.
            sliced = [arg[rows] if isinstance(arg, Tensor) and arg.dim() and arg.shape[0] == batch else arg for arg in args]
            scores = self.forward(ids[rows], mask[rows].long(), *sliced).float()
            store.update(zip((keys[row] for row in missing), scores))
        return torch.stack([store[key] for key in keys])

    def _k(self, fraction: float) -> Tensor:
        # Rounded first: 0.28 * 25 is 7.000000000000001 in floating point, and 28% of 25 tokens is 7, not 8.
        return torch.ceil((float(fraction) * self.count.double()).round(decimals=9)).long()


def check_fractions(fractions: Any, name: str = "fractions") -> list[float]:
    """The fractions as floats, each in (0, 1]; a ValueError names ``name`` otherwise."""
    try:
        values = [float(f) for f in fractions]
    except TypeError as error:
        raise TypeError(f"{name} must be a sequence of numbers in (0, 1], got {fractions!r}.") from error
    if not values or any(not 0 < f <= 1 for f in values):
        raise ValueError(f"{name} must be a non-empty list of values in (0, 1], got {list(fractions)}.")
    return values


def _replacement(forward_func: Any, deletion: Any, tokenizer: Any) -> int | None:
    if isinstance(deletion, str) and deletion == "remove":
        return None
    if isinstance(deletion, bool) or not isinstance(deletion, (int, str)) or (isinstance(deletion, str) and deletion not in DELETIONS):
        raise ValueError(f'deletion must be "remove", a token id or one of "mask", "unk", "pad", got {deletion!r}.')
    replacement = token_id(forward_func, deletion, tokenizer, argument="deletion")
    check_token_ids(torch.tensor([[replacement]]), forward_func)
    return replacement


def _refuse_per_token_args(arguments: tuple, shape: torch.Size) -> None:
    for argument in arguments:
        if isinstance(argument, Tensor) and argument.dim() >= 2 and tuple(argument.shape[:2]) == tuple(shape):
            raise ValueError(
                f"additional_forward_args holds a per-token tensor of shape {tuple(argument.shape)}; removing "
                "tokens would misalign it. Pass the attention mask as attention_mask= with a Hugging Face "
                "model (the metric rebuilds it), replace tokens instead (deletion='mask' or a token id), "
                "or compute per-token inputs inside forward_func."
            )


def _remove(inputs: Tensor, kept: Tensor, pad_token_id: int) -> tuple[Tensor, Tensor]:
    """Move each row's kept tokens to the front, in order, and pad the rest; columns that are
    padding in every row are dropped (at least one stays), sparing the model their work."""
    order = (~kept).long().argsort(dim=-1, stable=True)
    width = max(int(kept.sum(-1).max()), 1)
    ids = inputs.gather(1, order)[:, :width]
    kept_mask = kept.gather(1, order)[:, :width]
    return ids.masked_fill(~kept_mask, pad_token_id), kept_mask


def _row_keys(ids: Tensor, mask: Tensor) -> list[tuple[bytes, bytes]]:
    """Each row's token ids and mask up to its last real token: the same row whatever padding
    follows. One copy to the host for the batch, not one per row."""
    ids, mask = ids.cpu().numpy(), mask.cpu().numpy()
    lengths = np.where(mask.any(-1), mask.shape[1] - mask[:, ::-1].argmax(-1), 0)
    return [(row_ids[:length].tobytes(), row_mask[:length].tobytes()) for row_ids, row_mask, length in zip(ids, mask, lengths)]


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
