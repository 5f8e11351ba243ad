"""Putting a given attention into a Hugging Face model: transformers' attention-function interface.

Transformers 5 models call the function registered in ``ALL_ATTENTION_FUNCTIONS`` under
``config._attn_implementation`` as ``fn(module, query, key, value, attention_mask, scaling=...,
dropout=..., **kwargs) -> (attn_output, attn_weights)``. :func:`inject_attention` registers
one such function under a private name, points the model's configs at it for the block and
restores each config's own value afterwards, also after an exception. The function computes
the eager attention weights :math:`W = \\mathrm{softmax}(Q K^\\top s + M)`, hands them to the
user's ``replace(layer, W)`` and uses what comes back as the attention: the output is
:math:`\\mathrm{dropout}(W') V`. The model's weights and mode are not touched, and it leaves the
block with the forward hooks it had.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Callable, Iterator

import torch
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from captum_attnflow.hf.models import hf_models
from captum_attnflow.hf.state import SUBSTITUTED_ATTENTION, hooks_restored, implementation

_NAME = "captum_attnflow_injected"
_REPLACE: ContextVar[Callable[[int, Tensor], Tensor] | None] = ContextVar(_NAME, default=None)


def _injected_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[Tensor, Tensor]:
    replace = _REPLACE.get()
    if replace is None:
        raise RuntimeError(
            f"the attention implementation {_NAME!r} is only valid inside captum_attnflow's inject_attention block."
        )
    # Grouped-query attention: each key/value head serves several query heads.
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(-1, -2)) * (query.shape[-1] ** -0.5 if scaling is None else scaling)
    if attention_mask is not None:
        scores = scores + attention_mask[..., : key.shape[-2]]
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    layer = getattr(module, "layer_idx", None)
    if layer is None:
        raise ValueError(f"{type(module).__name__} has no layer_idx; inject_attention needs it to tell the layers apart.")
    new = replace(layer, weights)
    if not isinstance(new, Tensor) or new.shape != weights.shape:
        raise ValueError(
            f"replace(layer={layer}, weights) must return a tensor of the weights' shape {tuple(weights.shape)} "
            f"(B, H, n, n), got {getattr(new, 'shape', type(new).__name__)}."
        )
    new = new.to(value.dtype)
    output = torch.matmul(nn.functional.dropout(new, p=dropout, training=module.training), value)
    return output.transpose(1, 2).contiguous(), new


AttentionInterface.register(_NAME, _injected_attention)
# The function adds the mask to the scores, as eager attention does, so it needs eager's additive mask.
AttentionMaskInterface.register(_NAME, eager_mask)
SUBSTITUTED_ATTENTION.add(_NAME)  # explained with the weights it applies, not recomputed


@contextlib.contextmanager
def inject_attention(model: nn.Module, replace: Callable[[int, Tensor], Tensor]) -> Iterator[None]:
    """Context manager: inside the block, every attention layer of ``model`` uses ``replace``'s weights.

    Each attention layer computes its eager weights :math:`W_l` (B, H, n, n) (row = query) and
    calls ``replace(l, W_l)`` with ``l`` the layer's index from 0 (``module.layer_idx``); the
    returned (B, H, n, n) tensor is the attention the layer applies to its values, and the one
    ``output_attentions=True`` returns. Return ``W_l`` itself to keep a layer as it is, or a
    tensor that depends on trainable parameters to optimise an attention (gradients flow
    through it). Rows should be distributions over the real (non-padding) keys.

    Works for models whose attention layers call transformers' attention-function interface
    (``_supports_attention_backend``: GPT-2, BERT, Llama, the bundled models, ...). The
    models' attention implementations and forward hooks (transformers adds some for
    ``output_attentions=True``) are restored on exit, also when the block raises; weights and
    train/eval mode are not touched.

    Args:
        model: a Hugging Face model, or a module containing some.
        replace: ``replace(layer, weights) -> weights``, called once per layer and forward pass.

    Yields:
        None

    Raises:
        TypeError: ``model`` contains no Hugging Face model, or ``replace`` is not callable.

    Example::

        >>> import torch
        >>> from captum_attnflow.models.tagger import TaggerModel, yang_tagger_config
        >>> model = TaggerModel(yang_tagger_config()).eval()  # sdpa, as loaded
        >>> ids = torch.tensor([[2, 10, 11, 12]])
        >>> uniform = lambda layer, weights: torch.full_like(weights, 1 / weights.shape[-1])
        >>> with inject_attention(model, uniform):
        ...     output = model(ids, output_attentions=True)
        >>> output.attentions[0][0, 0, 0], model.config._attn_implementation
        (tensor([0.2500, 0.2500, 0.2500, 0.2500]), 'sdpa')
    """
    if not callable(replace):
        raise TypeError(f"replace must be a callable replace(layer, weights) -> weights, got {type(replace).__name__}.")
    if not hf_models(model):
        raise TypeError(f"{type(model).__name__} contains no Hugging Face PreTrainedModel to inject attention into.")
    token = _REPLACE.set(replace)
    try:
        # output_attentions=True makes transformers install output-capturing hooks for good;
        # the model leaves the block with the hooks it came with.
        with implementation(model, _NAME), hooks_restored(model):
            yield
    finally:
        _REPLACE.reset(token)
