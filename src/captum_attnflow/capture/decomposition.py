"""Per-layer contribution maps that look inside the transformer blocks: ALTI, the norms of the
weighted value vectors, and value zeroing, for the models of :data:`~captum_attnflow.hf.architectures.ARCHITECTURES`.

One forward pass collects each layer's attention, values and block input
(:func:`~captum_attnflow.capture.internals.capture_internals`; for the families whose attention
runs in their own modules, the probabilities those modules return), and each block's map is computed as
soon as that block has run; the architecture table supplies the output projection, the
LayerNorm and the rest of each block; the maths is :mod:`captum_attnflow.functional.decomposition`.

Where the lean capture applies (:func:`~captum_attnflow.capture.lean.supports_lean`) the model runs
its own attention (``sdpa`` as loaded) and keeps each layer's queries and keys; the block's
per-head probabilities are then recomputed in blocks of rows (:mod:`captum_attnflow.capture.lean_heads`),
each consumed by ALTI's and the norms' kernels before the next is made, so no (B, H, n, n)
tensor exists (value zeroing, whose n variants cost far more than the maps, recomputes the
layer's maps whole, one layer at a time). Other models, and calls whose attention holds a term
the lean capture cannot recompute, run eager attention and keep one layer's (B, H, n, n)
probabilities at a time, dropped once that block's map is made.

On a model dispatched by accelerate each block is computed on the device it ran on, its
weights read through accelerate's hooks (:func:`~captum_attnflow.hf.dispatch.onloaded`: loaded
from the CPU or disk when offloaded), one block at a time; the maps are gathered on the
inputs' device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, NamedTuple

import torch
from torch import Tensor, nn

from captum_attnflow.capture.internals import Internals, capture_internals
from captum_attnflow.capture.lean import supports_lean
from captum_attnflow.capture.lean_blocks import AttentionScores
from captum_attnflow.capture.lean_heads import head_blocks
from captum_attnflow.functional import decomposition
from captum_attnflow.functional.kernels import block_bytes
from captum_attnflow.hf.architectures import Architecture, architecture_of, layer_norm_parameters, projection_weight
from captum_attnflow.hf.dispatch import onloaded
from captum_attnflow.hf.inputs import reorder_tokens
from captum_attnflow.hf.models import hf_models, main_model, outermost, owning_module

# Zeroed variants of one layer run together in chunks of about this many hidden numbers
# (4 D per token: the feed-forward's width) on the CPU; on a GPU in chunks of a share of its
# free memory, up to _GPU_VARIANT_BYTES: 2^26 numbers are some 2·10^4 tokens through BERT-base's
# feed-forward, matrix products large enough to keep the device busy (16x larger chunks ran
# no faster on an H100), and larger chunks only hold more memory.
_VARIANT_NUMBERS = 2**24
_GPU_VARIANT_BYTES = 2**28


class _NotLean(Exception):
    """A lean-captured attention call held a score term the capture cannot recompute."""


@dataclass
class _Block:
    """One transformer block's internals from the forward pass, in the run's token order, on the
    device the block ran on."""

    module: nn.Module
    inputs: Tensor  # (B, n, D)
    attention: Tensor | AttentionScores  # (B, H, n, n) probabilities, or the scores they are recomputed from
    values: Tensor  # (B, H, n, d)
    mask: Tensor  # (B, n) bool
    context: Tensor | None = None  # (B, n, H d) the attention's output before its projection, if kept

    def probability_blocks(self) -> Iterable[tuple[int, Tensor]]:
        """The per-head probabilities by blocks of rows (see :data:`decomposition.Probabilities`)."""
        if isinstance(self.attention, Tensor):
            return [(0, self.attention.detach())]
        return head_blocks(self.attention)

    def probabilities(self) -> Tensor:
        """(B, H, n, n) the per-head probabilities, whole."""
        if isinstance(self.attention, Tensor):
            return self.attention.detach()
        return next(head_blocks(self.attention, rows=self.attention.query.shape[2]))[1]

    def contexts(self) -> Tensor:
        """(B, n, H d) the attention's output before its projection: each head's probabilities times its values."""
        if self.context is not None:
            return self.context
        batch, heads, n, size = self.values.shape
        return (self.probabilities().to(self.values.dtype) @ self.values).transpose(1, 2).reshape(batch, n, heads * size)


class _Weights(NamedTuple):
    """What the maths reads of one block's weights."""

    output_weight: Tensor  # (H d, D)
    output_bias: Tensor | None  # (D,)
    norm: tuple[Tensor, Tensor, float] | None  # the post-LN LayerNorm's (gamma, beta, eps)


