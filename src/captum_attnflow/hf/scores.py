"""Class scores of a model for Captum: the forward function the baselines and AOPC explain."""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from captum_attnflow.functional.checks import as_mask
from captum_attnflow.hf.inputs import (
    as_tuple,
    check_mask_not_in_args,
    check_token_ids,
    lift_mask,
    mask_keyword,
    unpack_inputs,
)
from captum_attnflow.hf.models import check_device, main_model, owning_module


def class_scores(output: Any) -> Tensor:
    """Reduce a model output to its (B, C) class scores: ``.logits``, the first tuple item, or the tensor."""
    scores = getattr(output, "logits", None)
    if scores is None and isinstance(output, (tuple, list)) and output:
        scores = output[0]
    if scores is None and isinstance(output, Tensor):
        scores = output
    if not isinstance(scores, Tensor) or scores.dim() != 2:
        shape = tuple(scores.shape) if isinstance(scores, Tensor) else type(output).__name__
        raise ValueError(
            f"the model must return (B, C) class scores (e.g. a Hugging Face *ForSequenceClassification "
            f"model's logits), got {shape}. For a base model or a masked-LM, wrap it in a module that "
            "returns the scores to explain, e.g. logits[torch.arange(B), mask_position]."
        )
    return scores


def check_softmax_applies(scores: Tensor) -> None:
    """Refuse a softmax over (B, 1) scores, always 1: a regression or similarity output is
    measured as it is (``softmax=False``)."""
    if scores.shape[-1] == 1:
        raise ValueError(
            "the model returns one score per example (B, 1), whose softmax is always 1; it is not a class "
            "logit: pass softmax=False to measure the score itself (e.g. a similarity or a regression output)."
        )


def target_indices(
    target: Any, batch: int, device: Any = None, per_position: int | None = None, name: str = "target"
) -> Tensor:
    """``target`` as integer indices, checked the way Captum checks it: an int (or 0-d tensor)
    is the same index for every example; a list or 1-D tensor gives one per example and must
    have B entries; with ``per_position=S``, a (B, S) list or tensor gives one per example and
    explained position.

    Args:
        target: the user's target (not None).
        batch: B, the number of examples.
        device: where the indices go.
        per_position: S, the explained positions, when a (B, S) target is accepted; else None.
        name: the argument's name in error messages (``"contrast"`` for a contrast).

    Returns:
        Tensor: integer indices of shape (), (B,) or (B, S), not yet checked against the range.

    Raises:
        TypeError: a target that is not integer indices (text, bools, floats, too many axes).
        ValueError: a list or tensor with a length other than B (or a shape other than (B, S)).

    Example::

        >>> from captum_attnflow.hf.scores import target_indices
        >>> target_indices([1, 0], batch=2).tolist()
        [1, 0]
        >>> target_indices([0], batch=2)
        Traceback (most recent call last):
        ...
        ValueError: target has 1 entries for B = 2 examples: give one per example, or one int for all (target=0).
    """
    dims = 1 if per_position is None else 2
    if isinstance(target, (str, bool)):
        raise TypeError(f"{name} must be integer indices (an int, a list or a tensor), got {target!r}.")
    indices = torch.as_tensor(target, device=device)
    if indices.dtype.is_floating_point or indices.dtype.is_complex or indices.dtype == torch.bool or indices.dim() > dims:
        shapes = "one, or one per example (B,)" + (", or per example and position (B, S)" if dims == 2 else "")
        raise TypeError(f"{name} must be integer indices: {shapes}; got {target!r}.")
    if indices.dim() == 1 and indices.numel() != batch:
        example = f" ({name}={indices[0].item()})" if indices.numel() else ""
        raise ValueError(
            f"{name} has {indices.numel()} entries for B = {batch} examples: give one per example, "
            f"or one int for all{example}."
        )
    if indices.dim() == 2 and tuple(indices.shape) != (batch, per_position):
        raise ValueError(f"{name} as (B, S) must have shape ({batch}, {per_position}), got {tuple(indices.shape)}.")
    return indices


