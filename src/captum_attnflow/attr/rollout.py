"""Attention rollout as a Captum attribution."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from captum_attnflow.attr._base import AttentionAttribution, pooled_rows, with_attribute_args, with_constructor_args
from captum_attnflow.functional import rollout_rows


@with_constructor_args
class AttentionRollout(AttentionAttribution):
    """Attention rollout (Abnar & Zuidema 2020, section 3, equation 1) as token attributions.

    The attribution of input token :math:`j` for position :math:`p` after layer :math:`l` is
    :math:`(A_l A_{l-1} \\cdots A_1)[p, j]`, the share of token :math:`j` in that
    representation when token identities mix linearly in proportion to the
    residual-adjusted attention :math:`A = \\alpha W + (1 - \\alpha) I`. Computed top-down
    for the explained position only (O(l n^2) per layer), see
    :func:`captum_attnflow.functional.rollout_rows`; the full maps are
    :func:`captum_attnflow.functional.rollout`.

    {init}
    """

    @with_attribute_args
    def attribute(
        self,
        inputs: Tensor,
        target: Any = None,
        additional_forward_args: Any = None,
        position: int | list[int] | Tensor | None = None,
        layer: int | None = -1,
        head_fusion: str = "mean",
        residual_alpha: float = 0.5,
        attention_mask: Tensor | None = None,
        head: int | str | None = None,
        show_progress: bool | None = None,
    ) -> Tensor:
        """Rollout of ``position`` after ``layer`` onto the input tokens.
{args}

        Returns:
            Tensor: float32 {shapes} Each row sums to 1 over real tokens; padding gets 0.

        Example::

            >>> from captum_attnflow import AttentionRollout, load_agreement_model
            >>> model, tokenizer = load_agreement_model()
            >>> ids = tokenizer(["the keys to the cabinet"], return_tensors="pt")["input_ids"]
            >>> scores = AttentionRollout(model).attribute(ids)  # [CLS] (position 0, an encoder) after the last layer
            >>> tokenizer.convert_ids_to_tokens(ids[0])[scores.argmax()]  # the subject
            'keys'
        """
        graph, inputs = self._graph(inputs, additional_forward_args, attention_mask, residual_alpha, head_fusion, head is not None)
        position, weights = self._pooled_position(position, inputs, graph.mask)
        return pooled_rows(rollout_rows(graph, position, layer, head=head, show_progress=show_progress), weights).to(inputs.device)
