"""Per-layer contribution maps of an encoder-decoder (BART, Marian, mBART, M2M-100, T5): ALTI+
(Ferrando et al., EMNLP 2022), the norms of the weighted value vectors and value zeroing, each
decoder layer's map one row per decoder position over the joint graph of
:mod:`captum_attnflow.functional.encoder_decoder`.

One forward pass with eager attention collects each attention call's probabilities and values and
each block's input (:func:`~captum_attnflow.capture.internals.capture_internals`); each block's
map is computed as soon as the block has run, its probabilities then dropped. The encoder's
blocks give (B, n_s, n_s) maps as an encoder's do (:mod:`captum_attnflow.capture.decomposition`);
each decoder block gives one (B, m, n_s + m) map, its columns the encoder's outputs (through the
cross-attention), then the block's inputs (through the self-attention and the residual):

* ALTI+: :func:`~captum_attnflow.functional.encoder_decoder.alti_plus_layer` of the
  self-attention block's ALTI and the cross-attention block's
  (:func:`~captum_attnflow.functional.decomposition.alti_cross_contributions`, its residual
  stream given by the architecture table's :class:`~captum_attnflow.hf.architectures.CrossAttention`);
* the norms: :math:`\\lVert \\sum_h \\alpha^h_{tj} f^h(e_j) \\rVert` of the cross-attention, then
  the self-attention's, not normalised;
* value zeroing: :math:`1 - \\cos(\\tilde y^{(j)}_t, y_t)`, :math:`y_t` the block's output and
  :math:`\\tilde y^{(j)}_t` the same with encoder output j's values zeroed in the
  cross-attention, or decoder input j's in the self-attention; the row divided by its sum over
  both. The block runs again whole for each zeroed token (its cross-attention reads the queries
  the self-attention's zeroing changed), the variants in chunks as one batch, with the arguments
  the forward passed it, the unzeroed block in the same batch.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn
from transformers.masking_utils import eager_mask

from captum_attnflow.capture.decomposition import (
    _VARIANT_NUMBERS,
    _alti_map,
    _Block,
    _norm_map,
    _Weights,
    _weights,
    _zeroing_map,
    read_weights,
)
from captum_attnflow.capture.internals import Internals, _eager_function, capture_internals
from captum_attnflow.capture.seq2seq import _check_encoder_decoder, _Seq2SeqCall
from captum_attnflow.functional import decomposition
from captum_attnflow.functional.checks import as_mask
from captum_attnflow.functional.encoder_decoder import alti_plus_layer
from captum_attnflow.hf.architectures import Architecture, CrossAttention, architecture_of
from captum_attnflow.hf.state import implementation, register_attention

_ZEROING = "captum_attnflow_value_zeroing"
# While a decoder block runs again: (the attention module whose values are zeroed, (J,) the token
# zeroed in each of the J variants, -1 for none, the batch size B of one variant).
_ZEROED: contextvars.ContextVar[tuple[nn.Module, Tensor, int] | None] = contextvars.ContextVar(_ZEROING, default=None)


@dataclass(frozen=True)
class Seq2SeqMaps:
    """One map per layer of an encoder-decoder, in transformers' layout (row = query).

    Attributes:
        encoder: (L_e, B, n_s, n_s) the encoder layers' maps.
        decoder: (L_d, B, m, n_s + m) the decoder layers' maps over the encoder's outputs, then
            the layer's inputs.
    """

    encoder: Tensor
    decoder: Tensor


@dataclass
class _DecoderBlock:
    """One decoder block's internals from the forward pass."""

    own: _Block  # its self-attention: the block's input, (B, H, m, m) probabilities, values, (B, m) mask
    cross: _Block  # its cross-attention: its residual stream, (B, H, m, n_s) probabilities, the encoder outputs' values
    source_mask: Tensor  # (B, n_s) bool
    weights: _Weights  # the self-attention's output projection and post-LN norm
    cross_weights: _Weights
    modules: tuple[nn.Module, nn.Module]  # the attention modules of its self- and cross-attention calls
    call: tuple[tuple, dict]  # the arguments the forward passed the block
    model: nn.Module  # the encoder-decoder, whose attention implementation a block run again switches


