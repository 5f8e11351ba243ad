"""Gradient-weighted attention rollout (Chefer, Gur & Wolf, ICCV 2021) as a Captum attribution."""

from __future__ import annotations

import functools
from typing import Any, Iterable, Iterator

import torch
from captum.attr import GradientAttribution
from torch import Tensor

from captum_attnflow.attr._base import (
    AttentionAttribution,
    as_returned,
    explained_positions,
    given_positions,
    pooled_rows,
    progress_bar,
    with_internals_args,
    with_recompute_args,
)
from captum_attnflow.capture import seq2seq_gradient_internals
from captum_attnflow.capture.attention_gradients import (
    GRADIENT_MODEL_TYPES,
    AttentionCall,
    AttentionGradients,
    attention_gradients_run,
    capture_attention_gradients,
    supports_attention_gradients,
)
from captum_attnflow.capture.internals import Internals, capture_internals
from captum_attnflow.capture.maps import in_run_order
from captum_attnflow.capture.recompute import recomputes
from captum_attnflow.capture.seq2seq import attention_kinds
from captum_attnflow.functional.checks import as_mask, layer_indices
from captum_attnflow.functional.gradient_rollout import (
    RowWalk,
    co_attention_relevance,
    encoder_decoder_relevance,
    gradient_weighted_rollout,
)
from captum_attnflow.hf import output_scores, target_scores
from captum_attnflow.hf.models import owning_module


_TARGET_DOC = """
            target (int, list or Tensor, optional): the explained score, as in Captum. For a
                classifier's (B, C) logits the class (one index, or one per example as a list
                or (B,) tensor); for a language model's (B, n, V) logits the token whose logit
                is explained at each explained position (its next-token prediction): one id,
                (B,) or (B, S); for a forward function returning (B,) scores, None. None
                (default): the predicted class, or the predicted token at each position.
            contrast (int, list or Tensor, optional): a contrastive explanation (Yin & Neubig,
                EMNLP 2022): the explained score is the target's minus this index's,
                :math:`y_t - y_c`, in the same forms as ``target``. None (default): the
                target's score alone."""


