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
(grouped-query heads repeated): rollout walks the layers top-down multiplying its rows by each
layer block by block (the (B, n, n) layer is never written out; of the top layer only the
explained rows are computed), raw attention computes only the rows it returns, flow builds the
L·n² fused graph; the per-head maps never exist whole. The blocks are sized for the device (the
CPU's caches, or a share of a GPU's free memory), and on a CUDA device they run in the Triton
kernels of :mod:`captum_attnflow.capture.lean_triton`, which keep every head's scores on chip.

It applies to models whose attention goes through the interface with queries, keys, a mask
from transformers' mask functions (sliding windows included), a scaling factor and optionally
Gemma 2's soft-capping :math:`c \\tanh(x / c)` of the scores, and nothing else that changes the
scores (no relative position bias or sinks): the model types in :data:`LEAN_MODEL_TYPES`, all
tested against the maps the model returns itself. A call carrying anything else
(:func:`captured_scores`) leaves the capture incomplete, and the model is explained from eager
attention and ``output_attentions`` (the stored-maps path), as are other models.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import threading
import weakref
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils.generic import TransformersKwargs

from captum_attnflow.capture.lean_blocks import AttentionScores, _scratch_size, fused_blocks, fused_rows, row_product
from captum_attnflow.hf.models import hf_models
from captum_attnflow.hf.state import implementation, register_attention, uses_substituted_attention

LEAN_MODEL_TYPES = frozenset(
    {"bert", "roberta", "xlm-roberta", "distilbert", "electra", "albert", "modernbert",
     "gpt2", "gpt_neox", "gptj", "opt", "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "olmo2", "phi3",
     "gemma2", "gemma3_text", "vit", "deit", "dinov2", "clip_text_model", "clip_vision_model", "siglip_text_model",
     "siglip_vision_model", "captum_attnflow_agreement"}
)
_NAME = "captum_attnflow_lean"
# A row product walks a layer's tiles once for every 64 vectors: beyond this many, the blocks
# (written once, multiplied by any number of vectors) cost less.
_PRODUCT_VECTORS = 256


def supports_lean(model: nn.Module) -> bool:
    """Whether :func:`lean_capture` applies to ``model``: a model type of :data:`LEAN_MODEL_TYPES`
    computing its own attention (not one put in by :func:`~captum_attnflow.capture.inject_attention`)."""
    return (
        isinstance(model, PreTrainedModel)
        and all(getattr(m.config, "model_type", None) in LEAN_MODEL_TYPES for m in hf_models(model))
        and not uses_substituted_attention(model)
    )


