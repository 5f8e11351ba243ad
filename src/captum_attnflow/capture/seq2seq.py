"""The three attention kinds of a Hugging Face encoder-decoder (T5, BART, ...) in one forward pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from captum_attnflow.capture.internals import Internals, capture_internals
from captum_attnflow.capture.maps import extract_attentions


@dataclass(frozen=True)
class Seq2SeqAttentions:
    """Attentions of one encoder-decoder forward pass, transformers' layouts (row = query).

    Attributes:
        encoder: L_e tensors (B, H, n_s, n_s), the encoder's self-attentions.
        decoder: L_d tensors (B, H, m, m), the decoder's causal self-attentions.
        cross: L_d tensors (B, H, m, n_s), decoder queries over the encoder's outputs.
    """

    encoder: tuple[Tensor, ...]
    decoder: tuple[Tensor, ...]
    cross: tuple[Tensor, ...]


def seq2seq_attentions(
    model: nn.Module,
    input_ids: Tensor,
    decoder_input_ids: Tensor,
    attention_mask: Tensor | None = None,
    decoder_attention_mask: Tensor | None = None,
) -> Seq2SeqAttentions:
    """Run an encoder-decoder once, without gradients, and return its three kinds of attention.

    The model runs in eval mode with eager attention; its attention implementation, modes,
    hooks and config are restored afterwards, also when the call raises (the machinery of
    :func:`captum_attnflow.extract_attentions`, which this calls).

    Args:
        model: a Hugging Face encoder-decoder, e.g. ``T5ForConditionalGeneration`` or
            ``BartForConditionalGeneration``.
        input_ids: (B, n_s) source token ids.
        decoder_input_ids: (B, m) decoder inputs: the decoder start token, then the target
            tokens that precede each predicted one.
        attention_mask: (B, n_s), 1 on real source tokens, 0 on padding; optional.
        decoder_attention_mask: (B, m), 1 on real decoder positions; optional.

    Returns:
        Seq2SeqAttentions: encoder, decoder and cross attentions, detached.

    Raises:
        ValueError: ``model`` is not an encoder-decoder, or the inputs are not on its device.

    Example::

        >>> import torch
        >>> from transformers import T5Config, T5ForConditionalGeneration
        >>> model = T5ForConditionalGeneration(T5Config(vocab_size=40, d_model=16, d_kv=4, d_ff=32,
        ...     num_layers=2, num_decoder_layers=3, num_heads=2)).eval()
        >>> maps = seq2seq_attentions(model, torch.tensor([[5, 6, 7, 1]]), torch.tensor([[0, 8]]))
        >>> len(maps.encoder), maps.decoder[0].shape, maps.cross[0].shape
        (2, torch.Size([1, 2, 2, 2]), torch.Size([1, 2, 2, 4]))
        >>> model.config._attn_implementation  # the model is left as it was
        'sdpa'
    """
    _check_encoder_decoder(model)
    call = _Seq2SeqCall(model)
    encoder = extract_attentions(
        call, input_ids, (attention_mask, decoder_input_ids, decoder_attention_mask), attention_mask
    )
    output = call.output
    if not output.decoder_attentions or not output.cross_attentions:
        raise ValueError(
            f"{type(model).__name__} returned no decoder or cross attentions for output_attentions=True."
        )
    return Seq2SeqAttentions(
        encoder=encoder,
        decoder=tuple(a.detach() for a in output.decoder_attentions),
        cross=tuple(a.detach() for a in output.cross_attentions),
    )


def _check_encoder_decoder(model: nn.Module) -> None:
    if not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        raise ValueError(
            f"{type(model).__name__} is not an encoder-decoder model (config.is_encoder_decoder is not True); "
            "pass e.g. a T5ForConditionalGeneration or BartForConditionalGeneration."
        )


class _Seq2SeqCall(nn.Module):
    """A module around the model, so that ``extract_attentions`` captures its output (all three
    kinds of attention, not only the encoder's) and restores the model's state afterwards; with
    ``output_attentions=False`` the call the decompositions capture (no maps kept by the model)."""

    def __init__(self, model: nn.Module, output_attentions: bool = True) -> None:
        super().__init__()
        self.model = model
        self.output_attentions = output_attentions
        self.output: Any = None

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None,
        decoder_input_ids: Tensor,
        decoder_attention_mask: Tensor | None,
    ) -> Any:
        self.output = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            output_attentions=self.output_attentions,
        )
        return self.output


def seq2seq_gradient_internals(
    model: nn.Module,
    input_ids: Tensor,
    decoder_input_ids: Tensor,
    attention_mask: Tensor | None = None,
    decoder_attention_mask: Tensor | None = None,
) -> tuple[Internals, list[str]]:
    """Run an encoder-decoder once with autograd on and keep its attention probabilities in the
    graph (:func:`~captum_attnflow.capture.internals.capture_internals`), with the kind of each
    attention call: ``"encoder"``, ``"decoder"`` (self-attention) or ``"cross"``.

    Returns:
        ``(internals, kinds)``: ``internals.output.logits`` (B, m, V) and one kind per entry of
        ``internals.probabilities``.
    """
    _check_encoder_decoder(model)
    internals = capture_internals(
        model, input_ids, (attention_mask, decoder_input_ids, decoder_attention_mask), gradients=True
    )
    return internals, attention_kinds(model, internals.modules)


def attention_kinds(model: nn.Module, modules: list[nn.Module]) -> list[str]:
    """The kind of each attention module of an encoder-decoder ``model``: ``"encoder"``,
    ``"decoder"`` (self-attention) or ``"cross"``."""
    encoder = {id(module) for module in model.get_encoder().modules()}
    names = {id(module): name.lower() for name, module in model.named_modules()}
    return [
        "encoder" if id(module) in encoder
        else "cross" if any(part in names[id(module)] for part in _CROSS_NAMES)
        else "decoder"
        for module in modules
    ]


# How transformers names a decoder's cross-attention modules (T5: EncDecAttention; BART, Marian,
# Pegasus, mBART: encoder_attn; others: crossattention).
_CROSS_NAMES = ("encdecattention", "encoder_attn", "crossattention", "cross_attn")
