"""ALTI (Ferrando, Gállego & Costa-jussà, EMNLP 2022) as a Captum attribution."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from captum_attnflow.attr._base import with_internals_args
from captum_attnflow.attr._decomposition import ContributionRollout, with_encoder_decoder_args
from captum_attnflow.capture.decomposition import alti_maps
from captum_attnflow.capture.seq2seq_decomposition import seq2seq_alti_maps


class ALTI(ContributionRollout):
    """ALTI, Aggregation of Layer-wise Token-to-token Interactions (Ferrando et al. 2022).

    Each layer's attention block, residual and LayerNorm included, is decomposed into one vector
    per input token, :math:`y_i \\approx \\sum_j T_i(x_j)` with
    :math:`T_i(x_j) = \\sum_h \\alpha^h_{ij} v^h_j W^h_O + \\delta_{ij} x_i` (a post-LN block's
    LayerNorm linearised with token i's own statistics), and token j's contribution to token i
    is how much closer it brings the output than nothing does, in L1 distance:

    .. math::
        c_{ij} = \\frac{\\max(0, \\lVert y_i \\rVert_1 - \\lVert y_i - T_i(x_j) \\rVert_1)}
                      {\\sum_k \\max(0, \\lVert y_i \\rVert_1 - \\lVert y_i - T_i(x_k) \\rVert_1)}.

    The per-layer matrices (rows sum to 1) are rolled out, :math:`\\tilde C_l = C_l \\tilde C_{l-1}`;
    the attribution of token j for ``position`` p after ``layer`` l is :math:`\\tilde C_l[p, j]`.
    Needs the model's value vectors, output projection and LayerNorm: the model types of
    :data:`captum_attnflow.hf.architectures.ARCHITECTURES` (BERT, RoBERTa, XLM-R, DistilBERT,
    GPT-2, Llama, Mistral, Qwen2, ViT, DeiT, the bundled models). The maths is
    :func:`captum_attnflow.functional.decomposition.alti_contributions`, fed each layer's per-head
    probabilities in blocks of rows recomputed from the model's queries and keys where the lean
    capture applies: no (B, H, n, n) tensor is made. On an encoder-decoder (BART, Marian, mBART,
    M2M-100/NLLB, T5) it is ALTI+, :meth:`encoder_decoder_rows`.

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
        """ALTI of ``position`` after ``layer``.
{args}
        Returns:
            Tensor: float32 {shapes} Each row sums to 1 over real tokens; padding gets 0.

        Example::

            >>> from captum_attnflow import ALTI, load_agreement_model
            >>> model, tokenizer = load_agreement_model()
            >>> ids = tokenizer(["the keys to the cabinet"], return_tensors="pt")["input_ids"]
            >>> scores = ALTI(model).attribute(ids, layer=None)  # [CLS] after every layer
            >>> scores.shape, bool(scores.sum(-1).allclose(scores.new_ones(6, 1)))
            (torch.Size([6, 1, 6]), True)
        """
        return self._rolled_out(alti_maps, inputs, additional_forward_args, position, layer, attention_mask, show_progress)

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
        """ALTI+ (Ferrando, Gállego, Tsiamas & Costa-jussà, EMNLP 2022, "Towards opening the black
        box of neural machine translation: source and target contributions in the Transformer",
        section 3) of every decoder position of an encoder-decoder: its contributions of the
        source tokens and of the target prefix, which sum to 1.

        The encoder's layers are decomposed and rolled out as above, :math:`R_{enc}`. In each
        decoder layer the self-attention block gives ALTI's :math:`S_l` (m x m, causal), and the
        cross-attention block, whose output for position t is decomposed into one vector per
        encoder output and its residual, :math:`y_t \\approx \\sum_j T_t(e_j) + x_t`, gives the
        encoder outputs' contributions :math:`X_l` and the residual's :math:`r_l` (rows of
        :math:`[X_l \\; r_l]` sum to 1;
        :func:`~captum_attnflow.functional.decomposition.alti_cross_contributions`). The
        residual carries the self-attention block's output, so the layer's joint map is
        :math:`[X_l \\; r_l \\odot S_l]`, and layers compose as
        :math:`U_l = (r_l \\odot S_l) U_{l-1} + X_l R_{enc}`, :math:`T_l = (r_l \\odot S_l) T_{l-1}`
        from :math:`T_0 = I`, :math:`U_0 = 0`
        (:func:`~captum_attnflow.functional.encoder_decoder.encoder_decoder_contributions`).
        Row t's source share is :math:`\\sum_j U_l[t, j]`, its target share
        :math:`\\sum_k T_l[t, k] = 1 -` the source share.
{args}
        Returns:
            Tensor: float32 (B, m, n_s + m), (L_d, B, m, n_s + m) for ``layer=None``: row t over
            the source tokens, then over the decoder's input tokens; rows sum to 1, padding 0.

        Example::

            >>> import torch
            >>> from transformers import MarianConfig, MarianMTModel
            >>> from captum_attnflow import ALTI
            >>> model = MarianMTModel(MarianConfig(vocab_size=40, d_model=16, encoder_layers=2, decoder_layers=2,
            ...     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
            ...     pad_token_id=39, decoder_start_token_id=39)).eval()
            >>> rows = ALTI(model).encoder_decoder_rows(torch.tensor([[5, 6, 7, 0]]), torch.tensor([[39, 8, 9]]))
            >>> source_share, target_share = rows[0, :, :4].sum(-1), rows[0, :, 4:].sum(-1)
            >>> rows.shape, bool(torch.allclose(source_share + target_share, torch.ones(3)))
            (torch.Size([1, 3, 7]), True)
        """
        return self._encoder_decoder_rolled_out(seq2seq_alti_maps, input_ids, decoder_input_ids, layer, attention_mask,
                                                decoder_attention_mask, show_progress)
