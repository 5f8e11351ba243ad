"""Raw attention: the attention weights of one position in one layer, heads fused."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from captum_attnflow.attr._base import AttentionAttribution, pooled_rows, with_attribute_args, with_constructor_args
from captum_attnflow.functional import raw_attention


@with_constructor_args
class RawAttention(AttentionAttribution):
    """Raw attention weights as token attributions (the "Raw" rows of the paper's Tables 1-3).

    For layer :math:`l` and position :math:`p` the attribution of token :math:`j` is
    :math:`A_l[p, j]` with :math:`A_l = \\alpha \\bar W_l + (1 - \\alpha) I` (rows
    renormalised) and :math:`\\bar W_l` the heads fused. The default
    ``residual_alpha=1.0`` gives the plain head-averaged attention the paper calls raw
    attention. Above layer 1 the weights are over hidden embeddings, not input tokens, which
    is exactly why rollout and flow exist.

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
        residual_alpha: float = 1.0,
        attention_mask: Tensor | None = None,
        head: int | str | None = None,
        show_progress: bool | None = None,
    ) -> Tensor:
        """Attention weights of ``position`` in ``layer`` over the tokens.
{args}        Returns:
            Tensor: float32 {shapes} Rows sum to 1 over real tokens.

        Example::

            >>> import torch
            >>> from captum_attnflow import RawAttention, load_agreement_model
            >>> model, tokenizer = load_agreement_model()
            >>> batch = tokenizer(["the keys to the cabinet", "the key"], padding=True, return_tensors="pt")
            >>> weights = RawAttention(model).attribute(batch["input_ids"], layer=None,
            ...     attention_mask=batch["attention_mask"])
            >>> weights.shape  # (L, B, n): every layer
            torch.Size([6, 2, 6])
            >>> bool(torch.allclose(weights.sum(-1), torch.ones(6, 2))), weights[:, 1, 3:].abs().max().item()
            (True, 0.0)
        """
        graph, inputs = self._graph(inputs, additional_forward_args, attention_mask, residual_alpha, head_fusion, head is not None)
        position, weights = self._pooled_position(position, inputs, graph.mask)
        return pooled_rows(raw_attention(graph, position, layer, head=head, show_progress=show_progress), weights).to(inputs.device)
