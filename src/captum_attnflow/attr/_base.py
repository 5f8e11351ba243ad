"""What every attention-based attribution shares: Captum's interface, input checks, the graph."""

from __future__ import annotations

from typing import Any, Callable

import torch
from captum.attr import Attribution
from torch import Tensor
from tqdm.auto import tqdm

from captum_attnflow.capture import capture_graph
from captum_attnflow.docstrings import fill_docstring
from captum_attnflow.functional import AttentionGraph
from captum_attnflow.functional.checks import POSITION_DOC, as_mask, default_position, positions
from captum_attnflow.hf import (
    ImageTextSimilarity,
    as_tuple,
    check_token_ids,
    lift_mask,
    owning_module,
    unpack_inputs,
    warn_unmasked_padding,
)

_CONSTRUCTOR_DOC = """Args:
        forward_func: a Hugging Face model, an ``nn.Module`` wrapping one, or a callable
            ``forward_func(inputs, *additional_forward_args)`` returning attentions
            (see :func:`captum_attnflow.capture.extract_attentions`). The model is left
            as it was: attention implementation, eval mode and hooks change only for the
            duration of a call, and calls from several threads on one model run one at a time.
        lean: how attention is captured. None (default): layer by layer, each layer reduced
            to its head-fused (B, n, n) matrix during the forward while the model keeps its own
            attention implementation, for the model types where that applies
            (:data:`captum_attnflow.capture.lean.LEAN_MODEL_TYPES`: BERT, RoBERTa, ModernBERT,
            GPT-2, Llama, Qwen, Gemma, Phi-3, Pythia, ViT, ...; not for ``head=`` results), else eager attention with
            every layer's maps stored. True requires the lean path, False always stores the maps.
            Both give the same results to 1e-6; the lean path needs H times less memory."""

# Fills ``{init}`` in a class docstring with the constructor's arguments.
with_constructor_args = fill_docstring(init=_CONSTRUCTOR_DOC)

_RECOMPUTE_DOC = """recompute: layer-wise recomputation of the backward pass
            (:mod:`captum_attnflow.capture.recompute`): the forward keeps each transformer
            block's input only, and each backward pass runs the blocks again one at a time
            (activation checkpointing per block, the model's mode and hooks unchanged), so one
            block's activations are alive at a time instead of all L; the same scores (to float
            rounding), for one more forward pass per backward pass. None (default): where a
            block's activations outweigh its weights, token ids (B, n) with
            :math:`B n D \\cdot 16 \\ge` the parameters of one block (D the hidden size: from
            689 tokens at hidden 1024 and intermediate 2816, 1 857 at Llama-3.2-1B, 3 329 at
            Llama-3.1-8B; :func:`~captum_attnflow.capture.recompute.recomputes`); True always
            (a ValueError on a model type whose blocks the architecture table does not list);
            False never."""

# Fills ``{recompute}`` in a class docstring with the ``recompute`` constructor argument.
with_recompute_args = fill_docstring(recompute=_RECOMPUTE_DOC)