class ScoreForward:
    """``forward(inputs, attention_mask, *args) -> (B, C)`` for Captum, logits or probabilities.

    A Hugging Face model is called as ``model(inputs, *args, attention_mask=attention_mask)``;
    any other module or callable as ``forward_func(inputs, *args)``, with
    ``attention_mask=attention_mask`` added when its forward takes an argument of that name
    that ``args`` leave unfilled (else it gets no mask: put it in ``additional_forward_args``).
    The mask comes right after the inputs so that
    Captum expands it together with them when it batches perturbations or integration steps.
    """

    def __init__(self, forward_func: Callable[..., Any], probabilities: bool = False) -> None:
        if not callable(forward_func):
            raise TypeError(f"forward_func must be a model or a callable, got {type(forward_func).__name__}.")
        self.forward_func = forward_func
        self.probabilities = probabilities
        self.is_hf = isinstance(forward_func, PreTrainedModel)

    def __call__(self, inputs: Tensor, attention_mask: Tensor, *args: Any) -> Tensor:
        if self.is_hf:
            output = self.forward_func(inputs, *args, attention_mask=attention_mask)
        else:
            output = self.forward_func(inputs, *args, **mask_keyword(self.forward_func, args, attention_mask))
        scores = class_scores(output)
        if self.probabilities:
            check_softmax_applies(scores)
            return torch.softmax(scores.float(), dim=-1)
        return scores

    def prepare(
        self, inputs: Any, attention_mask: Tensor | None, additional_forward_args: Any
    ) -> tuple[Tensor, Tensor, tuple]:
        """Check the inputs and return ``(token ids (B, n), bool mask (B, n), Captum's
        additional_forward_args: the long mask, then the user's)``. ``inputs`` may be the
        tokenizer's output."""
        inputs, attention_mask = unpack_inputs(inputs, attention_mask)
        check_token_ids(inputs, self.forward_func)
        check_device(self.forward_func, inputs)
        args, attention_mask = lift_mask(self.forward_func, as_tuple(additional_forward_args), attention_mask)
        check_mask_not_in_args(self.forward_func, args, attention_mask)
        mask = as_mask(attention_mask, inputs.shape[0], inputs.shape[1], inputs.device)
        return inputs, mask, (mask.long(), *args)

    def target(self, inputs: Tensor, extra_args: tuple, target: Any) -> Any:
        """Captum's ``target``, checked: None means each example's predicted class (argmax of
        the scores); an int, a list or a (B,) tensor of class indices must be in range."""
        if isinstance(target, str):
            raise TypeError(
                f"target must be a class index (int, list or (B,) tensor), got {target!r}; "
                "map a label name with model.config.label2id[name]."
            )
        if target is None:
            with torch.no_grad():
                return self(inputs, *extra_args).argmax(-1)
        indices = target_indices(target, inputs.shape[0])
        classes = self._num_classes(inputs, extra_args)
        if bool(((indices < 0) | (indices >= classes)).any()):
            raise ValueError(
                f"target {indices.tolist()} is out of range: the model scores C = {classes} classes, 0..{classes - 1}."
            )
        return target

    def contrastive(self, inputs: Tensor, extra_args: tuple, contrast: Any) -> tuple[Callable[..., Tensor], tuple]:
        """Captum's forward function and ``additional_forward_args`` for ``contrast``: ``(self,
        extra_args)`` for None; else a forward returning each row's scores minus its contrast
        class's score, so that Captum's ``target`` selects :math:`y_t - y_c` (Yin & Neubig,
        EMNLP 2022). The (B,) contrast classes travel in the arguments (after the mask), which
        Captum expands together with the inputs for its perturbations and integration steps.

        Example::

            >>> import torch
            >>> forward = ScoreForward(lambda ids, attention_mask=None: ids.float())
            >>> ids = torch.tensor([[1, 4, 2]])
            >>> contrasted, args = forward.contrastive(ids, (torch.ones_like(ids),), 2)
            >>> contrasted(ids, *args)
            tensor([[-1.,  2.,  0.]])
        """
        if contrast is None:
            return self, extra_args
        indices = torch.as_tensor(self.target(inputs, extra_args, contrast), device=inputs.device)
        indices = indices.reshape(-1).expand(inputs.shape[0]).contiguous()
        return _Contrasted(self), (extra_args[0], indices, *extra_args[1:])

    def _num_classes(self, inputs: Tensor, extra_args: tuple) -> int:
        """C: ``config.num_labels`` of a Hugging Face model (one returning (B, C) logits is a
        sequence classifier), else from a forward pass on the first example."""
        labels = getattr(getattr(self.forward_func, "config", None), "num_labels", None) if self.is_hf else None
        if isinstance(labels, int):
            return labels
        first = tuple(arg[:1] if isinstance(arg, Tensor) and arg.shape[:1] == inputs.shape[:1] else arg for arg in extra_args)
        with torch.no_grad():
            return self(inputs[:1], *first).shape[-1]


