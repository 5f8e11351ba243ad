"""Attention flow as a Captum attribution."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from captum_attnflow.attr._base import (
    AttentionAttribution,
    as_returned,
    explained_positions,
    pooled_rows,
    with_attribute_args,
    with_constructor_args,
)
from captum_attnflow.functional import flow


@with_constructor_args
class AttentionFlow(AttentionAttribution):
    """Attention flow (Abnar & Zuidema 2020, section 3) as token attributions.

    The attribution of input token :math:`j` for position :math:`p` after layer :math:`l` is
    the maximum flow from node :math:`(l, p)` to node :math:`(0, j)` of the attention graph,
    whose edges :math:`(k, i) \\to (k-1, j)` have the residual-adjusted attention
    :math:`A_k[i, j]` as capacity, :math:`A = \\alpha W + (1 - \\alpha) I`. Exact max flows
    from a compiled kernel, see :func:`captum_attnflow.functional.flow`.

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
        normalize: bool = False,
        show_progress: bool | None = None,
    ) -> Tensor:
        """Attention flow from ``position`` after ``layer`` to the input tokens.
{args}            normalize (bool, optional): False (default) returns raw max-flow values in
                [0, 1] (up to ~1e-7 of float32 rounding), the paper's definition; True
                rescales each row to sum to 1 over the tokens, as the authors' released
                code did.

        Returns:
            Tensor: float32 {shapes} Padding gets 0.

        Example::

            >>> import torch
            >>> from captum_attnflow import AttentionFlow, RawAttention, load_agreement_model
            >>> model, tokenizer = load_agreement_model()
            >>> ids = tokenizer(["the keys to the cabinet"], return_tensors="pt")["input_ids"]
            >>> flows = AttentionFlow(model).attribute(ids, layer=None)  # [CLS] after every layer
            >>> flows.shape  # (L, B, n)
            torch.Size([6, 1, 6])
            >>> one_layer = RawAttention(model).attribute(ids, layer=1, residual_alpha=0.5)
            >>> bool(torch.allclose(flows[0], one_layer))  # through one layer, the flow is the attention
            True
            >>> shares = AttentionFlow(model).attribute(ids, position=-1, normalize=True)
            >>> bool(torch.isclose(shares.sum(), torch.tensor(1.0)))
            True
        """
        graph, inputs = self._graph(inputs, additional_forward_args, attention_mask, residual_alpha, head_fusion, head is not None)
        position, weights = self._pooled_position(position, inputs, graph.mask)
        sources, has_axis = explained_positions(position, graph.mask, lambda: graph.is_causal)
        scores = flow(graph, layer, sources, normalize=normalize, show_progress=show_progress, head=head)
        return pooled_rows(as_returned(scores, has_axis, inputs), weights)
