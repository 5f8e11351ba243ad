"""Validation of what enters the functional core: attention stacks, masks, layer and position indices.

Public so that the model boundary and the attribution classes check their arguments with the
same rules and messages as the functions they call.
"""

from __future__ import annotations

from typing import Any, Sequence, Union

import numpy as np

import torch
from torch import Tensor

Attentions = Union[Tensor, Sequence[Tensor]]

# Rows of a softmax computed in half precision sum to 1 only within a few 1e-4.
ROW_SUM_ATOL = 5e-3


def attention_layers(attentions: Attentions) -> list[Tensor]:
    """Validate the shape of Hugging Face attentions and return them as L tensors (B, H, n, n).

    Accepts what a transformers model returns for ``output_attentions=True`` (a sequence of L
    tensors (B, H, n, n), row = query) or one (L, B, H, n, n) tensor. Nothing is copied: the
    result holds the caller's tensors (or views of the one tensor), in their own dtype.
    """
    if isinstance(attentions, Tensor):
        if attentions.dim() != 5:
            raise ValueError(
                f"attentions as one tensor must have shape (L, B, H, n, n), got {tuple(attentions.shape)}; "
                "pass the per-layer tuple a transformers model returns for output_attentions=True, "
                "or stack it with torch.stack(attentions)."
            )
        layers = list(attentions.unbind(0))
    elif isinstance(attentions, (list, tuple)):
        layers = list(attentions)
    else:
        raise TypeError(
            "attentions must be a sequence of L tensors (B, H, n, n) or one (L, B, H, n, n) tensor, "
            f"got {type(attentions).__name__}."
        )
    if not layers:
        raise ValueError(
            "attentions is empty: the model returned no attention maps. Call it with "
            "output_attentions=True and eager attention (sdpa and flash attention return none)."
        )
    for index, layer in enumerate(layers):
        if not isinstance(layer, Tensor) or layer.dim() != 4:
            shape = tuple(layer.shape) if isinstance(layer, Tensor) else type(layer).__name__
            raise ValueError(f"attentions[{index}] must be a tensor of shape (B, H, n, n), got {shape}.")
        if layer.shape != layers[0].shape:
            raise ValueError(
                f"all layers must have the same shape (B, H, n, n); attentions[0] is "
                f"{tuple(layers[0].shape)} but attentions[{index}] is {tuple(layer.shape)}."
            )
        if layer.device != layers[0].device:
            raise ValueError(
                f"all layers must be on one device; attentions[0] is on {layers[0].device} but "
                f"attentions[{index}] is on {layer.device}."
            )
    batch, heads, rows, n = layers[0].shape
    if rows != n:
        raise ValueError(
            f"attention maps must be square (query, key) = (n, n), got {(rows, n)}; pass self-attention "
            "maps in the transformers layout (B, H, n, n)."
        )
    if n == 0:
        raise ValueError("empty sequence: the inputs have no tokens (n = 0).")
    if batch == 0 or heads == 0:
        raise ValueError(f"attentions must have at least one example and one head, got (B, H) = {(batch, heads)}.")
    if not layers[0].dtype.is_floating_point:
        raise TypeError(f"attentions must be floating point probabilities, got dtype {layers[0].dtype}.")
    return layers


def stack_attentions(attentions: Attentions) -> Tensor:
    """Stack Hugging Face attentions into one float32 tensor of shape (L, B, H, n, n).

    Accepts what a transformers model returns for ``output_attentions=True`` (a
    sequence of L tensors (B, H, n, n), row = query) or one (L, B, H, n, n) tensor.
    """
    if isinstance(attentions, Tensor):
        attention_layers(attentions)
        return attentions.float()
    return torch.stack(attention_layers(attentions)).float()


def check_attention_values(attentions: Tensor, mask: Tensor) -> None:
    """Check that attention rows of real query positions are probability distributions.

    Rows of padding queries are not checked: models fill them with anything (uniform, NaN).

    Args:
        attentions: (..., B, H, n, n) float attentions, e.g. one layer (B, H, n, n) or a stack
            (L, B, H, n, n).
        mask: (B, n) bool, True on real tokens.

    Raises:
        ValueError: a row of a real token holds NaN or infinite values, negative entries, or
            does not sum to 1.
    """
    check_row_statistics(attentions.sum(-1), attentions.clamp(max=0).sum(-1), mask)


