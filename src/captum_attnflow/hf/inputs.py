"""What comes in with the inputs: tokenizer output, token ids, masks, targets, padding."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from captum_attnflow.hf.models import main_model


def unpack_inputs(inputs: Any, attention_mask: Tensor | None) -> tuple[Any, Tensor | None]:
    """``(input_ids, attention_mask)`` from a tokenizer's ``BatchEncoding`` or a dict, else the
    arguments as they are.

    Raises:
        ValueError: a dict without ``input_ids``, or a mask both in the dict and as ``attention_mask``.
    """
    if not isinstance(inputs, Mapping):
        return inputs, attention_mask
    if "input_ids" not in inputs:
        raise ValueError(
            f"inputs is a mapping with keys {list(inputs)} but no 'input_ids'; pass the tokenizer's output "
            "(return_tensors='pt') or the token ids tensor itself."
        )
    if attention_mask is not None and inputs.get("attention_mask") is not None:
        raise ValueError(
            "the attention mask was given twice, in inputs['attention_mask'] and as attention_mask=; pass it once."
        )
    return inputs["input_ids"], inputs.get("attention_mask", attention_mask)


def check_token_ids(inputs: Any, forward_func: Any = None) -> Tensor:
    """Check that ``inputs`` are (B, n) integer token ids within the model's vocabulary.

    Raises:
        TypeError: not a tensor, float or bool ids.
        ValueError: another shape, an empty batch or sequence, negative ids or ids past the
            vocabulary of the model's input embeddings.
    """
    if not isinstance(inputs, Tensor):
        raise TypeError(
            f"inputs must be a tensor of token ids (B, n) or the tokenizer's output, got {type(inputs).__name__}."
        )
    if inputs.dtype == torch.bool or inputs.dtype.is_floating_point or inputs.dtype.is_complex:
        raise TypeError(
            f"inputs must be integer token ids, got dtype {inputs.dtype}; pass input_ids (e.g. "
            "tokenizer(text, return_tensors='pt')['input_ids']), not a mask or embeddings."
        )
    if inputs.dim() != 2:
        raise ValueError(
            f"inputs must be token ids of shape (B, n), got shape {tuple(inputs.shape)}; "
            "for one sentence use inputs.unsqueeze(0)."
        )
    if inputs.shape[0] == 0:
        raise ValueError("empty batch: inputs hold no example (B = 0).")
    if inputs.shape[1] == 0:
        raise ValueError("empty sequence: inputs have no tokens (n = 0).")
    if bool((inputs < 0).any()):
        raise ValueError(f"token ids must be >= 0, found {int(inputs.min())}; pass the tokenizer's input_ids.")
    vocabulary = vocabulary_size(forward_func)
    if vocabulary is not None and bool((inputs >= vocabulary).any()):
        raise ValueError(
            f"token id {int(inputs.max())} is outside the model's vocabulary of {vocabulary} ids; "
            "encode the text with the model's own tokenizer."
        )
    return inputs


def vocabulary_size(forward_func: Any) -> int | None:
    """Rows of the input embedding of the (wrapped) Hugging Face model, or None if there is none."""
    model = main_model(forward_func)
    if model is None:
        return None
    try:
        embeddings = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    return embeddings.num_embeddings if isinstance(embeddings, nn.Embedding) else None


# Model types that read their padding as text by design: SigLIP's text tower was trained on texts
# padded to a fixed length without a mask, and pools its last position, padding included.
PADDING_READ = frozenset({"siglip_text_model"})


def warn_unmasked_padding(
    forward_func: Any, inputs: Tensor, attention_mask: Tensor | None, additional_forward_args: tuple = ()
) -> None:
    """Warn when ``inputs`` start or end with the model's pad token and no mask says so, neither
    ``attention_mask`` nor a mask in ``additional_forward_args`` (Captum's way): the padding would
    then be attended to like any token and shift every score."""
    model = main_model(forward_func)
    if attention_mask is not None or model is None or mask_in_args(forward_func, additional_forward_args) is not None:
        return
    if getattr(model.config, "model_type", None) in PADDING_READ:
        return
    pad = getattr(model.config, "pad_token_id", None)
    if not isinstance(pad, int):
        return
    ends = inputs[:, -1] == pad
    if pad != getattr(model.config, "bos_token_id", None):  # a sequence may start with BOS = pad
        ends |= inputs[:, 0] == pad
    if bool(ends.any()):
        warnings.warn(
            f"inputs contain the pad token (id {pad}) at the sequence ends of examples "
            f"{ends.nonzero().flatten().tolist()} but no attention_mask was given, so the padding is "
            "treated as text and changes every score; pass attention_mask (the tokenizer returns it).",
            UserWarning,
            stacklevel=3,
        )


def check_mask_not_in_args(forward_func: Any, additional_forward_args: tuple, attention_mask: Tensor | None) -> None:
    """Refuse a Hugging Face model's mask given twice: positionally in ``additional_forward_args``
    and as ``attention_mask=`` (Python would raise "got multiple values" deep inside)."""
    if attention_mask is None or not additional_forward_args or not isinstance(forward_func, PreTrainedModel):
        return
    parameters = list(inspect.signature(forward_func.forward).parameters)
    if "attention_mask" in parameters[1 : 1 + len(additional_forward_args)]:
        raise ValueError(
            f"additional_forward_args fills {type(forward_func).__name__}'s attention_mask argument and "
            "attention_mask= gives it again; pass the mask only as attention_mask=."
        )


def mask_in_args(forward_func: Any, additional_forward_args: tuple) -> Tensor | None:
    """The attention mask a Hugging Face model receives positionally from ``additional_forward_args``
    (``forward(input_ids, attention_mask, ...)``, Captum's way of passing it), or None."""
    if not additional_forward_args or not isinstance(forward_func, PreTrainedModel):
        return None
    parameters = list(inspect.signature(forward_func.forward).parameters)[1 : 1 + len(additional_forward_args)]
    return additional_forward_args[parameters.index("attention_mask")] if "attention_mask" in parameters else None


def lift_mask(forward_func: Any, additional_forward_args: tuple, attention_mask: Tensor | None) -> tuple[tuple, Tensor | None]:
    """``(args, attention_mask)`` with a Hugging Face model's mask given last in
    ``additional_forward_args`` taken out and returned as the mask: the model gets the same call,
    and the padding is known to be padding (attribution 0, left padding run as right padding)."""
    mask = mask_in_args(forward_func, additional_forward_args)
    if attention_mask is None and mask is not None and additional_forward_args[-1] is mask:
        return additional_forward_args[:-1], mask
    return additional_forward_args, attention_mask


def mask_keyword(forward_func: Any, args: tuple, attention_mask: Tensor | None) -> dict[str, Tensor]:
    """``{"attention_mask": attention_mask}`` for a wrapper (not a Hugging Face model) whose
    forward takes an argument named ``attention_mask`` that ``forward_func(inputs, *args)``
    leaves unfilled, else ``{}``.

    Such a wrapper then gets the mask the way a Hugging Face model does: the current one,
    e.g. the shortened rows' mask when a faithfulness metric removes tokens. A wrapper taking
    the mask positionally in ``args`` (or under another name) is called as before.
    """
    if attention_mask is None or isinstance(forward_func, PreTrainedModel):
        return {}
    function = forward_func.forward if isinstance(forward_func, nn.Module) else forward_func
    try:
        signature = inspect.signature(function)
        bound = signature.bind_partial(None, *args)
    except (TypeError, ValueError):  # builtins without a signature; arguments it cannot take
        return {}
    if "attention_mask" not in signature.parameters or "attention_mask" in bound.arguments:
        return {}
    return {"attention_mask": attention_mask}


def as_tuple(args: Any) -> tuple:
    """Captum's ``additional_forward_args`` as a tuple: None -> (), a value -> (value,)."""
    if args is None:
        return ()
    return args if isinstance(args, tuple) else (args,)


def real_tokens_first(mask: Tensor) -> Tensor | None:
    """(B, n) order that moves each row's real tokens to the front, in their order, or None when
    every row already has them there (no padding, or right padding).

    A left-padded row run in this order is the sentence followed by padding, which every model
    encodes exactly as the sentence alone; without it, absolute positions would count the padding.
    """
    mask = mask.bool()
    if not bool((mask[:, 1:] & ~mask[:, :-1]).any()):  # no real token after padding
        return None
    return (~mask).long().argsort(dim=-1, stable=True)


def reorder_tokens(values: Tensor, order: Tensor) -> Tensor:
    """``values`` (B, n, ...) with the token axis in ``order`` (B, n)."""
    index = order.reshape(*order.shape, *([1] * (values.dim() - 2))).expand_as(values)
    return values.gather(1, index)

