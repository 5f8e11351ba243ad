"""Getting attention maps out of Hugging Face models or user callables, leaving the model unchanged."""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from captum_attnflow.capture.lean import lean_capture, supports_lean
from captum_attnflow.functional import AttentionGraph, attention_graph
from captum_attnflow.hf.architectures import scores_as_loaded
from captum_attnflow.hf.inputs import as_tuple, check_mask_not_in_args, mask_keyword, real_tokens_first, reorder_tokens
from captum_attnflow.hf.models import check_device, encoder_of, hf_models, outermost, owning_module
from captum_attnflow.hf.state import eager_attention, exclusive, unchanged


def extract_attentions(
    forward_func: Callable[..., Any],
    inputs: Tensor,
    additional_forward_args: Any = None,
    attention_mask: Tensor | None = None,
) -> tuple[Tensor, ...]:
    """Run ``forward_func`` once without gradients and return its attentions, L tensors (B, H, n, n).

    ``forward_func`` may be

    * a Hugging Face model: called as ``model(inputs, *additional_forward_args,
      attention_mask=attention_mask, output_attentions=True)`` with eager attention. A
      left-padded batch runs with each row's real tokens moved to the front (and the maps
      moved back), so a padded sentence is encoded exactly as it is alone, whatever the
      model's positions; ``additional_forward_args`` tensors shaped (B, n, ...) move with the
      tokens. Of an encoder-decoder model (T5, BART, ...) only the encoder runs: its
      self-attentions are the ones over the input tokens;
    * any ``nn.Module`` (or bound method of one) that contains a Hugging Face model, e.g. a
      classifier or sentence-embedding wrapper: called as
      ``forward_func(inputs, *additional_forward_args)`` (plus ``attention_mask=`` when its
      forward takes an argument of that name that the arguments leave unfilled) while the attentions of its outermost
      Hugging Face model are captured. With padding, the wrapper must pass the mask on to the
      model itself (e.g. through ``additional_forward_args``); it is an error if it does not.
      An encoder-decoder model called by the wrapper gives its encoder's attentions;
    * any other callable ``forward_func(inputs, *additional_forward_args)`` that returns the
      attentions: a sequence of (B, H, n, n) tensors, an (L, B, H, n, n) tensor, or an object
      with an ``attentions`` attribute.

    Modules run in eval mode for the call (attention dropout would make the maps random and
    their rows not sum to 1); each submodule's mode, the forward hooks and the attention
    implementation are restored afterwards, also when the call raises. Calls on one model
    from several threads run one at a time.

    Args:
        forward_func: a Hugging Face model, a module or bound method containing one, or a
            callable returning attentions (see above).
        inputs: token ids (B, n) (or whatever ``forward_func`` takes first).
        additional_forward_args: extra positional arguments passed after ``inputs``: one
            value, a tuple of them, or None.
        attention_mask: (B, n), 1 on real tokens, 0 on padding; passed to a Hugging Face
            model as ``attention_mask``. Optional.

    Returns:
        tuple[Tensor, ...]: L tensors (B, H, n, n), one per layer, row = query, detached.

    Raises:
        ValueError: the inputs are not on the model's device, no attentions come back, or a
            wrapper drops the attention mask of a padded batch.

    Example::

        >>> import torch
        >>> from transformers import BertConfig, BertModel
        >>> from captum_attnflow import extract_attentions
        >>> model = BertModel(BertConfig(num_hidden_layers=2, hidden_size=32,
        ...     num_attention_heads=2, intermediate_size=64)).eval()
        >>> attentions = extract_attentions(model, torch.tensor([[101, 7592, 102]]))
        >>> len(attentions), attentions[0].shape
        (2, torch.Size([1, 2, 3, 3]))
    """
    args = as_tuple(additional_forward_args)
    module = owning_module(forward_func)
    if module is not None:
        check_device(module, inputs)
    if attention_mask is not None:
        attention_mask = torch.as_tensor(attention_mask).to(inputs.device)
    with torch.no_grad():
        if isinstance(forward_func, PreTrainedModel):
            return _model_attentions(forward_func, inputs, args, attention_mask)
        if module is not None and hf_models(module):
            with unchanged(module):
                kwargs = mask_keyword(forward_func, args, attention_mask)
                return _captured_attentions(module, lambda: forward_func(inputs, *args, **kwargs), attention_mask)
        return attentions_of(forward_func(inputs, *args))