def check_row_statistics(row_sums: Tensor, negative_sums: Tensor, mask: Tensor) -> None:
    """The checks of :func:`check_attention_values` on precomputed per-row statistics.

    Args:
        row_sums: (..., B, H, n), the sum of each attention row.
        negative_sums: (..., B, H, n), the sum of each row's negative entries (0 when there
            are none).
        mask: (B, n) bool, True on real tokens; padding rows are not checked.
    """
    padding = ~mask[:, None, :]
    row_sums = row_sums.masked_fill(padding, 1.0)
    if not torch.isfinite(row_sums).all():
        raise ValueError(
            "attentions contain NaN or infinite values in rows of real tokens; check the model's inputs "
            "(e.g. a row whose keys are all masked) and its dtype (fp16 overflow)."
        )
    negative = negative_sums.masked_fill(padding, 0.0).min().item()
    if negative < -1e-6:
        raise ValueError(
            f"attentions must be nonnegative (post-softmax probabilities), found a row whose negative "
            f"entries sum to {negative:.3g}; pass attention probabilities, not scores or logits."
        )
    deviation = (row_sums - 1).abs()
    worst = deviation.max().item()
    if worst > ROW_SUM_ATOL:
        raise ValueError(
            f"attention rows must sum to 1 (softmax outputs, row = query); found a row summing to "
            f"{row_sums.flatten()[deviation.argmax()].item():.4g}. Pass post-softmax attention probabilities "
            "in the transformers layout (B, H, query, key)."
        )


def as_mask(attention_mask: Tensor | None, batch: int, n: int, device: torch.device) -> Tensor:
    """Return a (B, n) bool mask, True on real tokens; all True when ``attention_mask`` is None.

    Raises:
        ValueError: the mask has another shape, holds values other than 0/1 (True/False), or
            marks an example as all padding.
    """
    if attention_mask is None:
        return torch.ones(batch, n, dtype=torch.bool, device=device)
    if not isinstance(attention_mask, Tensor):
        attention_mask = torch.as_tensor(attention_mask)
    if tuple(attention_mask.shape) != (batch, n):
        raise ValueError(
            f"attention_mask must have shape (B, n) = {(batch, n)}, got {tuple(attention_mask.shape)}; "
            "pass the tokenizer's attention_mask (1 = real token, 0 = padding)."
        )
    if attention_mask.dtype != torch.bool and not ((attention_mask == 0) | (attention_mask == 1)).all():
        # A 2 or a 0.5 is not a padding mask: models would scale or shift attention by it.
        odd = attention_mask[(attention_mask != 0) & (attention_mask != 1)].unique()[:5].tolist()
        raise ValueError(
            f"attention_mask must hold only 0 (padding) and 1 (real token), found {odd}; pass the "
            "tokenizer's attention_mask, or (mask > 0).long() for a mask of other values."
        )
    mask = attention_mask.to(device=device).bool()
    empty = (~mask.any(-1)).nonzero().flatten()
    if empty.numel():
        raise ValueError(f"examples {empty.tolist()} are all padding: attention_mask has no real token there.")
    return mask


def layer_indices(layer: int | None, num_layers: int) -> list[int]:
    """Turn ``layer`` (1..L, negative from the top, or None for all) into 0-based indices."""
    if layer is None:
        return list(range(num_layers))
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)):
        raise TypeError(f"layer must be an int (1..L or negative) or None, got {type(layer).__name__}.")
    layer = int(layer)
    if layer == 0 or not -num_layers <= layer <= num_layers:
        raise ValueError(
            f"layer={layer} is out of range for a model with L={num_layers} layers: use 1..{num_layers} "
            f"(the output of that layer), -1..-{num_layers} from the top, or None for all layers."
        )
    return [layer - 1 if layer > 0 else num_layers + layer]


POSITION_DOC = """the explained position(s), one meaning everywhere:

            * an int: the same position in every example (negative counts from n, as in
              Python indexing); the result has no position axis;
            * a (B,) integer tensor: one position per example, e.g. each example's last real
              token ``attention_mask.sum(1) - 1``; no position axis;
            * a list of S ints: the same S positions in every example; the result gets a
              position axis of size S right before the token axis;
            * a (B, S) integer tensor: S positions per example; position axis S.

            Positions must not fall on padding. Float and bool values are refused."""