class _Contrasted:
    """``forward(inputs, mask, contrast (B,), *args)``: the scores minus each row's contrast column."""

    def __init__(self, scores: ScoreForward) -> None:
        self.scores = scores

    def __call__(self, inputs: Tensor, attention_mask: Tensor, contrast: Tensor, *args: Any) -> Tensor:
        scores = self.scores(inputs, attention_mask, *args)
        return scores - scores.gather(-1, contrast.to(scores.device)[:, None])


def input_embeddings(forward_func: Any) -> nn.Module:
    """The token embedding layer: ``get_input_embeddings()`` of the model, or of the outermost
    Hugging Face model inside a wrapping module."""
    getter = getattr(forward_func, "get_input_embeddings", None)
    if getter is None:
        model = main_model(forward_func)
        getter = model.get_input_embeddings if model is not None else None
    layer = getter() if getter is not None else None
    if not isinstance(layer, nn.Module):
        raise ValueError(
            f"cannot find the token embedding layer of {type(forward_func).__name__}: it has no "
            "get_input_embeddings() and contains no Hugging Face model; pass embedding_layer=model.<embeddings>."
        )
    return _called_twin(getattr(getter, "__self__", None), layer)


def _called_twin(model: nn.Module | None, layer: nn.Module) -> nn.Module:
    """The module the forward calls in place of ``layer``: T5's encoder-only model returns its
    ``shared`` embedding, but its forward calls ``encoder.embed_tokens``, another module holding
    the same weight, so a hook on ``shared`` would never run."""
    twin = getattr(getattr(model, "encoder", None), "embed_tokens", None)
    if (isinstance(twin, nn.Module) and twin is not layer and getattr(model, "decoder", None) is None
            and getattr(twin, "weight", None) is getattr(layer, "weight", object())):
        return twin
    return layer


def token_id(forward_func: Any, token: int | str, tokenizer: Any = None, argument: str = "token") -> int:
    """Turn ``token`` (an id, or ``"unk"``, ``"pad"``, ``"mask"``) into a token id.

    Names are looked up as ``<name>_token_id`` on ``tokenizer``, then on the model's config;
    ``argument`` is the caller's argument name, which the error message tells the user to set.
    """
    if isinstance(token, int) and not isinstance(token, bool):
        return token
    if token not in ("unk", "pad", "mask"):
        raise ValueError(f'{argument} must be a token id or one of "unk", "pad", "mask", got {token!r}.')
    name = f"{token}_token_id"
    config = getattr(owning_module(forward_func) or forward_func, "config", None)
    for source in (tokenizer, config):
        value = getattr(source, name, None) if source is not None else None
        if isinstance(value, int):
            return value
    where = "the model's config" + (" or the tokenizer" if tokenizer is not None else "")
    raise ValueError(
        f"cannot find the {token} token id: {where} has no {name}; pass the id itself, "
        f"e.g. {argument}=tokenizer.convert_tokens_to_ids('[{token.upper()}]')."
    )


def output_scores(output: Any) -> Any:
    """The scores in a model's output: ``.logits``, the first item of a tuple, or the output itself."""
    scores = getattr(output, "logits", None)
    if scores is None:
        scores = output[0] if isinstance(output, (tuple, list)) and output else output
    return scores