def seq2seq_alti_maps(
    model: nn.Module,
    input_ids: Tensor,
    decoder_input_ids: Tensor,
    attention_mask: Tensor | None = None,
    decoder_attention_mask: Tensor | None = None,
    progress: Callable[[int], None] | None = None,
) -> Seq2SeqMaps:
    """ALTI+'s per-layer maps: the encoder's ALTI, and each decoder layer's
    :math:`[X_l \\; r_l \\odot S_l]` (see the module docstring); ``progress(1)`` after each block.

    Args:
        model: a Hugging Face encoder-decoder of the architecture table (BART, Marian, mBART,
            M2M-100, T5).
        input_ids: (B, n_s) source ids; ``attention_mask`` (B, n_s) marks their padding.
        decoder_input_ids: (B, m) the decoder's inputs (start token, then the target tokens);
            ``decoder_attention_mask`` (B, m) their padding.

    Example::

        >>> import torch
        >>> from transformers import BartConfig, BartForConditionalGeneration
        >>> model = BartForConditionalGeneration(BartConfig(vocab_size=40, d_model=16, encoder_layers=2,
        ...     decoder_layers=3, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        ...     decoder_ffn_dim=32)).eval()
        >>> maps = seq2seq_alti_maps(model, torch.tensor([[5, 6, 7, 2]]), torch.tensor([[2, 8]]))
        >>> maps.encoder.shape, maps.decoder.shape, torch.allclose(maps.decoder.sum(-1), torch.ones(3, 1, 2))
        (torch.Size([2, 1, 4, 4]), torch.Size([3, 1, 2, 6]), True)
    """
    return _seq2seq_maps(model, input_ids, decoder_input_ids, attention_mask, decoder_attention_mask, progress,
                         "ALTI", _alti_map, _alti_plus_map)


def seq2seq_attention_norm_maps(
    model: nn.Module,
    input_ids: Tensor,
    decoder_input_ids: Tensor,
    attention_mask: Tensor | None = None,
    decoder_attention_mask: Tensor | None = None,
    progress: Callable[[int], None] | None = None,
) -> Seq2SeqMaps:
    """The norms of the weighted value vectors of every attention call, not normalised: the
    encoder's, and each decoder layer's cross-attention then self-attention (the arguments of
    :func:`seq2seq_alti_maps`)."""
    return _seq2seq_maps(model, input_ids, decoder_input_ids, attention_mask, decoder_attention_mask, progress,
                         "AttentionNorm", _norm_map, _joint_norm_map)


def seq2seq_value_zeroing_maps(
    model: nn.Module,
    input_ids: Tensor,
    decoder_input_ids: Tensor,
    attention_mask: Tensor | None = None,
    decoder_attention_mask: Tensor | None = None,
    progress: Callable[[int], None] | None = None,
) -> Seq2SeqMaps:
    """Value zeroing's row-normalised maps: the encoder's as an encoder's; each decoder layer's
    over the encoder's outputs (zeroed in the cross-attention) and the layer's inputs (zeroed in
    the self-attention), normalised together (the arguments of :func:`seq2seq_alti_maps`)."""
    return _seq2seq_maps(model, input_ids, decoder_input_ids, attention_mask, decoder_attention_mask, progress,
                         "ValueZeroing", _zeroing_map, _joint_zeroing_map)