def capture_graph(
    forward_func: Callable[..., Any],
    inputs: Tensor,
    additional_forward_args: Any = None,
    attention_mask: Tensor | None = None,
    residual_alpha: float = 0.5,
    head_fusion: str = "mean",
    keep_heads: bool = False,
    lean: bool | None = None,
) -> AttentionGraph:
    """Run ``forward_func`` once and return its checked :class:`~captum_attnflow.functional.AttentionGraph`.

    With the lean path (``lean=None``, the default, uses it where it applies: a Hugging Face
    model of a type in :data:`captum_attnflow.capture.lean.LEAN_MODEL_TYPES`, fused heads) each
    layer's attention is reduced to its head-fused (B, n, n) matrix during the forward, which
    keeps running with the model's own attention implementation, and the per-head maps are
    never stored (:mod:`captum_attnflow.capture.lean`). Otherwise the model runs with eager
    attention and returns its maps (:func:`extract_attentions`). Both give the same graph up
    to float rounding (1e-6).

    Args:
        forward_func, inputs, additional_forward_args, attention_mask: as in :func:`extract_attentions`.
        residual_alpha, head_fusion, keep_heads: as in :func:`~captum_attnflow.functional.attention_graph`.
        lean: True to require the lean path (an error where it does not apply), False for the
            stored maps, None for the lean path where it applies.

    Returns:
        AttentionGraph: weights (L, B, n, n) and mask (B, n).

    Example::

        >>> import torch
        >>> from transformers import BertConfig, BertModel
        >>> from captum_attnflow.capture import capture_graph
        >>> model = BertModel(BertConfig(num_hidden_layers=2, hidden_size=32,
        ...     num_attention_heads=2, intermediate_size=64)).eval()
        >>> ids = torch.tensor([[101, 7592, 2088, 102]])
        >>> lean, stored = capture_graph(model, ids), capture_graph(model, ids, lean=False)
        >>> lean.weights.shape, bool(torch.allclose(lean.weights, stored.weights, atol=1e-6))
        (torch.Size([2, 1, 4, 4]), True)
    """
    applies = isinstance(forward_func, PreTrainedModel) and supports_lean(forward_func) and not keep_heads
    if lean and not applies:
        raise ValueError(
            "the lean path applies to Hugging Face models of the types in captum_attnflow.capture.lean.LEAN_MODEL_TYPES "
            "called directly, with fused heads, computing their own attention (not inside inject_attention); "
            "use lean=None or False here."
        )
    graph = None
    if applies and lean is not False:
        args = as_tuple(additional_forward_args)
        graph = _lean_graph(forward_func, inputs, args, attention_mask, residual_alpha, head_fusion)
    if graph is None:  # stored maps: asked for, or the model did not run all its layers through the interface
        attentions = extract_attentions(forward_func, inputs, additional_forward_args, attention_mask)
        graph = attention_graph(attentions, residual_alpha, head_fusion, attention_mask, keep_heads)
    return graph


def _lean_graph(
    model: PreTrainedModel,
    inputs: Tensor,
    args: tuple,
    attention_mask: Tensor | None,
    residual_alpha: float,
    head_fusion: str,
) -> AttentionGraph | None:
    """A streamed graph from one lean forward: each layer recomputed from its queries and keys
    when asked, in the inputs' token order; None if some layer bypassed the interface."""
    check_device(model, inputs)
    check_mask_not_in_args(model, args, attention_mask)
    if attention_mask is not None:
        attention_mask = torch.as_tensor(attention_mask).to(inputs.device)
    run_inputs, args, kwargs, order = real_tokens_first_call(inputs, args, attention_mask)
    # The attention does not depend on the head: without positional arguments (which the base
    # model may order otherwise) the base model runs alone, so a language model computes no
    # (B, n, V) logits (its largest tensor, and a fifth of GPT-2-small's forward at n = 4096).
    runner = model if args else model.base_model
    with torch.no_grad(), unchanged(model), lean_capture(model, head_fusion, inputs.device) as capture:
        runner(run_inputs, *args, **kwargs)
    if not capture.complete:
        return None
    batch, n = attention_mask.shape if attention_mask is not None else capture.layers[0].query.shape[0::2]
    return AttentionGraph.streamed(
        lambda index, out: capture.fused_layer(index, out=out), capture.num_layers, attention_mask, batch, n,
        capture.layers[0].query.device, residual_alpha, head_fusion, capture.causal, capture.fused_layer,
        capture.fused_blocks, order, capture.row_product,
    )


def _model_attentions(
    model: PreTrainedModel, inputs: Tensor, args: tuple, attention_mask: Tensor | None
) -> tuple[Tensor, ...]:
    """Attentions of a Hugging Face model (its encoder for a seq2seq model), real tokens first."""
    check_mask_not_in_args(model, args, attention_mask)
    runner = encoder_of(model, args)
    inputs, args, kwargs, order = real_tokens_first_call(inputs, args, attention_mask)
    with eager_attention(model), unchanged(model), scores_as_loaded(model):
        attentions = attentions_of(runner(inputs, *args, output_attentions=True, **kwargs))
    if order is None:
        return attentions
    back = order.argsort(dim=-1)  # original position -> place in the run
    return tuple(maps_in_order(layer, back) for layer in attentions)