@with_constructor_args
class AttentionAttribution(Attribution):
    """Base of the attention-based attributions: class-agnostic, gradient-free, no convergence delta.

    {init}
    """

    def __init__(self, forward_func: Callable[..., Any], lean: bool | None = None) -> None:
        super().__init__(forward_func)
        self.lean = lean

    def has_convergence_delta(self) -> bool:
        """False: these methods compute no convergence delta (Captum's interface)."""
        return False

    def _checked_inputs(
        self, inputs: Any, additional_forward_args: Any, attention_mask: Tensor | None
    ) -> tuple[Tensor, tuple, Tensor | None, bool]:
        """``(inputs, additional_forward_args as a tuple, attention_mask, whether inputs are images)``, checked.

        ``inputs`` are token ids (B, n), the tokenizer's output (``input_ids`` and
        ``attention_mask`` taken from it), or pixel values (B, C, H, W) of a vision transformer,
        whose n tokens ([CLS] and the patches) come from the model. A Hugging Face model's mask
        passed the Captum way, last in ``additional_forward_args``, becomes ``attention_mask``.
        """
        inputs, attention_mask = unpack_inputs(inputs, attention_mask)
        args, attention_mask = lift_mask(self.forward_func, as_tuple(additional_forward_args), attention_mask)
        images = isinstance(inputs, Tensor) and inputs.dtype.is_floating_point and inputs.dim() == 4
        if images:
            if attention_mask is not None:
                raise ValueError(
                    "attention_mask was given with image inputs (B, C, H, W): images have no padding, drop it."
                )
            return inputs, args, attention_mask, images
        if isinstance(inputs, Tensor) and inputs.dtype.is_floating_point and inputs.dim() == 3:
            raise TypeError(
                f"inputs must be integer token ids (B, n), got float {tuple(inputs.shape)} tensor; these "
                "methods explain tokens, so pass input_ids rather than embeddings "
                "(images: pixel values (B, C, H, W))."
            )
        check_token_ids(inputs, self.forward_func)
        # Checked before the forward pass: a mask of 2s or 0.5s would change what the model computes.
        as_mask(attention_mask, inputs.shape[0], inputs.shape[1], inputs.device)
        warn_unmasked_padding(self.forward_func, inputs, attention_mask, args)
        return inputs, args, attention_mask, images

    def _graph(
        self,
        inputs: Any,
        additional_forward_args: Any,
        attention_mask: Tensor | None,
        residual_alpha: float,
        head_fusion: str,
        keep_heads: bool = False,
    ) -> tuple[AttentionGraph, Tensor]:
        """Check the inputs, run the model once and return ``(the checked graph, the input ids or pixels)``."""
        inputs, additional_forward_args, attention_mask, images = self._checked_inputs(
            inputs, additional_forward_args, attention_mask
        )
        forward = self.forward_func
        similarity = owning_module(forward)
        if isinstance(similarity, ImageTextSimilarity) and not additional_forward_args:
            # The attention does not depend on the score: the tower runs alone (lean where it applies).
            forward = similarity.tower
        graph = capture_graph(
            forward, inputs, additional_forward_args, attention_mask, residual_alpha, head_fusion, keep_heads, self.lean,
        )
        batch = inputs.shape[0]
        n = graph.mask.shape[1] if images else inputs.shape[1]
        if tuple(graph.mask.shape) != (batch, n):  # the shape check without building a streamed graph's layers
            raise ValueError(
                f"forward_func returned attentions over {graph.mask.shape[1]} tokens for {graph.mask.shape[0]} "
                f"examples but inputs have shape {tuple(inputs.shape)}; expected one (B, H, n, n) = "
                f"({batch}, H, {n}, {n}) tensor per layer, row = query, as transformers returns for output_attentions=True."
            )
        return graph, inputs

    def _pooled_position(self, position: Any, inputs: Tensor, attention_mask: Tensor | None) -> tuple[Any, Tensor | None]:
        """``(position, weights)``: ``position`` as given, and None; for ``position=None`` with an
        :class:`~captum_attnflow.hf.ImageTextSimilarity`, the position its tower pools
        (:meth:`~captum_attnflow.hf.ImageTextSimilarity.pooled_position`): (B,) indices, or every
        position (B, n) with the pooling weights (B, n) that :func:`pooled_rows` applies."""
        similarity = owning_module(self.forward_func)
        if position is not None or not isinstance(similarity, ImageTextSimilarity):
            return position, None
        pooled = similarity.pooled_position(inputs, attention_mask)
        if not pooled.dtype.is_floating_point:
            return pooled, None
        batch, n = pooled.shape
        return torch.arange(n, device=pooled.device).expand(batch, n), pooled


def pooled_rows(rows: Tensor, weights: Tensor | None) -> Tensor:
    """Rows (..., B, n, n) of every position mixed into one (..., B, n) by ``weights`` (B, n) over the
    positions; ``rows`` as they are for None (see :meth:`AttentionAttribution._pooled_position`)."""
    if weights is None:
        return rows
    return torch.einsum("bs,...bsn->...bn", weights.to(rows.device, rows.dtype), rows)


def explained_positions(position: Any, mask: Tensor, causal: Callable[[], bool]) -> tuple[Tensor, bool]:
    """``(indices (B, S), has_axis)`` of the explained ``position`` (see
    :func:`captum_attnflow.functional.checks.positions`); None picks each example's default,
    its last real token where ``causal()`` says attention is causal, else 0 (the CLS token).
    ``causal`` is called only for ``position=None``: it may cost a pass over the attention."""
    if position is None:
        position = default_position(mask, causal())
    return positions(position, mask)


def given_positions(position: Any, inputs: Tensor, attention_mask: Tensor | None) -> tuple[Tensor, bool] | None:
    """:func:`explained_positions` of a ``position`` the caller gave, known before the model
    runs (token ids (B, n) ``inputs``): a language model then computes the logits of those
    positions alone. None for the default position, which needs the run's causality, and for
    other inputs."""
    if position is None or inputs.dim() != 2:
        return None
    return positions(position, as_mask(attention_mask, *inputs.shape, inputs.device))


def as_returned(rows: Tensor, has_axis: bool, inputs: Tensor) -> Tensor:
    """Rows (..., B, S, n) as ``attribute`` returns them: without the S axis when the caller gave
    one position per example (``has_axis`` False), on the inputs' device."""
    return (rows if has_axis else rows.squeeze(-2)).to(inputs.device)