def _seq2seq_maps(
    model: nn.Module,
    input_ids: Tensor,
    decoder_input_ids: Tensor,
    attention_mask: Tensor | None,
    decoder_attention_mask: Tensor | None,
    progress: Callable[[int], None] | None,
    method: str,
    encoder_map: Callable[[Architecture, _Block, _Weights], Tensor],
    decoder_map: Callable[[Architecture, _DecoderBlock], Tensor],
) -> Seq2SeqMaps:
    """Each block's map from one forward pass, as soon as the block has run, without gradients."""
    _check_encoder_decoder(model)
    architecture, blocks = architecture_of(model, method)
    cross = architecture.cross_attention
    if cross is None:
        raise ValueError(f"{method} found no cross-attention for the {model.config.model_type!r} blocks in the architecture table.")
    encoder = {id(module) for module in model.get_encoder().modules()}
    device = input_ids.device
    source_mask = as_mask(attention_mask, *input_ids.shape, device)
    target_mask = as_mask(decoder_attention_mask, *decoder_input_ids.shape, device)
    encoder_maps: list[Tensor] = []
    decoder_maps: list[Tensor] = []
    calls: list[tuple[tuple, dict]] = []
    consumed = [0]  # the attention calls of the blocks done

    def keep_call(block: nn.Module, args: tuple, kwargs: dict) -> None:
        calls.append((args, kwargs))

    def after_block(internals: Internals) -> None:
        index = len(encoder_maps) + len(decoder_maps)
        module, (args, kwargs) = blocks[index], calls.pop()
        first = consumed[0]
        count = len(internals.probabilities) - first
        expected = 1 if id(module) in encoder else 2
        if count != expected:
            raise ValueError(
                f"{method} expects {expected} attention call(s) in {type(module).__name__} (a self-attention, then in the "
                f"decoder a cross-attention); it made {count}."
            )
        consumed[0] += count
        probabilities = internals.probabilities[first:]
        values = internals.values[first:]
        internals.probabilities[first:] = [None] * count  # each block's maps are dropped once read
        x, internals.block_inputs[index] = internals.block_inputs[index], None
        if expected == 1:
            block = _Block(module, x, probabilities[0], values[0], source_mask.to(x.device))
            encoder_maps.append(encoder_map(architecture, block, _weights(model, architecture, module)).to(device))
        else:
            own = _Block(module, x, probabilities[0], values[0], target_mask.to(x.device))
            weights = _weights(model, architecture, module)
            residual = cross.residual(module, x, architecture.output_projection(module)(own.contexts()))
            decoder_maps.append(decoder_map(architecture, _DecoderBlock(
                own, _Block(module, residual, probabilities[1], values[1], own.mask), source_mask.to(x.device), weights,
                _cross_weights(model, cross, module), tuple(internals.modules[first:]), (args, kwargs), model,
            )).to(device))
        if progress is not None:
            progress(1)

    handles = [block.register_forward_pre_hook(keep_call, with_kwargs=True) for block in blocks]
    try:
        capture_internals(
            _Seq2SeqCall(model, output_attentions=False), input_ids,
            (attention_mask, decoder_input_ids, decoder_attention_mask), blocks=blocks, after_block=after_block,
        )
    finally:
        for handle in handles:
            handle.remove()
    if not encoder_maps or len(encoder_maps) + len(decoder_maps) != len(blocks):
        raise ValueError(f"{method} expects the model to run each of its {len(blocks)} blocks once.")
    return Seq2SeqMaps(torch.stack(encoder_maps), torch.stack(decoder_maps))


def _cross_weights(model: nn.Module, cross: CrossAttention, block: nn.Module) -> _Weights:
    return read_weights(model, cross.output_projection(block), None if cross.post_norm is None else cross.post_norm(block), block)


def _alti_plus_map(architecture: Architecture, block: _DecoderBlock) -> Tensor:
    """(B, m, n_s + m) ALTI+'s map of one decoder block."""
    own = _alti_map(architecture, block.own, block.weights)
    weights = block.cross_weights
    crossed = decomposition.alti_cross_contributions(
        block.cross.probability_blocks(), block.cross.values, block.cross.inputs, weights.output_weight,
        weights.output_bias, block.own.mask, block.source_mask, weights.norm,
    )
    return alti_plus_layer(own, crossed)


def _joint_norm_map(architecture: Architecture, block: _DecoderBlock) -> Tensor:
    """(B, m, n_s + m) the norms of one decoder block's cross-attention, then its self-attention."""
    crossed = decomposition.attention_norms(
        block.cross.probability_blocks(), block.cross.values, block.cross_weights.output_weight, block.own.mask,
        block.source_mask,
    )
    return torch.cat([crossed, _norm_map(architecture, block.own, block.weights)], -1)