class LeanCapture:
    """What one call collects: each attention layer's queries and keys (and mask), in call order.

    Keeping them costs 2·n·H·d numbers per layer where the maps cost H·n², 2d/n as much (at
    n = 4096 and d = 64, 1/32); :meth:`fused_layer` turns them into the layer's head-fused
    probabilities when asked, one layer at a time.
    """

    def __init__(self, num_layers: int, head_fusion: str, saved: str, device: torch.device | None = None) -> None:
        self.num_layers = num_layers
        self.head_fusion = head_fusion
        # Layers of a model dispatched over several devices are gathered on this one (2·n·H·d numbers each).
        self.device = device
        self.implementation = saved  # the model's own, which computes each layer's output
        self.layers: list[AttentionScores] = []
        # Set by a call whose scores hold a term this capture cannot recompute.
        self.refused = False
        # The row blocks' buffers, one per thread (a graph may be walked by several at once),
        # shared by all layers that thread computes.
        self._scratch = threading.local()

    def add(self, scores: AttentionScores | None) -> None:
        """Keep one call's ``scores`` (on the capture's device); None: the call could not be
        recomputed (:func:`captured_scores`), so the capture is not :attr:`complete`."""
        if len(self.layers) == self.num_layers:
            raise ValueError(
                f"the model ran more than its {self.num_layers} attention layers in one call; "
                "explain it with lean=False (eager attention and stored maps)."
            )
        if scores is None or self.refused:
            self.refused = True
            return
        moved = {name: getattr(scores, name) for name in ("query", "key", "mask")}
        moved = {name: None if t is None else t.to(self.device or t.device) for name, t in moved.items()}
        self.layers.append(dataclasses.replace(scores, **moved))

    @property
    def complete(self) -> bool:
        """Whether every layer of the model went through the lean attention function, each with
        scores it can recompute."""
        return not self.refused and len(self.layers) == self.num_layers

    @property
    def causal(self) -> bool:
        """Whether every layer attended causally: no query may see a later key."""
        return all(layer.attends_causally for layer in self.layers)

    def fused_layer(self, index: int, rows: Tensor | None = None, out: Tensor | None = None) -> Tensor:
        """Head-fused attention probabilities float32 of layer ``index``: (B, n, n), or (B, S, n)
        for the query rows ``rows`` (B, S) only; written into ``out`` if given."""
        layer = self.layers[index]
        if out is None:
            count = layer.query.shape[2] if rows is None else rows.shape[1]
            out = torch.empty(layer.query.shape[0], count, layer.key.shape[2], dtype=torch.float32, device=layer.query.device)
        if rows is not None:
            return fused_rows(layer, self.head_fusion, rows, out)
        for start, stop, block in self.fused_blocks(index, out):
            out[:, start:stop, block.shape[-1]:] = 0.0  # keys a causal block cannot see
        return out

    def fused_blocks(self, index: int, out: Tensor | None = None) -> Iterator[tuple[int, int, Tensor]]:
        """:func:`fused_blocks` of layer ``index``, in buffers shared by all layers."""
        layer = self.layers[index]
        scratch = getattr(self._scratch, "buffer", None)
        if scratch is None or scratch.numel() < _scratch_size(layer) or scratch.device != layer.query.device:
            # Kept for every layer: fresh buffers this size would be mapped, page-faulted and
            # zeroed by the system on every layer (about 30 ms of 300 at n = 4096).
            scratch = torch.empty(_scratch_size(layer), dtype=torch.float32, device=layer.query.device)
            self._scratch.buffer = scratch
        return fused_blocks(layer, self.head_fusion, scratch, out)


    def row_product(self, index: int, real_keys: Tensor, vectors: int) -> Any | None:
        """:func:`row_product` of layer ``index`` (heads fused by their mean) for ``vectors`` row
        vectors, with the probability on ``real_keys`` (B, n); None where it does not serve
        (no kernels, another head fusion, more vectors than a few walks of the tiles take)."""
        if self.head_fusion != "mean" or vectors > _PRODUCT_VECTORS:
            return None
        layer = self.layers[index]
        return row_product(layer, layer.query.shape[2], real_keys=real_keys)


_CAPTURES: "weakref.WeakKeyDictionary[nn.Module, LeanCapture]" = weakref.WeakKeyDictionary()


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
    function = own_attention(capture.implementation, module, kwargs)
    output = function(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    capture.add(captured_scores(module, query, key, attention_mask, scaling, kwargs))
    return output[0], None


def own_attention(implementation: str, module: nn.Module, kwargs: dict[str, Any]) -> Callable[..., Any]:
    """The attention function that computes a call's output as the model loaded with
    ``implementation`` does: that function from transformers' registry; for eager, whose function
    lives in each model's own module, sdpa (equal up to rounding), or that module's
    ``eager_attention_forward`` (given the additive mask it takes) where sdpa cannot take the
    call (soft-capping, attention sinks and other terms unknown to :func:`captured_scores`)."""
    function = ALL_ATTENTION_FUNCTIONS.get(implementation)
    if function is not None:
        return function
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None or (kwargs.get("softcap") is None and not _unknown_terms(kwargs)):
        return sdpa_attention_forward
    return functools.partial(_with_additive_mask, eager)


def _with_additive_mask(
    eager: Callable[..., Any], module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
    attention_mask: Tensor | None, **kwargs: Any,
) -> Any:
    """``eager`` called with the mask eager attention adds to its scores (0 where allowed, the
    dtype's minimum elsewhere: transformers' ``eager_mask``) made from the mask the lean
    functions get, sdpa's (bool, True = attend; None: causal or no masking, as sdpa reads it)."""
    if attention_mask is None:
        if not scale_and_causality(module, query, None, None, kwargs)[1]:
            return eager(module, query, key, value, None, **kwargs)
        queries, keys = query.shape[2], key.shape[2]
        attention_mask = torch.ones(queries, keys, dtype=torch.bool, device=query.device).tril(keys - queries)[None, None]
    if attention_mask.dtype == torch.bool:
        blocked = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device)
        attention_mask = blocked.masked_fill_(~attention_mask, torch.finfo(query.dtype).min)
    return eager(module, query, key, value, attention_mask, **kwargs)


