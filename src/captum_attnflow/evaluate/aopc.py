"""Faithfulness without a reference: AOPC comprehensiveness and sufficiency (DeYoung et al. 2020)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from torch import Tensor

from captum_attnflow.docstrings import fill_docstring
from captum_attnflow.evaluate._deletion import DELETION_ARGS_DOC, DELETION_NOTES_DOC, check_fractions, deleting

ERASER_FRACTIONS = (0.01, 0.05, 0.1, 0.2, 0.5)

_AOPC_ARGS_DOC = """
    Args:""" + DELETION_ARGS_DOC + """
        fractions: the k's, each in (0, 1].

    Returns:
        Tensor: float32 (B,) on the inputs' device; NaN for a row without candidate tokens
        or one that some fraction would delete entirely (e.g. ``1.0`` without ``exclude``).
""" + DELETION_NOTES_DOC


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
    deletion: int | str = "remove",
    tokenizer: Any = None,
) -> Tensor:
    """AOPC comprehensiveness: how much the target's probability drops when the top-k% tokens
    are deleted, averaged over k (DeYoung et al. 2020, ERASER, section 4.2). Higher is better.

    :math:`\\frac{1}{|K|} \\sum_{k \\in K} p(t \\mid x) - p(t \\mid x \\setminus r_k)`, with
    :math:`r_k` the :math:`\\lceil k m \\rceil` highest-attributed of the :math:`m` candidate
    tokens (real, not excluded) and :math:`K` = ``fractions`` (ERASER's 1, 5, 10, 20, 50%).
    Deleting means by default removing the tokens and closing the gap (the sequence gets
    shorter, its end padded with ``pad_token_id`` and attention mask 0), as ERASER does;
    ``deletion`` replaces them by a token instead.
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
        fractions, pad_token_id, softmax, deletion, tokenizer, keep_top=False,
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
    deletion: int | str = "remove",
    tokenizer: Any = None,
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
        fractions, pad_token_id, softmax, deletion, tokenizer, keep_top=True,
    )


def _aopc(
    forward_func, inputs, attributions, target, additional_forward_args, attention_mask, exclude,
    fractions, pad_token_id, softmax, deletion, tokenizer, keep_top,
) -> Tensor:
    fractions = check_fractions(fractions)
    with deleting(
        forward_func, inputs, attributions, target, additional_forward_args, attention_mask, exclude,
        deletion, tokenizer, pad_token_id, softmax,
    ) as tokens:
        full = tokens.score()
        # Sufficiency deletes every candidate but the top ones, comprehensiveness the top ones.
        total = sum(full - tokens.score(tokens.candidates & ~top if keep_top else top) for top in map(tokens.top, fractions))
    return total / len(fractions)