def _joint_zeroing_map(architecture: Architecture, block: _DecoderBlock) -> Tensor:
    """(B, m, n_s + m) value zeroing of one decoder block, its row normalised over both kinds of token."""
    self_attention, cross_attention = block.modules
    source = _zeroed_distances(block, cross_attention, block.source_mask.shape[1])
    target = _zeroed_distances(block, self_attention, block.own.mask.shape[1])
    # A token no head attends to changes nothing when zeroed: exactly 0, not float noise.
    attended = torch.cat([block.cross.probabilities().sum(1) > 0, block.own.probabilities().sum(1) > 0], -1)
    mask = torch.cat([block.source_mask, block.own.mask], 1)
    return decomposition.normalised_rows(torch.cat([source, target], -1) * attended, mask, block.source_mask.shape[1])


def _zeroed_distances(block: _DecoderBlock, attention: nn.Module, count: int) -> Tensor:
    """(B, m, count) :math:`1 - \\cos` of the block's output with each of the ``count`` keys of
    ``attention`` zeroed in its values, the block run again from the arguments of its call."""
    args, kwargs = block.call
    module = block.own.module
    batch, m, size = block.own.inputs.shape
    chunk = max(2, _VARIANT_NUMBERS // (4 * batch * m * size))
    register_attention(_ZEROING, _zeroing_attention, eager_mask)  # the masks of the call are eager attention's
    distances = []
    with implementation(block.model, _ZEROING):
        for start in range(0, count, chunk - 1):
            # variant 0 is the block unzeroed, computed in the same batch as the zeroed ones
            tokens = torch.arange(start - 1, min(count, start + chunk - 1))
            tokens[0] = -1
            with _zeroing(attention, tokens, batch):
                outputs = module.forward(*_repeated(args, len(tokens), batch), **_repeated_keywords(kwargs, len(tokens), batch))
            outputs = (outputs[0] if isinstance(outputs, tuple) else outputs).reshape(len(tokens), batch, m, size)
            distances.append(decomposition.cosine_distances(outputs[1:].transpose(0, 1), outputs[0]))
    return torch.cat(distances, -1)


@contextlib.contextmanager
def _zeroing(attention: nn.Module, tokens: Tensor, batch: int) -> Iterator[None]:
    token = _ZEROED.set((attention, tokens, batch))
    try:
        yield
    finally:
        _ZEROED.reset(token)


def _zeroing_attention(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, **kwargs: Any
) -> tuple[Tensor, Tensor]:
    """The family's eager attention, with one token's values zeroed in each variant of the batch
    where ``module`` is the one zeroed (see :data:`_ZEROED`)."""
    attention, tokens, batch = _ZEROED.get()
    if module is attention:
        variants = value.reshape(len(tokens), batch, *value.shape[1:]).clone()
        tokens = tokens.to(value.device)
        zeroed = torch.nonzero(tokens >= 0).flatten()
        variants[zeroed, :, :, tokens[zeroed]] = 0
        value = variants.reshape(value.shape)
    return _eager_function(module)(module, query, key, value, attention_mask, **kwargs)


def _repeated(args: tuple, copies: int, batch: int) -> tuple:
    """The block's positional arguments for ``copies`` variants of a batch of ``batch``: each
    tensor with the batch first (B, ...) repeated, variant after variant."""
    return tuple(_repeat(arg, copies, batch) for arg in args)


def _repeated_keywords(kwargs: dict, copies: int, batch: int) -> dict:
    """The keyword arguments as :func:`_repeated`; no cache (the run again must neither read nor extend it)."""
    repeated = {name: _repeat(value, copies, batch) for name, value in kwargs.items()}
    for name in ("cache", "past_key_values", "past_key_value"):
        if name in repeated:
            repeated[name] = None
    if "use_cache" in repeated:
        repeated["use_cache"] = False
    return repeated


def _repeat(value: Any, copies: int, batch: int) -> Any:
    if isinstance(value, Tensor) and value.dim() >= 2 and value.shape[0] == batch:
        return value.repeat(copies, *[1] * (value.dim() - 1))
    return value
