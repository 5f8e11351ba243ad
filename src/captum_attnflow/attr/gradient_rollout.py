"""Gradient-weighted attention rollout (Chefer, Gur & Wolf, ICCV 2021) as a Captum attribution."""

from __future__ import annotations

from typing import Any

import torch
from captum.attr import GradientAttribution
from torch import Tensor

from captum_attnflow.attr._base import AttentionAttribution, with_internals_args
from captum_attnflow.functional.checks import as_mask, default_position, layer_indices, positions
from captum_attnflow.functional.gradient_rollout import encoder_decoder_relevance, gradient_weighted_rollout
from captum_attnflow.hf import output_scores, seq2seq_gradient_internals, target_scores
from captum_attnflow.hf.internals import Internals, capture_internals


_TARGET_DOC = """
            target (int, list or Tensor, optional): the explained score, as in Captum. For a
                classifier's (B, C) logits the class (one index, or one per example as a list
                or (B,) tensor); for a language model's (B, n, V) logits the token whose logit
                is explained at each explained position (its next-token prediction): one id,
                (B,) or (B, S); for a forward function returning (B,) scores, None. None
                (default): the predicted class, or the predicted token at each position."""


class GradientWeightedRollout(AttentionAttribution, GradientAttribution):
    """Gradient-weighted attention rollout (Chefer, Gur & Wolf, ICCV 2021, equations 5-6).

    Each layer's attention probabilities :math:`A_l` (B, H, n, n) are weighted by the gradient
    of the explained score :math:`y_t` with respect to them, negative evidence removed, heads
    averaged, and rolled out with the identity for the residual:

    .. math::
        \\bar A_l = \\mathbb{E}_h\\big[(\\nabla A_l \\odot A_l)^+\\big], \\quad
        \\nabla A_l = \\frac{\\partial y_t}{\\partial A_l}, \\qquad
        R_0 = I, \\quad R_l = R_{l-1} + \\bar A_l R_{l-1}.

    The attribution of token j for ``position`` p after ``layer`` l is :math:`R_l[p, j]`, not
    normalised (as the paper defines it; the position's own entry includes the identity's 1).
    Unlike rollout and flow it is class-specific: ``target`` picks the score. The model runs
    once forward and once backward, with its own eager attention (the probabilities the
    gradient is taken of are the ones it multiplies with its values), on any model whose
    attention goes through transformers' attention-function interface; its parameters'
    ``.grad`` are not touched. The maths is :func:`captum_attnflow.functional.gradient_weighted_rollout`.

    Args:
        forward_func: a Hugging Face model (classifier, language model, vision transformer), or
            a module containing one that returns the score to explain. The model is left as it
            was: attention implementation, mode and hooks change only for the call.
    """

    def __init__(self, forward_func: Any) -> None:
        AttentionAttribution.__init__(self, forward_func)

    @property
    def multiplies_by_inputs(self) -> bool:
        return False

    @with_internals_args(_TARGET_DOC)
    def attribute(
        self,
        inputs: Tensor,
        target: Any = None,
        additional_forward_args: Any = None,
        position: int | list[int] | Tensor | None = None,
        layer: int | None = -1,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """Gradient-weighted rollout of ``position`` after ``layer`` for the score ``target``.
{args}

        Returns:
            Tensor: float32 {shapes} Padding gets 0.

        Example::

            >>> from captum_attnflow import GradientWeightedRollout, load_agreement_model
            >>> model, tokenizer = load_agreement_model()
            >>> ids = tokenizer(["the keys to the cabinet"], return_tensors="pt")["input_ids"]
            >>> scores = GradientWeightedRollout(model).attribute(ids, target=1)  # plural, from [CLS]
            >>> scores.shape
            torch.Size([1, 6])
        """
        inputs, args, attention_mask, _ = self._checked_inputs(inputs, additional_forward_args, attention_mask)
        internals = capture_internals(self.forward_func, inputs, args, attention_mask, gradients=True)
        probabilities = internals.probabilities
        if any(p.shape[-1] != p.shape[-2] for p in probabilities):
            raise ValueError(
                "GradientWeightedRollout explains self-attention; this model also ran cross-attention "
                "(an encoder-decoder): explain its encoder or decoder alone."
            )
        batch, _, n, _ = probabilities[0].shape
        # The maths runs on the inputs' device, where the layers of a dispatched model come together.
        mask = as_mask(attention_mask, batch, n, inputs.device)
        if position is None:
            causal = all(not bool(p.detach().triu(1).any()) for p in probabilities)
            position = default_position(mask, causal)
        sources, has_axis = positions(position, mask)
        scores = target_scores(internals.output, target, internals.run_positions(sources))
        attentions = [_in_order(internals, p.detach().to(inputs.device)) for p in probabilities]
        # A language model's positions each predict their own token: one gradient per position,
        # several at once (one batched backward per chunk); a classifier's score is one for all.
        count = sources.shape[1] if output_scores(internals.output).dim() == 3 else 1
        chunk = max(1, _GRADIENT_NUMBERS // sum(p.numel() for p in probabilities))
        rows = []
        for start in range(0, count, chunk):
            for explained, gradients in _gradients(scores, probabilities, start, min(count, start + chunk), count):
                gradients = [_in_order(internals, g.to(inputs.device)) for g in gradients]
                rows.append(gradient_weighted_rollout(attentions, gradients, sources[:, explained], layer, mask))
        result = torch.cat(rows, -2)
        return (result if has_axis else result.squeeze(-2)).to(inputs.device)


    def encoder_decoder_rows(
        self,
        input_ids: Tensor,
        decoder_input_ids: Tensor,
        target: Tensor,
        layer: int | None = -1,
        attention_mask: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
    ) -> Tensor:
        """Relevance of every decoder position of an encoder-decoder (T5, BART, ...) with Chefer et
        al.'s co-attention rules (:func:`~captum_attnflow.functional.gradient_rollout.encoder_decoder_relevance`),
        each position t explained for its own score, the logit of ``target[:, t]``.

        Args:
            input_ids: (B, n_s) source token ids; ``attention_mask`` (B, n_s) marks their padding.
            decoder_input_ids: (B, m) the decoder's inputs (start token, then the target tokens
                before each predicted one); ``decoder_attention_mask`` (B, m) their padding.
            target: (B, m) the token each decoder position predicts.
            layer: the decoder layer (1..L_d, negative from the top), None for all.

        Returns:
            float32 (B, m, n_s + m), (L_d, B, m, n_s + m) for ``layer=None``: row t over the
            source tokens, then over the decoder's input tokens; padding 0.
        """
        internals, kinds = seq2seq_gradient_internals(
            self.forward_func, input_ids, decoder_input_ids, attention_mask, decoder_attention_mask
        )
        probabilities = internals.probabilities
        scores = output_scores(internals.output)
        scores = scores.gather(-1, target[..., None].to(scores.device)).squeeze(-1)
        layers = layer_indices(layer, kinds.count("cross"))
        count = decoder_input_ids.shape[1]
        chunk = max(1, _GRADIENT_NUMBERS // sum(p.numel() for p in probabilities))
        rows = []
        for start in range(0, count, chunk):
            for position, gradients in _gradients(scores, probabilities, start, min(count, start + chunk), count):
                pairs = {
                    kind: (
                        [p.detach().to(input_ids.device) for p, k in zip(probabilities, kinds) if k == kind],
                        [g.to(input_ids.device) for g, k in zip(gradients, kinds) if k == kind],
                    )
                    for kind in ("encoder", "decoder", "cross")
                }
                relevance = encoder_decoder_relevance(
                    pairs["encoder"], pairs["decoder"], pairs["cross"], attention_mask, decoder_attention_mask
                )
                rows.append(relevance[layers, :, position])
        result = torch.cat(rows, -2)  # (layers, B, m, n_s + m)
        return result[0] if layer is not None else result


def _gradients(
    scores: Tensor, probabilities: list[Tensor], start: int, stop: int, count: int
) -> list[tuple[slice, tuple[Tensor, ...]]]:
    """``(positions, gradients of their score)`` for the explained positions start..stop of
    ``count``: one slice of all S positions when ``count`` is 1 (a classifier's one score), else
    each position's own, from one batched backward (``is_grads_batched``)."""
    last = stop == count
    if count == 1:
        return [(slice(None), torch.autograd.grad(scores[:, 0].sum(), probabilities))]
    selector = torch.zeros(stop - start, *scores.shape, device=scores.device)
    selector[torch.arange(stop - start), :, torch.arange(start, stop)] = 1.0
    batched = torch.autograd.grad(scores, probabilities, grad_outputs=selector, is_grads_batched=True, retain_graph=not last)
    return [(slice(start + k, start + k + 1), tuple(g[k] for g in batched)) for k in range(stop - start)]


# Gradients of this many numbers (all layers' probabilities, one copy per explained position)
# are computed in one batched backward.
_GRADIENT_NUMBERS = 2**27


def _in_order(internals: Internals, layer: Tensor) -> Tensor:
    """One layer's (B, H, n, n) maps in the inputs' token order."""
    return internals.in_inputs_order(layer.transpose(0, 1)).transpose(0, 1)
