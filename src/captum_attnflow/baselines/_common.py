"""What the gradient baselines share: Captum's layer methods on the token embedding layer, their
(B, n, d) scores reduced to one per token, and the docstring pieces of all baselines.

Every baseline explains a (B, C) class score (:class:`captum_attnflow.hf.ScoreForward`): a
Hugging Face model's ``logits``, or whatever (B, C) tensor a plain ``nn.Module`` or callable
returns. The model runs in eval mode for the call, alone, and is restored afterwards.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

from captum.attr import GradientAttribution, LayerGradientXActivation
from torch import Tensor, nn

from captum_attnflow.docstrings import fill_docstring
from captum_attnflow.hf import ScoreForward, input_embeddings, model_call


def reduce_embedding_scores(scores: Tensor, mask: Tensor, reduce: str) -> Tensor:
    """(B, n, d) per-dimension scores to (B, n) per token: L2 norm over d or the sum; padding gets 0."""
    if scores.dim() != 3:
        raise ValueError(f"expected (B, n, d) embedding scores from the embedding layer, got {tuple(scores.shape)}.")
    tokens = scores.float().norm(dim=-1) if check_reduce(reduce) == "norm" else scores.float().sum(dim=-1)
    return tokens * mask


def run_captum(
    scores: ScoreForward,
    captum_method: Callable[[Callable[..., Tensor]], Any],
    inputs: Tensor,
    extra_args: tuple,
    target: Any,
    contrast: Any,
    /,
    **attribute_args: Any,
) -> Any:
    """Captum's ``captum_method(forward).attribute(inputs, target=..., additional_forward_args=...,
    **attribute_args)`` on the scores of a baseline: the model in eval mode and alone for the call
    (restored afterwards), ``target`` None taken as each example's predicted class, and
    ``forward`` returning the target's score minus ``contrast``'s when one is given.
    ``inputs`` and ``extra_args`` are what :meth:`ScoreForward.prepare` returned."""
    with model_call(scores.forward_func):
        target = scores.target(inputs, extra_args, target)
        forward, extra_args = scores.contrastive(inputs, extra_args, contrast)
        return captum_method(forward).attribute(inputs, target=target, additional_forward_args=extra_args, **attribute_args)


def check_reduce(reduce: str) -> str:
    if reduce not in ("norm", "sum"):
        raise ValueError(f'reduce must be "norm" (L2 norm over the embedding) or "sum", got {reduce!r}.')
    return reduce


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
class EmbeddingGradientAttribution(GradientAttribution):
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

    def _tokens(self, embedding_scores: Any, mask: Tensor, inputs: Tensor) -> Tensor:
        return reduce_embedding_scores(embedding_scores.detach(), mask, self.reduce).to(inputs.device)

    def _embedding_gradients(
        self,
        inputs: Any,
        target: Any,
        additional_forward_args: Any,
        attention_mask: Tensor | None,
        contrast: Any,
    ) -> Tensor:
        """(B, n) token scores from Captum's ``LayerGradientXActivation`` on the embedding layer:
        the plain gradient :math:`\\partial f_t / \\partial e_i` where the class does not
        multiply by inputs (:attr:`multiplies_by_inputs` False), else
        :math:`e_i \\odot \\partial f_t / \\partial e_i`, reduced per token."""
        inputs, mask, extra_args = self.scores.prepare(inputs, attention_mask, additional_forward_args)
        method = partial(LayerGradientXActivation, layer=self.embedding_layer, multiply_by_inputs=self.multiplies_by_inputs)
        gradients = run_captum(self.scores, method, inputs, extra_args, target, contrast)
        return self._tokens(gradients, mask, inputs)


_TOKEN_ARGS_DOC = """
        Args:
            inputs (Tensor or BatchEncoding): token ids, shape (B, n), or the tokenizer's
                output (its ``input_ids`` and ``attention_mask`` are used).
            target (int, list or Tensor, optional): the explained class, as in Captum: one
                index for all examples, or a (B,) tensor / list with one per example. None
                (default) explains each example's predicted class, the argmax of the model's
                scores on ``inputs``.
            additional_forward_args (Any, optional): extra positional arguments passed to
                the model after ``inputs``.
            attention_mask (Tensor, optional): (B, n), 1 on real tokens, 0 on padding. It is
                passed to a Hugging Face model as ``attention_mask``; padding gets
                attribution 0.
            contrast (int, list or Tensor, optional): a contrastive explanation (Yin & Neubig,
                EMNLP 2022): the explained score is the target's minus this class's,
                :math:`f_t - f_c`, why ``target`` rather than ``contrast``; the same forms as
                ``target``. None (default): the target's score alone."""

_TOKEN_RETURNS_DOC = """Returns:
            Tensor: float32 (B, n) on the inputs' device, padding 0."""

# Fills ``{args}`` and ``{returns}`` in a baseline's ``attribute`` docstring.
with_token_args = fill_docstring(args=_TOKEN_ARGS_DOC, returns=_TOKEN_RETURNS_DOC)
