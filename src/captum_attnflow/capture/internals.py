"""One forward pass that keeps what the gradient-weighted and decomposition methods read inside a
model: each attention layer's probabilities (with their gradients when asked), value vectors, and
each transformer block's input.

An attention function registered with transformers' attention-function interface replaces the
model's own for one call. It runs the model family's own eager attention (the
``eager_attention_forward`` of the model's modeling module, so position biases, scalings and
grouped-query heads are the model's) and records the probabilities it returns, which are the very
tensor multiplied with the values: their gradient is the gradient of the output with respect to
the attention. The model's outputs are its eager outputs. A model that computes its attention
itself, outside the interface (DeBERTa, MPNet, BLOOM, Falcon), gives instead the probabilities it
returns with ``output_attentions``: each layer's as its attention module returns them, with the
values split from its projections' outputs, where the architecture table says where they are
(:class:`~captum_attnflow.hf.own_attention.OwnAttention`), else those the model returns, when
only they are asked for. The model is left as it was
(attention implementation, mode, hooks), also when the call raises; calls on one model from
several threads run one at a time.

With ``lean=True`` the attention function instead computes each call's output with the model's
own implementation (``sdpa`` as loaded) and records, in place of the probabilities, what makes
its scores (:class:`~captum_attnflow.capture.lean_blocks.AttentionScores`: queries, keys, mask, scaling),
from which :mod:`captum_attnflow.capture.lean_heads` recomputes them block by block, and the output
it mixed (the attention output before its projection).
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel
from transformers.masking_utils import eager_mask, sdpa_mask

from captum_attnflow.capture.lean import captured_scores, own_attention
from captum_attnflow.capture.lean_blocks import AttentionScores
from captum_attnflow.capture.maps import attentions_of, in_run_order, maps_in_order, real_tokens_first_call
from captum_attnflow.capture.quantized import dequantized_gradients
from captum_attnflow.hf.architectures import scores_as_loaded
from captum_attnflow.hf.inputs import as_tuple, check_mask_not_in_args, mask_keyword
from captum_attnflow.hf.models import check_device, hf_models, outermost, owning_module
from captum_attnflow.hf.own_attention import OwnAttention
from captum_attnflow.hf.state import eager_attention, implementation, register_attention, unchanged

_NAME = "captum_attnflow_internals"
_LEAN_NAME = "captum_attnflow_internals_lean"
_CAPTURES: "weakref.WeakKeyDictionary[nn.Module, Internals]" = weakref.WeakKeyDictionary()


@dataclass
class Internals:
    """What one forward pass kept, in the order the attention layers ran.

    Attributes:
        probabilities: per attention call, (B, H, n_q, n_k), the probabilities the model
            multiplied with its values (in the autograd graph when gradients were asked for);
            none with ``lean=True``.
        scores: with ``lean=True``, per attention call, what makes its scores, or None where
            the call holds a term they cannot (:func:`~captum_attnflow.capture.lean.captured_scores`).
        contexts: with ``lean=True``, per attention call, (B, n_q, H d) its output before the
            output projection, as the model's own attention computed it.
        values: per attention call, (B, H, n_k, d) value vectors, grouped-query heads repeated.
        modules: per attention call, the attention module that made it.
        block_inputs: per hooked transformer block, its input hidden states (B, n, D).
        output: what the model returned.
        order: (B, n) the run's token order when a left-padded batch ran with its real tokens
            first (``order[b, k]`` = original position of the k-th token in the run), else None.
        implementation: with ``lean=True``, the model's own attention implementation, which
            computes each call's output.
    """

    probabilities: list[Tensor] = field(default_factory=list)
    scores: list[AttentionScores | None] = field(default_factory=list)
    contexts: list[Tensor] = field(default_factory=list)
    values: list[Tensor] = field(default_factory=list)
    modules: list[nn.Module] = field(default_factory=list)
    block_inputs: list[Tensor] = field(default_factory=list)
    output: Any = None
    order: Tensor | None = None
    implementation: str | None = None

    def in_inputs_order(self, maps: Tensor) -> Tensor:
        """(..., B, n, n) matrices computed in the run's token order, rows and columns put back
        in the inputs' order."""
        if self.order is None:
            return maps
        back = self.order.to(maps.device).argsort(dim=-1)
        flat = maps.reshape(-1, *maps.shape[-3:]).transpose(0, 1)  # (B, K, n, n)
        return maps_in_order(flat, back).transpose(0, 1).reshape(maps.shape)

    def run_positions(self, positions: Tensor) -> Tensor:
        """(B, S) positions of the inputs, as positions in the run."""
        return positions if self.order is None else in_run_order(positions, self.order.to(positions.device))