@with_recompute_args
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
    once forward and, per explained score, once backward (to the attention outputs only: no
    parameter's gradient is computed and ``.grad`` is not touched), on any model whose attention
    goes through transformers' attention-function interface. The maths is
    :func:`captum_attnflow.functional.gradient_weighted_rollout`.

    On the model types of :data:`~captum_attnflow.capture.attention_gradients.GRADIENT_MODEL_TYPES`
    (``lean``, the default) the model keeps its own attention implementation (``sdpa``) and each
    layer's :math:`\\bar A_l` is computed from what the backward pass has: the queries, keys and
    values and the gradient :math:`\\nabla O` of the attention output, since
    :math:`\\partial y_t / \\partial A_h = \\nabla O_h V_h^\\top` and :math:`A_h` is recomputed
    from :math:`q k^\\top`, in blocks of rows
    (:mod:`~captum_attnflow.capture.attention_gradients`): no (H, n, n) tensor is ever whole, and of
    one explained layer the rows are rolled out top-down without any (n, n) matrix. Memory is
    that of one backward pass. Other models (or ``lean=False``, or a model whose attention call
    carries a score term its queries, keys and mask do not hold) run eager attention and keep
    every layer's probabilities and their gradients, 2·L·H·n² numbers; both agree to 1e-5.

    Args:
        forward_func: a Hugging Face model (classifier, language model, vision transformer), or
            a module containing one that returns the score to explain. The model is left as it
            was: attention implementation, mode and hooks change only for the call.
        lean: None (default): the lean path where the model allows it; False: eager attention
            and stored probabilities; True: the lean path or a ValueError.
        {recompute}
            The lean path only: the stored path keeps every layer's probabilities anyway.
    """

    def __init__(self, forward_func: Any, lean: bool | None = None, recompute: bool | None = None) -> None:
        AttentionAttribution.__init__(self, forward_func, lean)
        self.recompute = recompute

    @property
    def multiplies_by_inputs(self) -> bool:
        """False: the scores are not multiplied by the inputs (Captum's interface)."""
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
        contrast: Any = None,
        show_progress: bool | None = None,
        remove_identity: bool = False,
    ) -> Tensor:
        """Gradient-weighted rollout of ``position`` after ``layer`` for the score ``target``.
{args}
            remove_identity (bool, optional): return the row of :math:`R_l - I` instead of
                :math:`R_l`: the explained position's own 1 from the identity removed, what the
                authors' scripts read (``R[0, 1:]`` leaves out the [CLS] row's own entry) and
                what a map shows best, since that 1 dwarfs every other score. Only the entry
                at ``position`` itself changes, by exactly -1. Default False: the paper's R.
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
        position, weights = self._pooled_position(position, inputs, attention_mask)
        with torch.enable_grad():  # as Captum's gradient methods, also inside torch.no_grad()
            computed = None
            if self._lean_gradients():
                computed = self._streamed(inputs, target, args, position, layer, attention_mask, contrast, show_progress)
            if computed is None:
                computed = self._stored(inputs, target, args, position, layer, attention_mask, contrast, show_progress)
            result, sources, has_axis = computed
        if remove_identity:
            result = _without_identity(result, sources)
        return pooled_rows(as_returned(result, has_axis, inputs), weights)

    def _stored(
        self, inputs: Tensor, target: Any, args: tuple, position: Any, layer: int | None, attention_mask: Tensor | None,
        contrast: Any, show_progress: bool | None,
    ) -> tuple[Tensor, Tensor, bool]:
        """:meth:`attribute` from eager attention's stored probabilities and their gradients:
        the rows (..., B, S, n), the explained positions (B, S) and whether S is the caller's axis."""
        internals = capture_internals(self.forward_func, inputs, args, attention_mask, gradients=True)
        probabilities = internals.probabilities
        _check_self_attention(p.shape for p in probabilities)
        batch, _, n, _ = probabilities[0].shape
        # The maths runs on the inputs' device, where the layers of a dispatched model come together.
        mask = as_mask(attention_mask, batch, n, inputs.device)
        sources, has_axis = explained_positions(
            position, mask, lambda: all(not bool(p.detach().triu(1).any()) for p in probabilities)
        )
        scores = target_scores(internals.output, target, internals.run_positions(sources), contrast)
        attentions = [_in_order(internals, p.detach().to(inputs.device)) for p in probabilities]
        # A language model's positions each predict their own token: one gradient per position,
        # several at once (one batched backward per chunk); a classifier's score is one for all.
        count = sources.shape[1] if output_scores(internals.output).dim() == 3 else 1
        chunk = max(1, _GRADIENT_NUMBERS // sum(p.numel() for p in probabilities))
        rows = []
        with progress_bar(show_progress, inputs, "gradient-weighted rollout", "backward", -(-count // chunk)) as bar:
            for start in range(0, count, chunk):
                for explained, gradients in _gradients(scores, probabilities, start, min(count, start + chunk), count):
                    gradients = [_in_order(internals, g.to(inputs.device)) for g in gradients]
                    rows.append(gradient_weighted_rollout(attentions, gradients, sources[:, explained], layer, mask))
                bar.update()
        result = torch.cat(rows, -2)
        return result, sources, has_axis

    def _lean_gradients(self) -> bool:
        """Whether this call takes the lean path (:mod:`~captum_attnflow.capture.attention_gradients`)."""
        if self.lean is False:
            return False
        module = owning_module(self.forward_func)
        supported = module is not None and supports_attention_gradients(module)
        if self.lean and not supported:
            raise ValueError(
                f"lean=True: {type(module).__name__} is not of a model type whose attention this method "
                f"recomputes ({', '.join(sorted(GRADIENT_MODEL_TYPES))}); use lean=None or False."
            )
        return supported

    def _streamed(
        self, inputs: Tensor, target: Any, args: tuple, position: Any, layer: int | None, attention_mask: Tensor | None,
        contrast: Any, show_progress: bool | None,
    ) -> tuple[Tensor, Tensor, bool] | None:
        """:meth:`attribute` on the lean path (returns as :meth:`_stored`): one backward pass per explained score, each layer's
        :math:`\\bar A_l` in row blocks from the queries, keys, values and output gradient, the
        rows walked down the layers as the backward pass reaches them. None where an attention
        call's scores cannot be recomputed (the stored path then serves)."""
        known = given_positions(position, inputs, attention_mask)
        recompute = recomputes(self.recompute, self.forward_func, inputs, "GradientWeightedRollout")
        with attention_gradients_run(
            self.forward_func, inputs, args, attention_mask, None if known is None else known[0], recompute
        ) as capture:
            if capture.refused:
                if self.lean:
                    raise ValueError(_REFUSED)
                return None
            calls = capture.calls
            _check_self_attention((*c.scores.query.shape[:3], c.scores.key.shape[2]) for c in calls)
            batch, n = calls[0].scores.query.shape[0], calls[0].scores.query.shape[2]
            device = inputs.device  # where the layers of a dispatched model come together
            mask = as_mask(attention_mask, batch, n, device)
            sources, has_axis = known if known is not None else explained_positions(position, mask, lambda: capture.causal)
            run_sources = sources if capture.order is None else in_run_order(sources, capture.order.to(device))
            run_mask = as_mask(capture.mask, batch, n, device)
            scores = target_scores(capture.output, target, capture.logit_rows(run_sources), contrast)
            walked = max(layer_indices(layer, len(calls))) + 1  # the layers the explained ones are rolled out over
            # A language model's positions each predict their own token: one backward per position;
            # a classifier's score is one for all.
            count = sources.shape[1] if output_scores(capture.output).dim() == 3 else 1
            explained = [slice(k, k + 1) for k in range(count)] if count > 1 else [slice(None)]
            rows = []
            with progress_bar(show_progress, inputs, "gradient-weighted rollout", "backward", count) as bar:
                for k, part in enumerate(explained):
                    walk = RowWalk(run_sources[:, part], run_mask, walked, every_layer=layer is None)
                    capture.backward(scores[:, part.start or 0].sum(), functools.partial(_step, capture, walk, walked),
                                     retain_graph=k < count - 1)
                    rows.append(walk.rows())
                    bar.update()
        result = torch.cat(rows, -2)
        if capture.order is not None:  # columns from the run's token order back to the inputs'
            back = capture.order.to(device).argsort(dim=-1)
            result = result.gather(-1, back[:, None, :].expand(result.shape))
        return result, sources, has_axis

    def encoder_decoder_rows(
        self,
        input_ids: Tensor,
        decoder_input_ids: Tensor,
        target: Tensor,
        layer: int | None = -1,
        attention_mask: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        show_progress: bool | None = None,
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
            show_progress: a tqdm bar over the decoder positions; None (default) shows one for long inputs.

        Returns:
            float32 (B, m, n_s + m), (L_d, B, m, n_s + m) for ``layer=None``: row t over the
            source tokens, then over the decoder's input tokens; padding 0.
        """
        rows = self._streamed_encoder_decoder if self._lean_gradients() else self._stored_encoder_decoder
        count = decoder_input_ids.shape[1]
        steps = []
        with torch.enable_grad(), progress_bar(show_progress, decoder_input_ids, "gradient-weighted rollout", "position", count) as bar:
            for step in rows(input_ids, decoder_input_ids, target, attention_mask, decoder_attention_mask):
                steps.append(step)
                bar.update()
        relevance = torch.stack(steps, -2)  # (L_d, B, m, n_s + m)
        result = relevance[layer_indices(layer, relevance.shape[0])]
        return result[0] if layer is not None else result

    def _streamed_encoder_decoder(
        self, input_ids: Tensor, decoder_input_ids: Tensor, target: Tensor, attention_mask: Tensor | None,
        decoder_attention_mask: Tensor | None,
    ) -> Iterator[Tensor]:
        """Per decoder position t, (L_d, B, n_s + m) its relevance after each decoder layer, from
        one backward pass and the :math:`\\bar A` of each attention call computed from its
        queries, keys, values and output gradient (the lean path)."""
        capture = capture_attention_gradients(
            self.forward_func, input_ids, (attention_mask, decoder_input_ids, decoder_attention_mask)
        )
        if capture.refused:
            raise ValueError(_REFUSED)
        kinds = attention_kinds(self.forward_func, [call.module for call in capture.calls])
        scores = _token_scores(capture.output, target)
        count = decoder_input_ids.shape[1]
        for t in range(count):
            gradients = capture.output_gradients(scores[:, t].sum(), range(len(kinds)), retain_graph=t < count - 1)
            maps = {kind: [] for kind in ("encoder", "decoder", "cross")}
            for index, kind in enumerate(kinds):
                maps[kind].append(capture.weighted_layer(capture.calls[index], gradients[index]))
            relevance = co_attention_relevance(
                maps["encoder"], maps["decoder"], maps["cross"], attention_mask, decoder_attention_mask
            )
            yield relevance[:, :, t]

    def _stored_encoder_decoder(
        self, input_ids: Tensor, decoder_input_ids: Tensor, target: Tensor, attention_mask: Tensor | None,
        decoder_attention_mask: Tensor | None,
    ) -> Iterator[Tensor]:
        """:meth:`_streamed_encoder_decoder` from eager attention's stored probabilities and their gradients."""
        internals, kinds = seq2seq_gradient_internals(
            self.forward_func, input_ids, decoder_input_ids, attention_mask, decoder_attention_mask
        )
        probabilities = internals.probabilities
        scores = _token_scores(internals.output, target)
        count = decoder_input_ids.shape[1]
        chunk = max(1, _GRADIENT_NUMBERS // sum(p.numel() for p in probabilities))
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
                yield relevance[:, :, position].squeeze(2)


def _token_scores(output: Any, target: Tensor) -> Tensor:
    """(B, m) the logit of ``target`` (B, m) at each decoder position."""
    logits = output_scores(output)
    return logits.gather(-1, target[..., None].to(logits.device)).squeeze(-1)


def _step(capture: AttentionGradients, walk: RowWalk, walked: int, index: int, call: AttentionCall,
          grad_output: Tensor | None) -> None:
    """The walk's step down through attention call ``index`` (those above the ``walked`` layers
    are not walked), its :math:`\\bar A` from the call and its output gradient (0 without one)."""
    if index >= walked:
        return
    if grad_output is None:
        walk.step(lambda needed: ())
        return
    walk.step(lambda needed: capture.weighted_blocks(call, grad_output, needed),
              lambda needed: capture.weighted_product(call, grad_output, needed))


def _check_self_attention(shapes: Iterable[tuple[int, ...]]) -> None:
    """Refuse a model that ran cross-attention (per call (B, H, n_q, n_k) shapes)."""
    if any(shape[-1] != shape[-2] for shape in shapes):
        raise ValueError(
            "GradientWeightedRollout explains self-attention; this model also ran cross-attention "
            "(an encoder-decoder): explain its encoder or decoder alone, or use encoder_decoder_rows."
        )


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
_REFUSED = (
    "lean=True: an attention call of this model has a score term that its queries, keys and mask do not "
    "hold (captum_attnflow.capture.lean.captured_scores), so its maps cannot be recomputed; use lean=None or False."
)


def _without_identity(rows: Tensor, sources: Tensor) -> Tensor:
    """``rows`` (..., B, S, n) minus 1 at each row's own position ``sources`` (B, S): the row of R - I."""
    identity = torch.zeros(rows.shape[-3:], dtype=rows.dtype, device=rows.device)
    identity.scatter_(-1, sources.to(rows.device)[..., None], 1.0)
    return rows - identity


def _in_order(internals: Internals, layer: Tensor) -> Tensor:
    """One layer's (B, H, n, n) maps in the inputs' token order."""
    return internals.in_inputs_order(layer.transpose(0, 1)).transpose(0, 1)