def target_scores(output: Any, target: Any, positions: Tensor, contrast: Any = None) -> Tensor:
    """(B, S) the scalars a gradient-based method explains, from a model's ``output`` (in autograd).

    * (B, C) class scores (a classifier's ``logits``): the score of class ``target`` (an int,
      or one per example as a list or (B,) tensor; None: each example's predicted class), the
      same for each of the S explained positions;
    * (B, n, V) token logits (a language model): the logit of token ``target`` at each
      explained position, the next-token prediction it makes (an int, (B,) or (B, S) token ids;
      None: the token predicted there);
    * (B,) scores (any scalar of a forward function): those, ``target`` must be None.

    With a ``contrast`` (the same forms as ``target``) the explained scalar is contrastive
    (Yin & Neubig, EMNLP 2022): :math:`y_t - y_c`, why the model scores ``target`` *rather
    than* ``contrast``. Every method selecting its score here takes ``contrast=``.

    Args:
        output: the model's output (``.logits``, a tensor, or a tuple whose first item is one).
        target: as above.
        positions: (B, S) the explained positions (rows of the token logits).
        contrast: None (default), or indices as ``target`` whose scores are subtracted.

    Raises:
        TypeError: a non-integer target or contrast.
        ValueError: a target or contrast out of range, of the wrong shape, or given for (B,) scores.

    Example::

        >>> import torch
        >>> logits = torch.tensor([[1.0, 4.0, 2.0]])
        >>> target_scores(logits, 1, torch.zeros(1, 1, dtype=torch.long), contrast=2)
        tensor([[2.]])
    """
    scores = output_scores(output)
    if not isinstance(scores, Tensor) or scores.dim() not in (1, 2, 3):
        raise ValueError(
            "the model must return (B,) scores, (B, C) class scores or (B, n, V) token logits to explain, got "
            f"{tuple(scores.shape) if isinstance(scores, Tensor) else type(output).__name__}; wrap it in a module "
            "returning the score to explain."
        )
    batch, count = positions.shape
    if scores.dim() == 1:
        for name, value in (("target", target), ("contrast", contrast)):
            if value is not None:
                raise ValueError(f"the model returns one score per example (B,): there is nothing to select, pass {name}=None.")
        return scores[:, None].expand(batch, count)
    kind = "tokens" if scores.dim() == 3 else "classes"
    if scores.dim() == 3:
        scores = scores[torch.arange(batch, device=scores.device)[:, None], positions.to(scores.device)]  # (B, S, V)
    else:
        scores = scores[:, None].expand(batch, count, scores.shape[-1])
    indices = scores.detach().argmax(-1) if target is None else _indices(target, scores, kind, "target")
    selected = scores.gather(-1, indices[..., None]).squeeze(-1)
    if contrast is None:
        return selected
    return selected - scores.gather(-1, _indices(contrast, scores, kind, "contrast")[..., None]).squeeze(-1)


def _indices(target: Any, scores: Tensor, kind: str, name: str) -> Tensor:
    """(B, S) checked indices into the last axis of (B, S, C) ``scores`` from one index, (B,) or (B, S)."""
    batch, count = scores.shape[:2]
    indices = target_indices(target, batch, scores.device, per_position=count, name=name)
    if bool(((indices < 0) | (indices >= scores.shape[-1])).any()):
        raise ValueError(
            f"{name} {indices.tolist()} is out of range: the model scores {scores.shape[-1]} "
            f"{kind}, 0..{scores.shape[-1] - 1}."
        )
    return (indices.reshape(-1, 1) if indices.dim() < 2 else indices).expand(batch, count)


def kept_logits(forward_func: Callable[..., Any], run_positions: Tensor | None) -> Tensor | None:
    """The positions of a run whose logits a Hugging Face language model need compute to score
    ``run_positions`` (B, S): sorted, 1-D, its ``logits_to_keep`` (the (B, n, V) logits and
    their gradient cost 8 GB at Llama-3's vocabulary and n = 16384). None where the positions
    are unknown or ``forward_func`` takes no ``logits_to_keep``: all logits are computed."""
    if run_positions is None or not isinstance(forward_func, PreTrainedModel):
        return None
    if "logits_to_keep" not in inspect.signature(forward_func.forward).parameters:
        return None
    return run_positions.unique()


def kept_in(output: Any, kept: Tensor | None) -> Tensor | None:
    """``kept`` if the language model's ``output`` holds the logits of those positions alone,
    None if it computed every position's (a model that takes ``logits_to_keep`` but reads it
    otherwise): what :func:`logit_rows` then needs."""
    scores = output_scores(output)
    if kept is None or not isinstance(scores, Tensor) or scores.dim() != 3 or scores.shape[1] == kept.numel():
        return kept
    return None


def logit_rows(kept: Tensor | None, run_positions: Tensor) -> Tensor:
    """The rows of a run's logits (B, S) holding ``run_positions`` (B, S), when that run
    computed the logits of the positions ``kept`` alone (:func:`kept_logits`; None: all)."""
    return run_positions if kept is None else torch.searchsorted(kept, run_positions)