def _eager_function(module: nn.Module) -> Callable[..., tuple[Tensor, Tensor]]:
    """The model family's own eager attention: ``eager_attention_forward`` of its modeling module."""
    function = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if function is None:
        raise ValueError(
            f"{type(module).__name__} has no eager attention function in its modeling module "
            f"({type(module).__module__}); this method needs a model whose attention runs through "
            "transformers' attention-function interface."
        )
    return function


def _internals_attention(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, **kwargs: Any
) -> tuple[Tensor, Tensor]:
    internals = _CAPTURES[module]
    if torch.is_grad_enabled() and not query.requires_grad:
        # Frozen parameters: the graph from the attention to the output must still exist.
        query = query.detach().requires_grad_()
    output, probabilities = _eager_function(module)(module, query, key, value, attention_mask, **kwargs)
    heads = probabilities.shape[1]
    values = value.repeat_interleave(heads // value.shape[1], dim=1) if value.shape[1] != heads else value
    internals.probabilities.append(probabilities)
    internals.values.append(values.detach())
    internals.modules.append(module)
    return output, probabilities


def _lean_internals_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    internals = _CAPTURES[module]
    function = own_attention(internals.implementation, module, kwargs)
    output = function(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)[0]
    heads = query.shape[1]
    values = value.repeat_interleave(heads // value.shape[1], dim=1) if value.shape[1] != heads else value
    internals.scores.append(captured_scores(module, query, key, attention_mask, scaling, kwargs))
    internals.contexts.append(output.detach().reshape(*output.shape[:2], -1))  # (B, n, H, d) -> (B, n, H d)
    internals.values.append(values.detach())
    internals.modules.append(module)
    return output, None


def capture_internals(
    forward_func: Callable[..., Any],
    inputs: Tensor,
    additional_forward_args: Any = None,
    attention_mask: Tensor | None = None,
    gradients: bool = False,
    blocks: list[nn.Module] | None = None,
    after_block: Callable[[Internals], None] | None = None,
    lean: bool = False,
    own: OwnAttention | None = None,
) -> Internals:
    """Run ``forward_func`` once and keep its attention internals (see :class:`Internals`).

    A Hugging Face model is called as ``model(inputs, *additional_forward_args,
    attention_mask=attention_mask)``, a left-padded batch with each row's real tokens first
    (``Internals.order``); any other module containing one as ``forward_func(inputs,
    *additional_forward_args)``, plus ``attention_mask=`` when its forward takes an argument of
    that name that the arguments leave unfilled.

    Args:
        forward_func: a Hugging Face model, or a module (or bound method) containing one.
        inputs: token ids (B, n), or pixel values of a vision transformer.
        additional_forward_args: extra positional arguments after ``inputs``.
        attention_mask: (B, n), 1 on real tokens, 0 on padding, or None.
        gradients: run with autograd on, so that the recorded probabilities and ``output``
            are in one graph (``torch.autograd.grad(score, internals.probabilities)``, which
            touches no parameter's ``.grad``), also when the model's parameters are frozen.
        blocks: transformer blocks whose inputs to keep (:func:`~captum_attnflow.hf.architectures.architecture_of`).
        after_block: called with the internals each time one of ``blocks`` has run (its input,
            probabilities and values the last kept), e.g. to use a layer's probabilities and
            drop them before the next layer makes its own.
        lean: run the model's own attention and keep each call's scores and output
            (``Internals.scores``, ``Internals.contexts``) instead of its probabilities (not
            with ``gradients``); for the models of :func:`~captum_attnflow.capture.lean.supports_lean`.
        own: for a family whose attention runs in its own modules, where its
            probabilities and values are (the architecture table's ``own_attention``): the
            model runs eager with ``output_attentions`` and each of ``blocks`` keeps its own.

    Returns:
        Internals: one entry per attention call, in call order; for a model whose attention
        runs outside the interface, asked for gradients and no blocks, the probabilities its
        outermost Hugging Face model returns (no values, modules or block inputs).
    """
    if lean and gradients:
        raise ValueError("capture_internals keeps no probabilities with lean=True, so no gradients: use lean=False.")
    module, call, order, _ = prepared_call(forward_func, inputs, additional_forward_args, attention_mask)
    internals = Internals(order=order)
    if own is not None:
        attention = _own_attention_recording(module, own, internals, blocks or [])
    elif lean:
        register_attention(_LEAN_NAME, _lean_internals_attention, sdpa_mask)  # the masks sdpa gets: bool, or None
        attention = implementation(module, _LEAN_NAME)
    else:
        register_attention(_NAME, _internals_attention, eager_mask)  # the additive masks eager attention gets
        attention = implementation(module, _NAME)
    with unchanged(module), _recording(module, internals, blocks or [], after_block), attention as entered:
        if lean and own is None:  # read under the model's lock: the implementation the lean attention delegates to
            internals.implementation = entered(outermost(hf_models(module))[0])
        with torch.set_grad_enabled(gradients), dequantized_gradients(module):
            internals.output = call()
    if not internals.probabilities and gradients and not blocks:
        internals.output, internals.probabilities = _returned_attentions(module, call)
    if not internals.probabilities and not internals.scores:
        raise ValueError(
            f"{type(module).__name__} ran no attention through transformers' attention-function interface; "
            "this method needs a model that does (BERT, GPT-2, Llama, ViT, T5, ... in transformers 5)."
        )
    return internals


def _returned_attentions(module: nn.Module, call: Callable[[], Any]) -> tuple[Any, list[Tensor]]:
    """``(output, probabilities)`` of ``call()`` run with eager attention, autograd on, and
    ``output_attentions`` set on the outermost Hugging Face models in ``module``: the
    probabilities the first of them returns, those its attention multiplied with its values
    (their gradient is the output's gradient with respect to the attention)."""
    targets = outermost(hf_models(module))
    returned: list[Any] = []
    with unchanged(module), _attentions_returned(module), dequantized_gradients(module), torch.enable_grad():
        handles = [model.register_forward_hook(lambda _model, _args, output: returned.append(output)) for model in targets]
        try:
            output = call()
        finally:
            for handle in handles:
                handle.remove()
    return output, list(attentions_of(returned[0]))


@contextlib.contextmanager
def _attentions_returned(module: nn.Module) -> Iterator[None]:
    """The Hugging Face models in ``module`` run eager attention, their scores as loaded
    (:func:`~captum_attnflow.hf.architectures.scores_as_loaded`), and, the outermost ones, with
    ``output_attentions`` set, for the block; restored on exit."""
    targets = outermost(hf_models(module))
    saved = [model.config.output_attentions for model in targets]
    with eager_attention(module), scores_as_loaded(module):
        try:
            for model in targets:
                model.config.output_attentions = True
            yield
        finally:
            for model, value in zip(targets, saved):
                model.config.output_attentions = value


@contextlib.contextmanager
def _own_attention_recording(
    module: nn.Module, own: OwnAttention, internals: Internals, blocks: list[nn.Module]
) -> Iterator[None]:
    """Each of ``blocks`` keeps, as its attention module returns them, its probabilities, its
    values (split from its projections' outputs, grouped-query heads repeated) and that module,
    the model running as :func:`_attentions_returned` says."""

    def recorder(block: nn.Module) -> list[Any]:
        outputs: dict[int, Tensor] = {}  # each projection's first output of the call (DeBERTa's run twice)

        def keep(index: int) -> Callable[..., None]:
            def hook(_module: nn.Module, _args: tuple, output: Tensor) -> None:
                outputs.setdefault(index, output)

            return hook

        def record(attention: nn.Module, _args: tuple, output: tuple) -> None:
            probabilities = output[1]
            value = own.split(block, [outputs[index] for index in range(len(outputs))])[2]
            heads = probabilities.shape[1]
            values = value.repeat_interleave(heads // value.shape[1], dim=1) if value.shape[1] != heads else value
            internals.probabilities.append(probabilities)
            internals.values.append(values.detach())
            internals.modules.append(attention)
            outputs.clear()

        projections = own.projections(block)
        return [projection.register_forward_hook(keep(index)) for index, projection in enumerate(projections)] + [
            own.module(block).register_forward_hook(record)
        ]

    with _attentions_returned(module):
        handles = [handle for block in dict.fromkeys(blocks) for handle in recorder(block)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


def prepared_call(
    forward_func: Callable[..., Any], inputs: Tensor, additional_forward_args: Any, attention_mask: Tensor | None
) -> tuple[nn.Module, Callable[[], Any], Tensor | None, Tensor | None]:
    """``(module, call, order, mask)``: the module that ``forward_func`` runs, the call that runs
    it on the inputs as :func:`capture_internals` describes (``call(**extra)`` passes more
    keyword arguments), that run's token order
    (``order[b, k]`` the original position of the k-th token, None when no token moves) and its
    (B, n) attention mask in that order."""
    module = owning_module(forward_func)
    if module is None:
        raise TypeError(
            f"forward_func must be a Hugging Face model or a module containing one, got {type(forward_func).__name__}; "
            "these methods read the attention inside the model."
        )
    check_device(module, inputs)
    args = as_tuple(additional_forward_args)
    order = None
    if isinstance(forward_func, PreTrainedModel):
        check_mask_not_in_args(forward_func, args, attention_mask)
        if attention_mask is not None:
            attention_mask = torch.as_tensor(attention_mask).to(inputs.device)
        inputs, args, kwargs, order = real_tokens_first_call(inputs, args, attention_mask)
    else:
        kwargs = mask_keyword(forward_func, args, attention_mask)
    run_mask = attention_mask if order is None else kwargs["attention_mask"]
    return module, lambda **extra: forward_func(inputs, *args, **kwargs, **extra), order, run_mask


@contextlib.contextmanager
def _recording(
    module: nn.Module, internals: Internals, blocks: list[nn.Module], after_block: Callable[[Internals], None] | None
) -> Iterator[None]:
    """Route every submodule's attention calls to ``internals`` and hook the blocks' inputs (and
    ``after_block`` after each block) for the block."""

    def keep_input(block: nn.Module, args: tuple, kwargs: dict) -> None:
        internals.block_inputs.append((args[0] if args else kwargs["hidden_states"]).detach())

    modules = list(module.modules())
    # a shared block (ALBERT) is listed once per call, hooked once
    handles = [block.register_forward_pre_hook(keep_input, with_kwargs=True) for block in dict.fromkeys(blocks)]
    if after_block is not None:
        handles += [block.register_forward_hook(lambda *_: after_block(internals)) for block in dict.fromkeys(blocks)]
    try:
        for submodule in modules:
            _CAPTURES[submodule] = internals
        yield
    finally:
        for handle in handles:
            handle.remove()
        for submodule in modules:
            _CAPTURES.pop(submodule, None)
