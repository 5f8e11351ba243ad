"""ALTI (Ferrando, Gállego & Costa-jussà, EMNLP 2022) as a Captum attribution."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from captum_attnflow.attr._base import with_internals_args
from captum_attnflow.attr._decomposition import ContributionRollout
from captum_attnflow.capture.decomposition import alti_maps


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
    capture applies: no (B, H, n, n) tensor is made.

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
