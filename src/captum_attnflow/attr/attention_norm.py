"""The norm of the weighted value vectors (Kobayashi, Kuribayashi, Yokoi & Inui, EMNLP 2020) as a Captum attribution."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from captum_attnflow.attr._base import pooled_rows, with_internals_args
from captum_attnflow.attr._decomposition import LayerMapsAttribution, with_encoder_decoder_args
from captum_attnflow.capture.decomposition import attention_norm_maps
from captum_attnflow.capture.seq2seq_decomposition import seq2seq_attention_norm_maps
from captum_attnflow.functional.checks import as_mask, layer_indices, matrix_rows


class AttentionNorm(LayerMapsAttribution):
    """Norm-based attention weights (Kobayashi et al. 2020): what token j adds to token i's
    attention output, measured by its length rather than by the attention weight alone,

    .. math::
        N_l[i, j] = \\left\\lVert \\sum_h \\alpha^h_{ij}\\, v^h_j W^h_O \\right\\rVert_2,

    one layer at a time like raw attention (not rolled out, not normalised). Needs the model's
    value vectors and output projection: the model types of
    :data:`captum_attnflow.hf.architectures.ARCHITECTURES`. The vectors are never formed: their
    length is a quadratic form in the heads' weights
    (:func:`captum_attnflow.functional.decomposition.attention_norms`), fed each layer's per-head
    probabilities in blocks of rows recomputed from the model's queries and keys where the lean
    capture applies. An encoder-decoder's through :meth:`encoder_decoder_rows`.

    Args:
        forward_func: a Hugging Face model of a supported type, or a module containing one.
    """

    @with_internals_args()
    def attribute(
        self,
        inputs: Tensor,
        target: Any = None,
        additional_forward_args: Any = None,
        position: int | list[int] | Tensor | None = None,
        layer: int | None = -1,
        attention_mask: Tensor | None = None,
        show_progress: bool | None = None,
    ) -> Tensor:
        """Norms of the weighted value vectors read by ``position`` in ``layer``.
{args}
        Returns:
            Tensor: float32 {shapes} Padding gets 0.

        Example::

            >>> from captum_attnflow import AttentionNorm, load_agreement_model
            >>> model, tokenizer = load_agreement_model()
            >>> ids = tokenizer(["the keys to the cabinet"], return_tensors="pt")["input_ids"]
            >>> AttentionNorm(model).attribute(ids, layer=None).shape  # [CLS] in every layer
            torch.Size([6, 1, 6])
        """
        maps, inputs, attention_mask = self._layer_maps(
            attention_norm_maps, inputs, additional_forward_args, attention_mask, show_progress
        )
        mask = as_mask(attention_mask, maps.shape[1], maps.shape[2], maps.device)
        position, weights = self._pooled_position(position, inputs, attention_mask)
        return pooled_rows(matrix_rows(maps, position, layer, mask), weights).to(inputs.device)

    @with_encoder_decoder_args
    def encoder_decoder_rows(
        self,
        input_ids: Tensor,
        decoder_input_ids: Tensor,
        layer: int | None = -1,
        attention_mask: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        show_progress: bool | None = None,
    ) -> Tensor:
        """The norms one decoder layer of an encoder-decoder reads, as raw attention's edges of the
        joint graph (:func:`~captum_attnflow.functional.encoder_decoder.encoder_decoder_raw_attention`):
        row t is :math:`\\lVert \\sum_h \\alpha^h_{tj} f^h(e_j) \\rVert` of the cross-attention
        over the encoder's outputs (standing for the source tokens), then
        :math:`\\lVert \\sum_h \\alpha^h_{tk} f^h(x_k) \\rVert` of the self-attention over the
        layer's inputs (the decoder's input tokens), not normalised.
{args}
        Returns:
            Tensor: float32 (B, m, n_s + m), (L_d, B, m, n_s + m) for ``layer=None``; padding 0.

        Example::

            >>> import torch
            >>> from transformers import T5Config, T5ForConditionalGeneration
            >>> from captum_attnflow import AttentionNorm
            >>> model = T5ForConditionalGeneration(T5Config(vocab_size=40, d_model=16, d_kv=4, d_ff=32,
            ...     num_layers=2, num_heads=2)).eval()
            >>> AttentionNorm(model).encoder_decoder_rows(torch.tensor([[5, 6, 1]]), torch.tensor([[0, 8]])).shape
            torch.Size([1, 2, 5])
        """
        maps = self._encoder_decoder_maps(seq2seq_attention_norm_maps, input_ids, decoder_input_ids, attention_mask,
                                          decoder_attention_mask, show_progress)
        rows = maps.decoder[layer_indices(layer, maps.decoder.shape[0])]
        return (rows[0] if layer is not None else rows).to(input_ids.device)
