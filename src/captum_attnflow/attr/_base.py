"""What every attention-based attribution shares: Captum's interface, input checks, extraction."""

from __future__ import annotations

from typing import Any, Callable

from captum.attr import Attribution
from torch import Tensor

from captum_attnflow._docstrings import fill_docstring
from captum_attnflow.extraction import extract_attentions

_CONSTRUCTOR_DOC = """Args:
        forward_func: a Hugging Face model, an ``nn.Module`` wrapping one, or a callable
            ``forward_func(inputs, *additional_forward_args)`` returning attentions
            (see :func:`captum_attnflow.extraction.extract_attentions`). The model is left
            as it was: eager attention, eval mode and hooks only for the duration of a call."""

# Fills ``{init}`` in a class docstring with the constructor's arguments.
with_constructor_args = fill_docstring(init=_CONSTRUCTOR_DOC)


@with_constructor_args
class AttentionAttribution(Attribution):
    """Base of the attention-based attributions: class-agnostic, gradient-free, no convergence delta.

    {init}
    """

    def __init__(self, forward_func: Callable[..., Any]) -> None:
        super().__init__(forward_func)

    def has_convergence_delta(self) -> bool:
        """False: these methods compute no convergence delta (Captum's interface)."""
        return False

    def _attentions(
        self, inputs: Tensor, additional_forward_args: Any, attention_mask: Tensor | None
    ) -> tuple[Tensor, ...]:
        """Check ``inputs`` and return the model's attentions for them.

        ``inputs`` are token ids (B, n), or pixel values (B, C, H, W) of a vision transformer,
        whose n tokens ([CLS] and the patches) come from the model.
        """
        if not isinstance(inputs, Tensor):
            raise TypeError(f"inputs must be a tensor of token ids (B, n), got {type(inputs).__name__}.")
        images = inputs.dtype.is_floating_point and inputs.dim() == 4
        if images:
            if attention_mask is not None:
                raise ValueError(
                    "attention_mask was given with image inputs (B, C, H, W): images have no padding, drop it."
                )
        elif inputs.dim() != 2:
            raise ValueError(
                f"inputs must be token ids of shape (B, n), got shape {tuple(inputs.shape)}; "
                "for one sentence use inputs.unsqueeze(0) (images: pixel values (B, C, H, W))."
            )
        elif inputs.shape[1] == 0:
            raise ValueError("empty sequence: inputs have no tokens (n = 0).")
        elif inputs.dtype.is_floating_point:
            raise TypeError(
                f"inputs must be integer token ids, got dtype {inputs.dtype}; these methods explain "
                "tokens, so pass input_ids rather than embeddings."
            )
        attentions = extract_attentions(self.forward_func, inputs, additional_forward_args, attention_mask)
        first = attentions[0]
        batch = inputs.shape[0]
        n = first.shape[-1] if images else inputs.shape[1]
        if first.dim() != 4 or first.shape[0] != batch or tuple(first.shape[-2:]) != (n, n):
            raise ValueError(
                f"forward_func returned attentions of shape {tuple(first.shape)} for inputs of shape "
                f"{tuple(inputs.shape)}; expected one (B, H, n, n) = ({batch}, H, {n}, {n}) tensor per layer, "
                "row = query, as transformers returns for output_attentions=True."
            )
        return attentions

    @staticmethod
    def _on_device(attributions: Tensor, inputs: Tensor) -> Tensor:
        return attributions.to(inputs.device)


_ATTRIBUTE_ARGS_DOC = """
        Args:
            inputs (Tensor): token ids, shape (B, n); or, for a vision transformer (ViT,
                DeiT, ...), pixel values (B, C, H, W): then the n explained tokens are the
                model's ([CLS] and the patches, in the model's order) and the result is (B, n).
            target: accepted for compatibility with Captum and ignored: attention-based
                attributions are class-agnostic, they explain a position's representation,
                not a class score.
            additional_forward_args (Any, optional): extra positional arguments passed to
                ``forward_func`` after ``inputs``.
            position (int or Tensor, optional): the explained position: an int for every
                example (negative counts from n, like Python indexing) or a (B,) LongTensor,
                e.g. the mask position of each example. Default: 0 (the CLS token).
            layer (int or None, optional): explain the representation at the output of this
                layer, 1..L, or negative from the top (-1 = last layer). None returns every
                layer. Default: -1.
            head_fusion (str, optional): how heads are combined per layer: ``"mean"``
                (the paper's), ``"max"`` or ``"min"``.
            residual_alpha (float, optional): weight of attention against the residual
                connection, :math:`A = \\alpha W + (1 - \\alpha) I`, rows renormalised.
            attention_mask (Tensor, optional): (B, n), 1 on real tokens, 0 on padding, as
                the tokenizer returns it. Padding gets attribution 0 and never influences
                real tokens. It is passed to a Hugging Face model as ``attention_mask``.
"""

# Fills ``{args}`` in an ``attribute`` docstring with the arguments all attention methods share.
with_attribute_args = fill_docstring(args=_ATTRIBUTE_ARGS_DOC)