def _weights(forward_func: Any, architecture: Architecture, block: nn.Module) -> _Weights:
    """The output projection and post-LN norm of ``block``'s self-attention (see :func:`read_weights`)."""
    norm = None if architecture.post_norm is None else architecture.post_norm(block)
    return read_weights(forward_func, architecture.output_projection(block), norm, block)


def read_weights(forward_func: Any, projection: nn.Module, norm: nn.Module | None, block: nn.Module) -> _Weights:
    """An attention sub-layer's output projection and post-LN norm (or None) in ``block``, read
    through accelerate's hooks when the model is dispatched (the tensors stay valid after the
    weights are offloaded again)."""
    with onloaded(owning_module(forward_func), [projection] + ([] if norm is None else [norm])):
        weight, bias = projection_weight(projection)
        return _Weights(weight, bias, None if norm is None else layer_norm_parameters(norm))


def alti_maps(
    forward_func: Callable[..., Any],
    inputs: Tensor,
    additional_forward_args: Any = None,
    attention_mask: Tensor | None = None,
    progress: Callable[[int], None] | None = None,
) -> Tensor:
    """ALTI's contributions of every layer, (L, B, n, n) in the inputs' token order
    (:func:`~captum_attnflow.functional.decomposition.alti_contributions`); ``progress(1)`` is
    called after each layer."""
    return _layer_maps(forward_func, inputs, additional_forward_args, attention_mask, progress, "ALTI", _alti_map)


def attention_norm_maps(
    forward_func: Callable[..., Any],
    inputs: Tensor,
    additional_forward_args: Any = None,
    attention_mask: Tensor | None = None,
    progress: Callable[[int], None] | None = None,
) -> Tensor:
    """Kobayashi et al.'s :math:`\\lVert \\sum_h \\alpha^h_{ij} f^h(x_j) \\rVert` of every layer, (L, B, n, n)
    in the inputs' token order (:func:`~captum_attnflow.functional.decomposition.attention_norms`);
    ``progress(1)`` is called after each layer."""
    return _layer_maps(forward_func, inputs, additional_forward_args, attention_mask, progress, "AttentionNorm", _norm_map)


def value_zeroing_maps(
    forward_func: Callable[..., Any],
    inputs: Tensor,
    additional_forward_args: Any = None,
    attention_mask: Tensor | None = None,
    progress: Callable[[int], None] | None = None,
) -> Tensor:
    """Value zeroing's row-normalised contributions of every layer, (L, B, n, n) in the inputs'
    token order: :math:`C_l[i, j] = 1 - \\cos(\\tilde x^{(j)}_i, x_i)` with :math:`x_i` token
    i's output of block l and :math:`\\tilde x^{(j)}_i` the same with token j's value vectors
    zeroed in every head of that block, each row divided by its sum over real tokens.

    The zeroed attention outputs of all j follow from one pass
    (:func:`~captum_attnflow.functional.decomposition.zeroed_attention_outputs`); only the rest of
    the block (output projection, residual, norms, feed-forward) runs again, for n variants of n
    tokens, in chunks. ``progress(k)`` is called after each layer.
    """
    return _layer_maps(
        forward_func, inputs, additional_forward_args, attention_mask, progress, "ValueZeroing", _zeroing_map
    )


