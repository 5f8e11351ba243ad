"""Plumbing shared by the token-level baselines: model output to class scores, targets, embeddings.

Every baseline explains a (B, C) class score: a Hugging Face model's ``logits`` (its
``ModelOutput`` is reduced to them), or whatever (B, C) tensor a plain ``nn.Module`` or
callable returns. The forward function handed to Captum has the signature
``forward(inputs, attention_mask, *additional_forward_args)`` so that Captum expands the
mask together with the inputs when it batches perturbations or integration steps.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from captum.attr import Attribution, LayerGradientXActivation
from torch import Tensor, nn

from captum_attnflow._docstrings import fill_docstring
from captum_attnflow.extraction import _as_tuple, _check_device, _hf_models, _outermost, _owning_module
from captum_attnflow.functional._checks import as_mask

try:  # transformers is a dependency, but keep the callable path usable without it
    from transformers import PreTrainedModel
except ImportError:  # pragma: no cover
    PreTrainedModel = ()  # type: ignore[assignment,misc]


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


class ScoreForward:
    """``forward(inputs, attention_mask, *args) -> (B, C)`` for Captum, logits or probabilities.

    A Hugging Face model is called as ``model(inputs, *args, attention_mask=attention_mask)``;
    any other module or callable as ``forward_func(inputs, *args)`` (it gets no mask: put it in
    ``additional_forward_args`` if it needs one).
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
            output = self.forward_func(inputs, *args)
        scores = class_scores(output)
        return torch.softmax(scores.float(), dim=-1) if self.probabilities else scores


def check_token_ids(inputs: Any) -> Tensor:
    if not isinstance(inputs, Tensor):
        raise TypeError(f"inputs must be a tensor of token ids (B, n), got {type(inputs).__name__}.")
    if inputs.dim() != 2 or inputs.shape[1] == 0:
        raise ValueError(
            f"inputs must be token ids of shape (B, n) with n >= 1, got shape {tuple(inputs.shape)}; "
            "for one sentence use inputs.unsqueeze(0)."
        )
    if inputs.dtype.is_floating_point or inputs.dtype == torch.bool:
        raise TypeError(f"inputs must be integer token ids, got dtype {inputs.dtype}.")
    return inputs


def prepare(
    forward: ScoreForward, inputs: Tensor, attention_mask: Tensor | None, additional_forward_args: Any
) -> tuple[Tensor, Tensor, tuple]:
    """Check the inputs and return ``(bool mask (B, n), long mask for the model, Captum's extra args)``."""
    check_token_ids(inputs)
    module = _owning_module(forward.forward_func)
    if module is not None:
        _check_device(module, inputs)
    mask = as_mask(attention_mask, inputs.shape[0], inputs.shape[1], inputs.device)
    model_mask = mask.long()
    return mask, model_mask, (model_mask, *_as_tuple(additional_forward_args))


def resolve_target(forward: ScoreForward, inputs: Tensor, extra_args: tuple, target: Any) -> Any:
    """Captum's ``target``, with None meaning each example's predicted class (argmax of the scores)."""
    if target is not None:
        return target
    with torch.no_grad():
        return forward(inputs, *extra_args).argmax(-1)


def input_embeddings(forward_func: Any) -> nn.Module:
    """The token embedding layer: ``get_input_embeddings()`` of the model, or of the outermost
    Hugging Face model inside a wrapping module."""
    getter = getattr(forward_func, "get_input_embeddings", None)
    if getter is None:
        module = _owning_module(forward_func)
        models = _outermost(_hf_models(module)) if module is not None else []
        getter = models[0].get_input_embeddings if models else None
    layer = getter() if getter is not None else None
    if not isinstance(layer, nn.Module):
        raise ValueError(
            f"cannot find the token embedding layer of {type(forward_func).__name__}: it has no "
            "get_input_embeddings() and contains no Hugging Face model; pass embedding_layer=model.<embeddings>."
        )
    return layer


def reduce_embedding_scores(scores: Tensor, mask: Tensor, reduce: str) -> Tensor:
    """(B, n, d) per-dimension scores to (B, n) per token: L2 norm over d or the sum; padding gets 0."""
    if scores.dim() != 3:
        raise ValueError(f"expected (B, n, d) embedding scores from the embedding layer, got {tuple(scores.shape)}.")
    tokens = scores.float().norm(dim=-1) if check_reduce(reduce) == "norm" else scores.float().sum(dim=-1)
    return tokens * mask


def check_reduce(reduce: str) -> str:
    if reduce not in ("norm", "sum"):
        raise ValueError(f'reduce must be "norm" (L2 norm over the embedding) or "sum", got {reduce!r}.')
    return reduce


