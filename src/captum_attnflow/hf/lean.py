"""Lean capture: each layer's attention reduced to the head-fused (B, n, n) matrix during the forward.

Asking a model for ``output_attentions`` makes it compute eager attention and keep every layer's
(B, H, n, n) maps, L·H·n² numbers: 7 GiB for BERT-base at n = 4096. The lean path instead
registers an attention function with transformers' attention-function interface
(``transformers.AttentionInterface``) and switches the model to it for one call. Each attention
layer then

1. computes its output with the model's own implementation (``sdpa`` as loaded, so the model's
   outputs are what they always are), and
2. keeps the queries and keys it was given (after rotary embeddings), 2·n·H·d numbers
   instead of the H·n² of its maps.

Afterwards each layer's probabilities :math:`\\operatorname{softmax}(q k^\\top s + M)` are
recomputed when a method asks for that layer, in blocks of rows whose heads are fused at once
(grouped-query heads repeated): rollout walks the layers top-down holding one fused (B, n, n)
layer at a time; flow and raw attention build the L·n² fused graph; the per-head maps never
exist whole.

It applies to models whose attention goes through the interface with queries, keys, a mask
from transformers' mask functions and a scaling factor, and nothing else that changes the
scores (no relative position bias, soft-capping or sinks): the model types in
:data:`LEAN_MODEL_TYPES`, all tested against the maps the model returns itself. Other models
use eager attention and ``output_attentions`` (the stored-maps path).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Any, Iterator

import torch
from torch import Tensor, nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from captum_attnflow.functional.graph import fuse_heads
from captum_attnflow.hf.models import hf_models
from captum_attnflow.hf.state import exclusive, implementation

LEAN_MODEL_TYPES = frozenset(
    {"bert", "roberta", "xlm-roberta", "distilbert", "gpt2", "llama", "mistral", "qwen2", "vit", "deit",
     "captum_attnflow_agreement"}
)
_NAME = "captum_attnflow_lean"
# Per-head probabilities of one block of rows take at most about this many bytes: small blocks
# stay in cache through matmul, softmax and fusion (8 MiB measured fastest at n = 4096 on 2 cores).
_BLOCK_BYTES = 8 * 2**20


def supports_lean(model: nn.Module) -> bool:
    """Whether :func:`lean_capture` applies to ``model`` (see :data:`LEAN_MODEL_TYPES`)."""
    return isinstance(model, PreTrainedModel) and all(
        getattr(m.config, "model_type", None) in LEAN_MODEL_TYPES for m in hf_models(model)
    )


class LeanCapture:
    """What one call collects: each attention layer's queries and keys (and mask), in call order.

    Keeping them costs 2·n·H·d numbers per layer where the maps cost H·n², 2d/n as much (at
    n = 4096 and d = 64, 1/32); :meth:`fused_layer` turns them into the layer's head-fused
    probabilities when asked, one layer at a time.
    """

    def __init__(self, num_layers: int, head_fusion: str, saved: str) -> None:
        self.num_layers = num_layers
        self.head_fusion = head_fusion
        # The output of each layer is computed as the model computes it when loaded: with its
        # own implementation from the registry, or sdpa (equal up to rounding) for eager, whose
        # function lives in each model's own module.
        self.output_function = ALL_ATTENTION_FUNCTIONS.get(saved, sdpa_attention_forward)
        self.layers: list[tuple[Tensor, Tensor, Tensor | None, float, bool]] = []

    def add(self, query: Tensor, key: Tensor, mask: Tensor | None, scaling: float, causal: bool) -> None:
        if len(self.layers) == self.num_layers:
            raise ValueError(
                f"the model ran more than its {self.num_layers} attention layers in one call; "
                "explain it with lean=False (eager attention and stored maps)."
            )
        self.layers.append((query.detach(), key.detach(), None if mask is None else mask.detach(), scaling, causal))

    @property
    def complete(self) -> bool:
        """Whether every layer of the model went through the lean attention function."""
        return len(self.layers) == self.num_layers

    @property
    def causal(self) -> bool:
        """Whether every layer attended causally: no query may see a later key."""
        for query, _, mask, _, causal in self.layers:
            if mask is None and not causal and query.shape[2] > 1:
                return False
            if mask is not None:
                allowed = mask if mask.dtype == torch.bool else mask == 0  # additive masks: 0 where allowed
                if bool(allowed.triu(1).any()):
                    return False
        return True

    def fused_layer(self, index: int) -> Tensor:
        """Head-fused attention probabilities (B, n, n) float32 of layer ``index``."""
        query, key, mask, scaling, causal = self.layers[index]
        out = torch.empty(query.shape[0], query.shape[2], key.shape[2], dtype=torch.float32, device=query.device)
        return fused_probabilities(query, key, mask, scaling, causal, self.head_fusion, out)


_CAPTURES: "weakref.WeakKeyDictionary[nn.Module, LeanCapture]" = weakref.WeakKeyDictionary()
_REGISTERED = threading.Lock()


def _lean_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    capture = _CAPTURES[module]
    output = capture.output_function(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    causal = attention_mask is None and query.shape[2] > 1 and kwargs.get("is_causal", getattr(module, "is_causal", True))
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    capture.add(query, key, attention_mask, scale, bool(causal))
    return output[0], None


def fused_probabilities(
    query: Tensor, key: Tensor, mask: Tensor | None, scaling: float, causal: bool, head_fusion: str, out: Tensor
) -> Tensor:
    """Head-fused attention probabilities (B, n, n) from queries (B, H, n, d) and keys (B, H_kv, n, d).

    :math:`P_h = \\operatorname{softmax}(q_h k_h^\\top s + M)`, computed in float32 one block of
    rows at a time and fused over heads per block, so the per-head maps never exist whole. ``mask``
    is transformers' 4-D mask for the query rows (bool, True = attend, or additive), or None;
    ``causal`` masks later keys when there is no mask. Rows without any allowed key (padding
    queries) come out 0.
    """
    batch, heads, n, _ = query.shape
    if key.shape[1] != heads:  # grouped-query attention: each key head serves several query heads
        key = key.repeat_interleave(heads // key.shape[1], dim=1)
    keys = key.float().transpose(-1, -2)
    block = max(1, _BLOCK_BYTES // (4 * batch * heads * key.shape[2]))
    for start in range(0, n, block):
        stop = min(n, start + block)
        # Causal attention without a mask: the block's rows see keys up to ``stop`` only, so the
        # later keys are neither multiplied nor normalised (half the work over the whole map).
        width = stop if causal and mask is None else keys.shape[-1]
        # Few passes over the (B, H, rows, n) block, which is memory-bound: the scaling on the
        # queries (rows x d), the masks in place, then one softmax and one fusion pass.
        scores = torch.matmul(query[:, :, start:stop].float() * scaling, keys[..., :width])
        if mask is not None:
            rows = mask[..., start:stop, :]
            if rows.dtype == torch.bool:
                scores.masked_fill_(~rows, float("-inf"))
            else:
                scores.add_(rows.float())
        elif causal:
            later = torch.ones(stop - start, width, dtype=torch.bool, device=query.device).triu(start + 1)
            scores.masked_fill_(later, float("-inf"))
        probabilities = torch.softmax(scores, dim=-1)
        del scores
        if mask is not None:
            probabilities.nan_to_num_(0.0)  # a padding query with no allowed key: 0
        out[:, start:stop, :width] = fuse_heads(probabilities, head_fusion)
        out[:, start:stop, width:] = 0.0
    return out


def _register() -> None:
    with _REGISTERED:
        if _NAME not in ALL_ATTENTION_FUNCTIONS:
            AttentionInterface.register(_NAME, _lean_attention)
            AttentionMaskInterface.register(_NAME, sdpa_mask)  # the masks sdpa gets: bool, or None to skip


@contextlib.contextmanager
def lean_capture(model: PreTrainedModel, head_fusion: str = "mean") -> Iterator[LeanCapture]:
    """Context manager: a call of ``model`` inside the block collects each layer's head-fused attention.

    Yields the :class:`LeanCapture` that collects the queries and keys of each attention layer,
    in call order (L = ``config.num_hidden_layers`` of them). The model's attention
    implementation (every config and sub-config) is switched for the block and restored exactly
    afterwards, also when the call raises; the model is locked against other threads for the block.
    """
    _register()
    with exclusive(model):
        capture = LeanCapture(model.config.num_hidden_layers, head_fusion, model.config._attn_implementation)
        modules = list(model.modules())
        try:
            for module in modules:
                _CAPTURES[module] = capture
            with implementation(model, _NAME):
                yield capture
        finally:
            for module in modules:
                _CAPTURES.pop(module, None)