_INPUTS_DOC = """
        Args:
            inputs (Tensor or BatchEncoding): token ids, shape (B, n), or the tokenizer's
                output (a ``BatchEncoding`` or dict: its ``input_ids`` and ``attention_mask``
                are used); or, for a vision transformer (ViT, DeiT, ...), pixel values
                (B, C, H, W): then the n explained tokens are the model's ([CLS] and the
                patches, in the model's order)."""

_CLASS_AGNOSTIC_DOC = """
            target: accepted for compatibility with Captum and ignored: these attributions
                are class-agnostic, they explain a position's representation, not a class score."""

_POSITION_LAYER_DOC = """
            additional_forward_args (Any, optional): extra positional arguments passed to
                ``forward_func`` after ``inputs`` (a Hugging Face model's attention mask given
                last here, Captum's way, is used as ``attention_mask``).
            position (int, list or Tensor, optional): """ + POSITION_DOC.replace("\n            ", "\n                ") + """
                None (default): each example's last real token for a causal model (a
                decoder, detected from its attention), else 0 (the CLS token); for an
                :class:`~captum_attnflow.hf.ImageTextSimilarity`, the position its tower pools.
            layer (int or None, optional): explain the representation at the output of this
                layer, 1..L, or negative from the top (-1 = last layer). None returns every
                layer. Default: -1."""

_FUSION_DOC = """
            head_fusion (str, optional): how heads are combined per layer: ``"mean"``
                (the paper's), ``"max"`` or ``"min"``.
            residual_alpha (float, optional): weight of attention against the residual
                connection, :math:`A = \\alpha W + (1 - \\alpha) I`, rows renormalised."""

_MASK_DOC = """
            attention_mask (Tensor, optional): (B, n), 1 on real tokens, 0 on padding, as
                the tokenizer returns it (other values are refused). Padding gets attribution
                0 and never influences real tokens, on either side. It is passed to a Hugging
                Face model as ``attention_mask``."""

_HEAD_DOC = """
            head (int or str, optional): None (default) for the heads fused; an int k for
                head k of the explained layer on top of the fused layers below (the paper's
                Appendix A.1); ``"all"`` for every head, an extra head axis after the layer axis.
"""

_PROGRESS_DOC = """
            show_progress (bool, optional): show a tqdm progress bar; None (default) shows one
                only for long calls (seconds of work). Every method takes it, so a caller such
                as :class:`~captum_attnflow.attr.llm.LLMAttentionAttribution` can pass it to any."""

_ATTRIBUTE_ARGS_DOC = (
    _INPUTS_DOC + _CLASS_AGNOSTIC_DOC + _POSITION_LAYER_DOC + _FUSION_DOC + _MASK_DOC + _HEAD_DOC.rstrip("\n")
    + _PROGRESS_DOC + "\n"
)

_ATTRIBUTE_RETURNS_DOC = """(B, n) for one layer and one position per
            example, on the inputs' device; a leading layer axis (L, B, n) for ``layer=None``,
            a head axis after it for ``head="all"``, and a position axis (..., S, n) for a
            list or (B, S) ``position``."""

# Fills ``{args}`` and ``{shapes}`` in an ``attribute`` docstring with what all attention methods share.
with_attribute_args = fill_docstring(args=_ATTRIBUTE_ARGS_DOC, shapes=_ATTRIBUTE_RETURNS_DOC)


def with_internals_args(target_doc: str = _CLASS_AGNOSTIC_DOC):
    """Fills ``{args}`` and ``{shapes}`` in the ``attribute`` docstring of a method reading the
    model's internals (no head fusion, residual or per-head results), ``target_doc`` describing
    its ``target``."""
    return fill_docstring(
        args=_INPUTS_DOC + target_doc + _POSITION_LAYER_DOC + _MASK_DOC + _PROGRESS_DOC + "\n", shapes=_ATTRIBUTE_RETURNS_DOC
    )


# From about this many numbers B n^2 in token ids (B, n) (one example of 256 tokens), the methods
# that read a model's internals work for seconds and show a progress bar by default.
_LONG_NUMBERS = 2**16


def progress_bar(show_progress: bool | None, inputs: Tensor, description: str, unit: str, total: int | None = None) -> tqdm:
    """A tqdm bar for the work on ``inputs``: shown when ``show_progress`` is True, or when it is
    None and the inputs are long (token ids (B, n) with B n^2 of at least 65 536; images never)."""
    tokens = inputs.dim() == 2 and not inputs.dtype.is_floating_point
    long = tokens and inputs.shape[0] * inputs.shape[1] ** 2 >= _LONG_NUMBERS
    return tqdm(total=total, desc=description, unit=unit, disable=not (long if show_progress is None else show_progress))
