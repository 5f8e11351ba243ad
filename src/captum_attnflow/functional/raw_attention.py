"""Raw attention: the attention weights of the explained positions in one layer, heads fused."""

from __future__ import annotations

import torch
from torch import Tensor

from captum_attnflow.docstrings import fill_docstring
from captum_attnflow.functional.checks import POSITION_DOC, Attentions, head_indices, shape_result
from captum_attnflow.functional.graph import AttentionGraph
from captum_attnflow.functional.rollout import HEAD_DOC, explained_rows


@fill_docstring(position=POSITION_DOC, head=HEAD_DOC)
def raw_attention(
    attentions: Attentions | AttentionGraph,
    position: int | list[int] | Tensor | None = None,
    layer: int | None = -1,
    residual_alpha: float = 1.0,
    head_fusion: str = "mean",
    attention_mask: Tensor | None = None,
    head: int | str | None = None,
    show_progress: bool | None = None,
) -> Tensor:
    """Rows of the attention matrices: :math:`A_l[p, :]` for the explained positions :math:`p`.

    :math:`A_l = \\operatorname{renorm}(\\alpha \\bar W_l + (1 - \\alpha) I)` with the heads
    fused; the default ``residual_alpha=1.0`` gives the plain head-averaged attention the paper
    calls raw attention (Tables 1-3, "Raw"). Above layer 1 the weights are over hidden
    embeddings, not input tokens, which is why rollout and flow exist.

    Args:
        attentions: L tensors (B, H, n, n) in the transformers layout (row = query), one
            (L, B, H, n, n) tensor, or an :class:`~captum_attnflow.functional.AttentionGraph`
            (then ``residual_alpha``, ``head_fusion`` and ``attention_mask`` are the graph's).
        position: {position}
            None (default): each example's last real token when the attention is causal (a
            decoder), else 0 (the CLS token).
        layer: 1..L (or negative from the top) for one layer, None for all layers.
        residual_alpha: :math:`\\alpha`; 1.0 (default) keeps the attention as it is.
        head_fusion: ``"mean"`` (paper), ``"max"`` or ``"min"`` over heads.
        attention_mask: optional (B, n), 1 on real tokens, 0 on padding (weights 0 there,
            real rows renormalised over real tokens).
        head: {head}
        show_progress: show a tqdm progress bar over the layers; None (default) shows one when
            a streamed graph's layers take seconds to recompute.

    Returns:
        float32 (B, n) for one layer and one position per example; a leading layer axis for
        ``layer=None``, a head axis after it for ``head="all"``, a position axis (..., S, n)
        for a list or (B, S) ``position``. Rows sum to 1 over real tokens.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional import raw_attention
        >>> attentions = torch.softmax(torch.randn(6, 2, 8, 5, 5), -1)  # (L, B, H, n, n)
        >>> weights = raw_attention(attentions, position=0, layer=1)
        >>> torch.allclose(weights, attentions[0, :, :, 0].mean(1))  # the head mean of row 0
        True
    """
    graph, sources, has_axis, layers = explained_rows(
        attentions, position, layer, residual_alpha, head_fusion, attention_mask, head
    )
    if head is None:
        scores = torch.stack([graph.rows(index, sources) for index in graph.walk(layers, "raw attention", show_progress)])  # (layers, B, S, n)
    else:
        batch = torch.arange(sources.shape[0], device=sources.device)[:, None]
        heads = graph.heads[layers][:, :, head_indices(head, graph.heads.shape[2])]  # (layers, B, H', n, n)
        scores = heads.transpose(1, 2)[:, :, batch, sources]  # (layers, H', B, S, n)
    return shape_result(scores, layer, has_axis, head)