# Keyword arguments of an attention-function call that leave its scores q k^T s + M as they are:
# those transformers passes every model (positions, packed-sequence lengths, flags), and flags of
# single families. scaling, is_causal, softcap and sliding_window are read by captured_scores.
_NEUTRAL_KEYWORDS = frozenset(TransformersKwargs.__annotations__) | {
    "dropout", "use_cache", "cache_position", "past_key_values", "position_embeddings", "deterministic",
    "encoder_hidden_states", "softcap", "sliding_window",
}


def _unknown_terms(kwargs: dict[str, Any]) -> bool:
    """Whether an attention-function call's keyword arguments hold one not known to leave its scores unchanged."""
    return any(value is not None and name not in _NEUTRAL_KEYWORDS for name, value in kwargs.items())


def captured_scores(
    module: nn.Module, query: Tensor, key: Tensor, attention_mask: Tensor | None, scaling: float | None,
    kwargs: dict[str, Any],
) -> AttentionScores | None:
    """The :class:`AttentionScores` of one attention-function call (queries (B, H, n, d), keys
    (B, H_kv, n_k, d)), detached, or None where the call carries a score term they cannot hold.

    Every term is read from the call: the scaling and causality (:func:`scale_and_causality`),
    the mask (sliding windows are in it, built by transformers' mask functions), Gemma 2's
    ``softcap``. None for any other keyword argument not known to leave the scores unchanged
    (attention sinks, a position bias: recomputing without it would be wrong), and for a
    ``sliding_window`` smaller than the keys without a mask to hold it.
    """
    window = kwargs.get("sliding_window")
    if _unknown_terms(kwargs) or (window is not None and attention_mask is None and key.shape[2] > window):
        return None
    scale, causal = scale_and_causality(module, query, attention_mask, scaling, kwargs)
    mask = None if attention_mask is None else attention_mask.detach()
    softcap = kwargs.get("softcap")
    return AttentionScores(query.detach(), key.detach(), mask, scale, causal, None if softcap is None else float(softcap))


def scale_and_causality(
    module: nn.Module, query: Tensor, attention_mask: Tensor | None, scaling: float | None, kwargs: dict[str, Any]
) -> tuple[float, bool]:
    """What an attention-function call (queries (B, H, n, d)) implies for its scores
    :math:`q k^\\top s + M`: the scaling :math:`s` (:math:`d^{-1/2}` where the model passes
    None, as sdpa takes it) and whether a call without a mask is causal (several query rows and
    ``is_causal``, the call's or else the module's, as sdpa reads it)."""
    causal = attention_mask is None and query.shape[2] > 1 and kwargs.get("is_causal", getattr(module, "is_causal", True))
    return query.shape[-1] ** -0.5 if scaling is None else scaling, bool(causal)


@contextlib.contextmanager
def lean_capture(
    model: PreTrainedModel, head_fusion: str = "mean", device: torch.device | None = None
) -> Iterator[LeanCapture]:
    """Context manager: a call of ``model`` inside the block collects each layer's head-fused attention.

    Yields the :class:`LeanCapture` that collects the queries and keys of each attention layer,
    in call order (L = ``config.num_hidden_layers`` of them), on ``device`` if given (the
    layers of a model dispatched over several devices), else where each layer ran. The model's attention
    implementation (every config and sub-config) is switched for the block and restored exactly
    afterwards, also when the call raises; the model is locked against other threads for the block.
    """
    register_attention(_NAME, _lean_attention, sdpa_mask)  # the masks sdpa gets: bool, or None to skip
    with implementation(model, _NAME) as own:
        capture = LeanCapture(model.config.num_hidden_layers, head_fusion, own(model), device)
        modules = list(model.modules())
        try:
            for module in modules:
                _CAPTURES[module] = capture
            yield capture
        finally:
            for module in modules:
                _CAPTURES.pop(module, None)