def _layer_maps(
    forward_func: Callable[..., Any],
    inputs: Tensor,
    additional_forward_args: Any,
    attention_mask: Tensor | None,
    progress: Callable[[int], None] | None,
    method: str,
    block_map: Callable[[Architecture, _Block, _Weights], Tensor],
) -> Tensor:
    """(L, B, n, n): ``block_map(architecture, block, weights)`` (B, n, n) of every block, without
    gradients, on the inputs' device in the inputs' token order; ``progress(1)`` after each block.

    Each block's map is computed during the forward pass, as soon as the block has run: on the
    lean capture where it applies (the per-head probabilities recomputed in blocks of rows, a
    call it cannot recompute sending the whole call to the eager path), else from eager
    attention, whose one layer's (B, H, n, n) probabilities are dropped then (not every layer's:
    L·H·n² numbers, 9.7 GiB for BERT-base at n = 4096)."""
    architecture, modules = architecture_of(forward_func, method)
    if architecture.cross_attention is not None:
        encoder = {id(m) for m in main_model(forward_func).get_encoder().modules()}
        if any(id(module) not in encoder for module in modules):
            raise TypeError(
                f"{method} reads one self-attention per block, and an encoder-decoder's decoder blocks also run a "
                f"cross-attention: explain it with {method}(model).encoder_decoder_rows(input_ids, decoder_input_ids, ...) "
                "or through LLMAttentionAttribution, or pass its encoder alone (model.get_encoder())."
            )
    models = outermost(hf_models(owning_module(forward_func)))
    if models and all(supports_lean(model) for model in models):
        try:
            return _maps(forward_func, inputs, additional_forward_args, attention_mask, progress, method, block_map,
                         architecture, modules, lean=True)
        except _NotLean:
            pass
    return _maps(forward_func, inputs, additional_forward_args, attention_mask, progress, method, block_map,
                 architecture, modules, lean=False)


def _maps(
    forward_func: Callable[..., Any],
    inputs: Tensor,
    additional_forward_args: Any,
    attention_mask: Tensor | None,
    progress: Callable[[int], None] | None,
    method: str,
    block_map: Callable[[Architecture, _Block, _Weights], Tensor],
    architecture: Architecture,
    modules: list[nn.Module],
    lean: bool,
) -> Tensor:
    """:func:`_layer_maps` from one forward, with the lean capture or eager attention; raises
    :class:`_NotLean` at the first block whose lean-captured attention cannot be recomputed,
    before any progress is reported."""
    maps: list[Tensor] = []  # the (L, B, n, n) result, made at the first block
    masks: list[Tensor] = []  # the run's (B, n) bool mask, made at the first block

    def after_block(internals: Internals) -> None:
        index = len(done)
        kept = internals.scores if lean else internals.probabilities
        if not kept:  # attention outside the interface: capture_internals says so after the call
            return
        if not len(kept) == len(internals.block_inputs) == index + 1:
            raise ValueError(
                f"{method} expects one self-attention per transformer block; the model ran {len(internals.block_inputs)} "
                f"blocks and {len(kept)} attention calls (a model with cross-attention is not supported)."
            )
        attention, kept[index] = kept[index], None
        if attention is None:
            raise _NotLean
        batch, _, n, _ = attention.query.shape if lean else attention.shape
        if not masks:
            masks.append(_run_mask(attention_mask, inputs.device, batch, n, internals.order))
            maps.append(torch.empty(len(modules), batch, n, n, dtype=torch.float32, device=inputs.device))
        # This block's internals are dropped once read: the next blocks make their own.
        x, internals.block_inputs[index] = internals.block_inputs[index], None
        values, internals.values[index] = internals.values[index], None
        context = None
        if lean:
            context, internals.contexts[index] = internals.contexts[index], None
        block = _Block(modules[index], x, attention, values, masks[0].to(x.device), context)
        weights = _weights(forward_func, architecture, block.module)
        maps[0][index] = block_map(architecture, block, weights)
        done.append(index)
        if progress is not None:
            progress(1)

    done: list[int] = []
    internals = capture_internals(
        forward_func, inputs, additional_forward_args, attention_mask, blocks=modules, after_block=after_block, lean=lean,
        own=architecture.own_attention,
    )
    if len(done) != len(modules):
        raise ValueError(
            f"{method} expects one self-attention per transformer block; the model ran {len(done)} of its "
            f"{len(modules)} blocks."
        )
    return internals.in_inputs_order(maps[0])


