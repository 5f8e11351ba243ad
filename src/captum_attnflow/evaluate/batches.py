"""The batches an Evaluator reads: dicts of token ids (B, n) or pixel values (B, C, H, W), checked,
counted and moved to the model's device."""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import Tensor


def _to(value: Any, device: torch.device) -> Any:
    """A tensor, or a tuple of values (``additional_forward_args``), on ``device``."""
    if isinstance(value, Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_to(item, device) for item in value)
    return value


def _inputs(batch: Mapping[str, Any]) -> Tensor:
    """The batch's token ids, or the pixel values of an image batch."""
    return batch["input_ids"] if "input_ids" in batch else batch["pixel_values"]


def _batch_size(batch: Any) -> int:
    inputs = _inputs(batch) if isinstance(batch, Mapping) and ("input_ids" in batch or "pixel_values" in batch) else None
    pixels = isinstance(batch, Mapping) and "input_ids" not in batch
    if not isinstance(inputs, Tensor) or inputs.dim() != (4 if pixels else 2):
        raise TypeError(
            "each batch must be a dict whose 'input_ids' is a (B, n) tensor of token ids (or whose "
            "'pixel_values' is a (B, C, H, W) tensor of images)."
        )
    return inputs.shape[0]
