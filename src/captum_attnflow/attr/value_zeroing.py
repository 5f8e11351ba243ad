"""Value zeroing (Mohebbi, Zuidema, Chrupała & Alishahi, EACL 2023) as a Captum attribution."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from captum_attnflow.attr._base import with_internals_args
from captum_attnflow.attr._decomposition import ContributionRollout, with_encoder_decoder_args
from captum_attnflow.capture.decomposition import value_zeroing_maps
from captum_attnflow.capture.seq2seq_decomposition import seq2seq_value_zeroing_maps


class ValueZeroing(ContributionRollout):
    """Value zeroing (Mohebbi et al. 2023): how much token i's output of a layer changes when the
    layer may not read token j's value.

    .. math::
        C_l[i, j] = 1 - \\cos(\\tilde x^{(j)}_i, x_i),

    with :math:`x_i` token i's output of layer l (after the feed-forward and norms) and
    :math:`\\tilde x^{(j)}_i` the same with token j's value vectors set to zero in every head of
    layer l; rows are divided by their sum over real tokens. The per-layer matrices are rolled
    out without a residual (the residual is already inside what is measured),
    :math:`\\tilde C_l = C_l \\tilde C_{l-1}`, the row of ``position`` after ``layer``.

    Attention is linear in the values, so the attention output for every zeroed j follows from
    one forward pass; only the rest of each block runs again, n variants of n tokens per layer
    (:func:`captum_attnflow.capture.decomposition.value_zeroing_maps`): n² token evaluations of the
    feed-forward a layer, which is its cost (n times a forward's feed-forward). Needs the model's
    blocks: the model types of :data:`captum_attnflow.hf.architectures.ARCHITECTURES`; an
    encoder-decoder's through :meth:`encoder_decoder_rows`.

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
        """Value zeroing of ``position`` after ``layer``.
{args}
        Returns:
            Tensor: float32 {shapes} Each row sums to 1 over real tokens; padding gets 0.

        Example::

            >>> from captum_attnflow import ValueZeroing, load_agreement_model
            >>> model, tokenizer = load_agreement_model()
            >>> ids = tokenizer(["the keys to the cabinet"], return_tensors="pt")["input_ids"]
            >>> scores = ValueZeroing(model).attribute(ids)  # [CLS] after the last layer
            >>> scores.shape, round(float(scores.sum()), 4)
            (torch.Size([1, 6]), 1.0)
        """
        return self._rolled_out(
            value_zeroing_maps, inputs, additional_forward_args, position, layer, attention_mask, show_progress
        )

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
        """Value zeroing of every decoder position of an encoder-decoder, on the joint graph ALTI+
        uses (:meth:`ALTI.encoder_decoder_rows <captum_attnflow.ALTI.encoder_decoder_rows>`).

        The encoder's maps are an encoder's (above). Decoder layer l's map is one row per position
        t over both kinds of token it reads: :math:`1 - \\cos(\\tilde y^{(j)}_t, y_t)` with
        :math:`y_t` the block's output and :math:`\\tilde y^{(j)}_t` the same with encoder output
        j's values zeroed in the cross-attention (:math:`X_l`), or decoder input j's in the
        self-attention (:math:`S_l`, the cross-attention then reading the changed queries), the
        row divided by its sum over both. They compose as ALTI+'s,
        :math:`U_l = S_l U_{l-1} + X_l R_{enc}`, :math:`T_l = S_l T_{l-1}`; each block runs again
        whole once per zeroed token (n_s + m times a decoder block, in batches of variants).
{args}
        Returns:
            Tensor: float32 (B, m, n_s + m), (L_d, B, m, n_s + m) for ``layer=None``: row t over
            the source tokens, then the decoder's input tokens; rows sum to 1, padding 0.

        Example::

            >>> import torch
            >>> from transformers import BartConfig, BartForConditionalGeneration
            >>> from captum_attnflow import ValueZeroing
            >>> model = BartForConditionalGeneration(BartConfig(vocab_size=40, d_model=16, encoder_layers=2,
            ...     decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
            ...     decoder_ffn_dim=32)).eval()
            >>> rows = ValueZeroing(model).encoder_decoder_rows(torch.tensor([[0, 5, 6, 2]]), torch.tensor([[2, 0, 8]]))
            >>> rows.shape, bool(torch.allclose(rows.sum(-1), torch.ones(1, 3)))
            (torch.Size([1, 3, 7]), True)
        """
        return self._encoder_decoder_rolled_out(seq2seq_value_zeroing_maps, input_ids, decoder_input_ids, layer,
                                                attention_mask, decoder_attention_mask, show_progress)