def _run_mask(attention_mask: Tensor | None, device: torch.device, batch: int, n: int, order: Tensor | None) -> Tensor:
    """(B, n) bool, True on real tokens, in the run's token order."""
    if attention_mask is None:
        return torch.ones(batch, n, dtype=torch.bool, device=device)
    mask = torch.as_tensor(attention_mask).to(device).bool()
    return mask if order is None else reorder_tokens(mask, order.to(device))


def _alti_map(architecture: Architecture, block: _Block, weights: _Weights) -> Tensor:
    """(B, n, n) ALTI contributions of one block."""
    residual = block.inputs if architecture.residual is None else architecture.residual(block.module, block.inputs)
    return decomposition.alti_contributions(
        block.probability_blocks(), block.values, residual, weights.output_weight, weights.output_bias, block.mask,
        weights.norm, _attention_scale(architecture, block),
    )


def _attention_scale(architecture: Architecture, block: _Block) -> Tensor | None:
    """(B, n, D) :math:`s_i = N(a_i) / a_i` of a block whose ``attention_norm`` N scales the
    attention's output :math:`a` token by token before the residual (0 where :math:`a_i` is 0,
    whose share is 0 whatever the factor); None for other blocks."""
    if architecture.attention_norm is None:
        return None
    attention = architecture.output_projection(block.module)(block.contexts())
    scaled = architecture.attention_norm(block.module)(attention)
    safe = torch.where(attention == 0, torch.ones_like(attention), attention)
    return torch.where(attention == 0, torch.zeros_like(attention), scaled / safe)


def _norm_map(architecture: Architecture, block: _Block, weights: _Weights) -> Tensor:
    """(B, n, n) norms of the weighted, projected value vectors of one block."""
    return decomposition.attention_norms(block.probability_blocks(), block.values, weights.output_weight, block.mask)


def _zeroing_map(architecture: Architecture, block: _Block, weights: _Weights) -> Tensor:
    """(B, n, n) value zeroing of one block, rows normalised."""
    projection = architecture.output_projection(block.module)
    batch, heads, n, size = block.values.shape
    attention_outputs = projection(block.contexts())
    outputs = architecture.after_attention(block.module, block.inputs, attention_outputs)
    probabilities = block.probabilities()
    projected = decomposition.projected_values(block.values, weights.output_weight)
    numbers = block_bytes(projected.device, 4 * _VARIANT_NUMBERS, _GPU_VARIANT_BYTES) // 4
    chunk = max(1, numbers // (4 * batch * n * block.inputs.shape[-1]))
    distances = []
    for start in range(0, n, chunk):
        tokens = torch.arange(start, min(n, start + chunk), device=projected.device)
        zeroed = decomposition.zeroed_attention_outputs(probabilities, projected, attention_outputs, tokens)
        # (B k, n, D): the variants as a batch, the form every layer takes (bitsandbytes' 8-bit
        # layers take no more than three axes)
        inputs = block.inputs[:, None].expand(zeroed.shape).reshape(-1, n, zeroed.shape[-1])
        zeroed_outputs = architecture.after_attention(block.module, inputs, zeroed.to(inputs.dtype).flatten(0, 1))
        distances.append(decomposition.cosine_distances(zeroed_outputs.reshape(zeroed.shape), outputs))
    # A token no head attends to changes nothing when zeroed: exactly 0, not float noise.
    attended = probabilities.sum(1) > 0
    return decomposition.normalised_rows(torch.cat(distances, -1) * attended, block.mask)
