"""The norm of the weighted value vectors (Kobayashi, Kuribayashi, Yokoi & Inui, EMNLP 2020) as a Captum attribution."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from captum_attnflow.attr._base import pooled_rows, with_internals_args
from captum_attnflow.attr._decomposition import LayerMapsAttribution
from captum_attnflow.capture.decomposition import attention_norm_maps
from captum_attnflow.functional.checks import as_mask, matrix_rows


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
    capture applies.

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