def real_tokens_first_call(
    inputs: Tensor, args: tuple, attention_mask: Tensor | None
) -> tuple[Tensor, tuple, dict[str, Any], Tensor | None]:
    """The call that runs a left-padded batch as a right-padded one: ``(inputs, args, kwargs,
    order)`` with each row's real tokens moved to the front (per-token ``args`` moved along) and
    ``kwargs`` holding the matching ``attention_mask``; ``order`` is None when nothing moves."""
    if attention_mask is None:
        return inputs, args, {}, None
    order = real_tokens_first(attention_mask)
    if order is None:
        return inputs, args, {"attention_mask": attention_mask}, None
    moved = tuple(_moved_with_tokens(arg, order) for arg in args)
    return reorder_tokens(inputs, order), moved, {"attention_mask": reorder_tokens(attention_mask, order)}, order


def in_run_order(positions: Tensor, order: Tensor) -> Tensor:
    """(B, S) positions of the inputs as positions in a run reordered by ``order`` (B, n)."""
    return order.argsort(dim=-1).gather(1, positions)


def _moved_with_tokens(arg: Any, order: Tensor) -> Any:
    if isinstance(arg, Tensor) and arg.dim() >= 2 and tuple(arg.shape[:2]) == tuple(order.shape):
        return reorder_tokens(arg, order)
    return arg


def maps_in_order(layer: Tensor, back: Tensor) -> Tensor:
    """(B, H, n, n) maps computed on reordered tokens, rows and columns put back: entry
    ``[b, h, i, j]`` of the result is ``layer[b, h, back[b, i], back[b, j]]``."""
    batch, heads, n, _ = layer.shape
    rows = back[:, None, :, None].expand(batch, heads, n, n)
    columns = back[:, None, None, :].expand(batch, heads, n, n)
    return layer.gather(2, rows).gather(3, columns)


def _captured_attentions(
    module: nn.Module, call: Callable[[], Any], attention_mask: Tensor | None = None
) -> tuple[Tensor, ...]:
    """Call ``call()`` and return the attentions of the outermost Hugging Face model in ``module``.

    With a padded ``attention_mask``, raises if the model is called without a mask.
    """
    captured: list[Any] = []
    targets = outermost(hf_models(module))
    padded = attention_mask is not None and not bool(attention_mask.bool().all())

    def check_mask(model: nn.Module, args: tuple, kwargs: dict) -> None:
        if padded and _call_argument(model, args, kwargs, "attention_mask") is None:
            raise ValueError(
                f"attention_mask marks padding, but {type(module).__name__} calls its "
                f"{type(model).__name__} without an attention_mask, so padding would influence real "
                "tokens; make the wrapper pass the mask on (e.g. through additional_forward_args)."
            )

    def keep_output(_module: nn.Module, _args: Any, output: Any) -> None:
        captured.append(output)

    with exclusive(module):
        saved = [model.config.output_attentions for model in targets]
        handles = [model.register_forward_pre_hook(check_mask, with_kwargs=True) for model in targets]
        handles += [model.register_forward_hook(keep_output) for model in targets]
        try:
            with eager_attention(module), scores_as_loaded(module):
                for model in targets:
                    model.config.output_attentions = True
                call()
        finally:
            for handle in handles:
                handle.remove()
            for model, value in zip(targets, saved):
                model.config.output_attentions = value
    if not captured:
        raise ValueError(
            f"{type(module).__name__} never called its Hugging Face model, so no attentions were captured; "
            "pass the Hugging Face model itself as forward_func."
        )
    return attentions_of(captured[0])


def _call_argument(model: nn.Module, args: tuple, kwargs: dict, name: str) -> Any:
    """The value ``model.forward`` receives for ``name`` from a call with ``args`` and ``kwargs``."""
    if name in kwargs:
        return kwargs[name]
    parameters = list(inspect.signature(model.forward).parameters)
    index = parameters.index(name) if name in parameters else len(args)
    return args[index] if index < len(args) else None


def attentions_of(output: Any) -> tuple[Tensor, ...]:
    """The attentions in a model output: ``.attentions`` (``.encoder_attentions`` of a seq2seq
    output), a sequence of (B, H, n, n) tensors or one (L, B, H, n, n) tensor."""
    attentions = getattr(output, "attentions", getattr(output, "encoder_attentions", output))
    if isinstance(attentions, Tensor):
        attentions = tuple(attentions) if attentions.dim() == 5 else None
    if isinstance(attentions, (tuple, list)) and attentions and all(isinstance(a, Tensor) for a in attentions):
        return tuple(attentions)
    raise ValueError(
        "the model returned no attentions. A Hugging Face model must support output_attentions=True "
        "(eager attention is switched on automatically); a custom forward_func must return a sequence "
        f"of (B, H, n, n) attention tensors, an (L, B, H, n, n) tensor or an object with .attentions; got {type(output).__name__}."
    )