def token_id(forward_func: Any, token: int | str, tokenizer: Any = None) -> int:
    """Turn ``token`` (an id, or ``"unk"``, ``"pad"``, ``"mask"``) into a token id.

    Names are looked up as ``<name>_token_id`` on ``tokenizer``, then on the model's config.
    """
    if isinstance(token, int) and not isinstance(token, bool):
        return token
    if token not in ("unk", "pad", "mask"):
        raise ValueError(f'token must be a token id or one of "unk", "pad", "mask", got {token!r}.')
    name = f"{token}_token_id"
    config = getattr(_owning_module(forward_func) or forward_func, "config", None)
    for source in (tokenizer, config):
        value = getattr(source, name, None) if source is not None else None
        if isinstance(value, int):
            return value
    raise ValueError(
        f"cannot find the {token} token id: pass tokenizer=<your tokenizer> or the id itself, "
        f"e.g. token=tokenizer.convert_tokens_to_ids('[UNK]')."
    )


_EMBEDDING_CONSTRUCTOR_DOC = """Args:
        forward_func: a Hugging Face model returning logits (e.g. ``*ForSequenceClassification``),
            or an ``nn.Module`` / callable ``forward_func(inputs, *additional_forward_args)``
            returning (B, C) class scores.
        reduce: ``"norm"`` (default) for the L2 norm of each token's embedding scores,
            ``"sum"`` for their sum (signed).
        probabilities: explain the softmax probability of the target class instead of its
            logit (the default, as Captum does with a classifier's output).
        embedding_layer: the module whose output are the token embeddings; default
            ``get_input_embeddings()`` of the model (or of the Hugging Face model inside it)."""

# Fills ``{init}`` in the class docstring of a gradient baseline with the constructor's arguments.
with_embedding_constructor_args = fill_docstring(init=_EMBEDDING_CONSTRUCTOR_DOC)


@with_embedding_constructor_args
class EmbeddingGradientAttribution(Attribution):
    """Base of the gradient baselines: a Captum layer method on the token embedding layer,
    its (B, n, d) scores reduced per token.

    {init}
    """

    def __init__(
        self,
        forward_func: Callable[..., Any],
        reduce: str = "norm",
        probabilities: bool = False,
        embedding_layer: nn.Module | None = None,
    ) -> None:
        self.scores = ScoreForward(forward_func, probabilities)
        super().__init__(self.scores)
        self.reduce = check_reduce(reduce)
        self.embedding_layer = embedding_layer if embedding_layer is not None else input_embeddings(forward_func)

    def has_convergence_delta(self) -> bool:
        """False: no convergence delta is returned (Captum's interface)."""
        return False

    def _prepare(
        self, inputs: Tensor, target: Any, additional_forward_args: Any, attention_mask: Tensor | None
    ) -> tuple[Tensor, tuple, Any]:
        """Return ``(bool mask (B, n), Captum's additional_forward_args, resolved target)``."""
        mask, _, extra_args = prepare(self.scores, inputs, attention_mask, additional_forward_args)
        return mask, extra_args, resolve_target(self.scores, inputs, extra_args, target)

    def _tokens(self, embedding_scores: Any, mask: Tensor, inputs: Tensor) -> Tensor:
        return reduce_embedding_scores(embedding_scores.detach(), mask, self.reduce).to(inputs.device)

    def _embedding_gradients(
        self,
        inputs: Tensor,
        target: Any,
        additional_forward_args: Any,
        attention_mask: Tensor | None,
        multiply_by_inputs: bool,
    ) -> Tensor:
        """(B, n) token scores from Captum's ``LayerGradientXActivation`` on the embedding layer:
        the plain gradient :math:`\\partial f_t / \\partial e_i` (``multiply_by_inputs=False``)
        or :math:`e_i \\odot \\partial f_t / \\partial e_i` (True), reduced per token."""
        mask, extra_args, target = self._prepare(inputs, target, additional_forward_args, attention_mask)
        method = LayerGradientXActivation(self.scores, self.embedding_layer, multiply_by_inputs=multiply_by_inputs)
        gradients = method.attribute(inputs, target=target, additional_forward_args=extra_args)
        return self._tokens(gradients, mask, inputs)


_TOKEN_ARGS_DOC = """
        Args:
            inputs (Tensor): token ids, shape (B, n).
            target (int, list or Tensor, optional): the explained class, as in Captum: one
                index for all examples, or a (B,) tensor / list with one per example. None
                (default) explains each example's predicted class, the argmax of the model's
                scores on ``inputs``.
            additional_forward_args (Any, optional): extra positional arguments passed to
                the model after ``inputs``.
            attention_mask (Tensor, optional): (B, n), 1 on real tokens, 0 on padding. It is
                passed to a Hugging Face model as ``attention_mask``; padding gets
                attribution 0."""

_TOKEN_RETURNS_DOC = """Returns:
            Tensor: float32 (B, n) on the inputs' device, padding 0."""

# Fills ``{args}`` and ``{returns}`` in a baseline's ``attribute`` docstring.
with_token_args = fill_docstring(args=_TOKEN_ARGS_DOC, returns=_TOKEN_RETURNS_DOC)