def positions(position: Any, mask: Tensor, name: str = "position") -> tuple[Tensor, bool]:
    """Turn ``position`` (see ``POSITION_DOC``) into a (B, S) LongTensor of indices in 0..n-1.

    Args:
        position: an int, a list of ints, a (B,) or a (B, S) integer tensor.
        mask: (B, n) bool, True on real tokens.
        name: the argument's name in the caller, for error messages.

    Returns:
        tuple: ``(indices (B, S), has_axis)``; ``has_axis`` is False for an int or a (B,)
        tensor (S = 1, the caller drops the axis), True for a list or a (B, S) tensor.

    Raises:
        TypeError: float, bool, string or other non-integer positions.
        ValueError: a shape that fits no form above, an empty list, a position out of range or
            on padding.
    """
    batch, n = mask.shape
    if isinstance(position, Tensor):
        if position.dtype.is_floating_point or position.dtype.is_complex or position.dtype == torch.bool:
            raise TypeError(
                f"{name} must hold integer token indices, got a tensor of dtype {position.dtype}; "
                "convert it with .long()."
            )
        if position.dim() == 0:
            indices, has_axis = position.reshape(1, 1).expand(batch, 1), False
        elif position.dim() == 1 and position.shape[0] == batch:
            indices, has_axis = position[:, None], False
        elif position.dim() == 2 and position.shape[0] == batch:
            indices, has_axis = position, True
        else:
            raise ValueError(
                f"{name} as a tensor must be (B,) = ({batch},), one per example, or (B, S) with B = {batch}, "
                f"got shape {tuple(position.shape)}; for the same positions in every example pass a list of ints."
            )
        indices = indices.to(mask.device, torch.long)
    elif isinstance(position, (int, np.integer)) and not isinstance(position, (bool, np.bool_)):
        indices, has_axis = torch.full((batch, 1), int(position), dtype=torch.long, device=mask.device), False
    elif isinstance(position, (list, tuple)):
        if not position:
            raise ValueError(f"{name} is an empty list: pass at least one position.")
        if not all(isinstance(p, (int, np.integer)) and not isinstance(p, (bool, np.bool_)) for p in position):
            raise TypeError(f"a list of {name} must hold ints, got {position!r}.")
        indices = torch.tensor([int(p) for p in position], dtype=torch.long, device=mask.device).expand(batch, -1)
        has_axis = True
    else:
        raise TypeError(
            f"{name} must be an int, a list of ints, or a (B,) or (B, S) integer tensor, got {type(position).__name__}."
        )
    if indices.shape[1] == 0:
        raise ValueError(f"{name} has no entries (S = 0): pass at least one position per example.")
    if ((indices < -n) | (indices >= n)).any():
        raise ValueError(f"{name} {indices.squeeze(-1).tolist()} is out of range for sequences of n={n} tokens.")
    indices = indices % n
    on_padding = ~mask.gather(1, indices)
    if on_padding.any():
        bad = on_padding.any(1).nonzero().flatten().tolist()
        raise ValueError(
            f"{name} falls on a padding token in examples {bad}; pass a (B,) LongTensor of real positions "
            "(e.g. attention_mask.sum(1) - 1 for the last real token with right padding)."
        )
    return indices, has_axis


def default_position(mask: Tensor, causal: bool) -> Tensor:
    """The position explained when none is given, (B,): each example's last real token for
    causal (decoder) attention, where only the last token has seen the whole input; else 0,
    the CLS token of an encoder."""
    if not causal:
        return torch.zeros(mask.shape[0], dtype=torch.long, device=mask.device)
    columns = torch.arange(mask.shape[1], device=mask.device)
    return torch.where(mask, columns, -1).amax(1)


def head_indices(head: int | str | None, num_heads: int) -> list[int] | None:
    """Turn ``head`` (None for fused heads, an int k, or ``"all"``) into 0-based head indices."""
    if head is None:
        return None
    if head == "all":
        return list(range(num_heads))
    if isinstance(head, bool) or not isinstance(head, (int, np.integer)):
        raise TypeError(f'head must be None (heads fused), an int or "all", got {head!r}.')
    if not -num_heads <= int(head) < num_heads:
        raise ValueError(f"head={head} is out of range for layers of H={num_heads} heads: use 0..{num_heads - 1}.")
    return [int(head) % num_heads]


def shape_result(scores: Tensor, layer: int | None, has_position_axis: bool, head: int | str | None = None) -> Tensor:
    """Drop the axes the caller did not ask for from (layers, [H,] B, S, n) scores: the layer
    axis for one layer, the head axis for one head, the position axis for one position per example."""
    if not has_position_axis:
        scores = scores.squeeze(-2)
    if head is not None and head != "all":
        scores = scores.squeeze(1)
    return scores[0] if layer is not None else scores


def check_residual_alpha(residual_alpha: float) -> None:
    if isinstance(residual_alpha, bool) or not isinstance(residual_alpha, (int, float, np.floating, np.integer)):
        raise TypeError(
            f"residual_alpha must be a number in [0, 1] (weight of attention against the residual identity), "
            f"got {type(residual_alpha).__name__}; the paper uses 0.5, 1.0 gives raw attention."
        )
    if not 0.0 <= float(residual_alpha) <= 1.0:
        raise ValueError(
            f"residual_alpha must lie in [0, 1] (weight of attention against the residual identity), "
            f"got {residual_alpha}; the paper uses 0.5."
        )


def matrix_rows(maps: Tensor, position: Any, layer: int | None, mask: Tensor) -> Tensor:
    """Rows of per-layer token-to-token matrices ``maps`` (L, B, n, n) for ``position`` after
    ``layer`` (see ``POSITION_DOC``; None: the last real token when every matrix is causal,
    else 0), shaped as every method returns them: (B, n), (L, B, n), (..., S, n); padding 0."""
    if position is None:
        position = default_position(mask, not bool(maps.triu(1).any()))
    sources, has_axis = positions(position, mask)
    picked = torch.arange(maps.shape[1], device=maps.device)[:, None]
    scores = torch.stack([maps[index][picked, sources] for index in layer_indices(layer, maps.shape[0])])
    return shape_result(scores * mask[:, None, :], layer, has_axis)
