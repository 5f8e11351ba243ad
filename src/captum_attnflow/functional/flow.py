"""Attention flow (Abnar & Zuidema 2020, section 3): maximum flow through the attention graph.

The residual-adjusted attention matrices :math:`A_l` of
:func:`~captum_attnflow.functional.attention_graph` define a layered flow network: a node
:math:`(l, i)` for every position :math:`i` at every layer :math:`l = 0..L`, and an edge
:math:`(l, i) \\to (l-1, j)` of capacity :math:`A_l[i, j]`. The attention flow of input token
:math:`j` for position :math:`p` after layer :math:`l` is the value of the maximum flow from
:math:`(l, p)` to :math:`(0, j)`. Unlike rollout, which sums products along paths, a max flow
is limited by the narrowest cut between the two nodes.

The max flows run in a compiled kernel (:mod:`captum_attnflow.functional._maxflow`) adding
flows in float64 on the float32 capacities: each value is at most ``1e-12`` per graph edge below
the exact maximum flow of the graph given in float32 (see that module for the certificate), far
below float32's own rounding. The graph of the layers up to the requested one is held on the
CPU, ``(4 B + 9 + 16 T) L n^2`` bytes with ``T`` kernel threads; a call that would not fit in
the memory available raises ValueError before it starts.
"""

from __future__ import annotations

from typing import Sequence

import numba
import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from captum_attnflow.functional._checks import Attentions, as_mask, layer_indices, position_indices
from captum_attnflow.functional._maxflow import max_flows
from captum_attnflow.functional._memory import check_flow_fits
from captum_attnflow.functional.graph import attention_graph

# Below about this many edge visits (pairs x layers x n^2) a call takes well under a second,
# and a progress bar would only flicker.
_PROGRESS_WORK = 2e9
# Sources per kernel call when a progress bar is shown: small enough for regular updates,
# large enough to keep every core busy.
_SOURCES_PER_UPDATE = 8


def flow(
    attentions: Attentions,
    layer: int | None = -1,
    sources: int | Sequence[int] | Tensor | None = None,
    residual_alpha: float = 0.5,
    head_fusion: str = "mean",
    attention_mask: Tensor | None = None,
    normalize: bool = False,
    show_progress: bool | None = None,
) -> Tensor:
    """Attention flow from positions after ``layer`` to every input token.

    Entry ``[b, a, j]`` is the maximum flow from node ``(layer, sources[a])`` to node
    ``(0, j)`` in the graph of :math:`A_1..A_{layer}` of example ``b`` (section 3 of the paper);
    it lies in ``[0, 1]`` because a node's out-capacity is a row of :math:`A`, which sums to 1
    (up to the float32 rounding of that sum: a flow may exceed 1 by ~1e-7).

    Args:
        attentions: L tensors (B, H, n, n) in the transformers layout (row = query), or one
            (L, B, H, n, n) tensor.
        layer: 1..L (or negative from the top) for one layer, None for all layers.
        sources: the explained positions: None for all n positions, an int or a sequence of
            S ints for every example (negative counts from n), or a (B, S) LongTensor with the
            positions of each example. Explicit sources must not fall on padding.
        residual_alpha: :math:`\\alpha` in :math:`A = \\alpha W + (1 - \\alpha) I` (rows
            renormalised); 0.5 is the paper's.
        head_fusion: ``"mean"`` (paper), ``"max"`` or ``"min"`` over heads.
        attention_mask: optional (B, n), 1 on real tokens, 0 on padding. Padding positions are
            not in the graph: their flows are 0, also as sources.
        normalize: False (default) returns the raw max-flow values, the paper's definition;
            True rescales each source's vector to sum to 1, as the authors' released code did.
        show_progress: show a tqdm progress bar; None (default) shows one only for long
            computations.

    Returns:
        float32 (B, S, n) for one layer, (L, B, S, n) for ``layer=None``, on the attentions'
        device (S = n for ``sources=None``).

    Example::

        >>> import torch
        >>> from captum_attnflow.functional import flow
        >>> attentions = torch.softmax(torch.randn(6, 2, 8, 5, 5), -1)  # (L, B, H, n, n)
        >>> flow(attentions, layer=-1, sources=0).shape
        torch.Size([2, 1, 5])
    """
    graph = attention_graph(attentions, residual_alpha, head_fusion, attention_mask)
    num_layers, batch, n, _ = graph.shape
    mask = as_mask(attention_mask, batch, n, graph.device)
    layers = layer_indices(layer, num_layers)
    source_positions = _source_indices(sources, mask)
    num_sources = source_positions.shape[1]

    threads = numba.get_num_threads()
    check_flow_fits(layers[-1] + 1, batch, n, num_sources, len(layers), threads)
    # The kernel stores capacities in float32 (float32 attentions are taken exactly; the result is
    # float32 anyway) and adds flows in float64.
    caps = graph[: layers[-1] + 1].detach().to("cpu", torch.float32).numpy()
    real = mask.cpu().numpy()
    source_positions = source_positions.cpu().numpy()
    values = np.zeros((len(layers), batch, num_sources, n))
    lengths = real.sum(1)
    work = sum(num_sources * int(m) * int(m) ** 2 for m in lengths) * sum(index + 1 for index in layers)
    show = work > _PROGRESS_WORK if show_progress is None else show_progress
    progress = tqdm(total=len(layers) * batch * num_sources, desc="attention flow", unit="source", disable=not show)
    per_call = _SOURCES_PER_UPDATE if show else num_sources
    for b in range(batch):
        keep = np.flatnonzero(real[b])
        # Padding is not in the graph: the kernel sees the real positions only, renumbered.
        renumber = np.full(n, -1)
        renumber[keep] = np.arange(keep.size)
        example_sources = renumber[source_positions[b]]
        valid = np.flatnonzero(example_sources >= 0)
        for out, index in enumerate(layers):
            cap = np.ascontiguousarray(caps[: index + 1, b][:, keep][:, :, keep])
            for start in range(0, valid.size, per_call):
                chunk = valid[start : start + per_call]
                result, _ = max_flows(cap, example_sources[chunk], threads)
                values[out, b, chunk[:, None], keep[None, :]] = result
                progress.update(chunk.size)
            progress.update(num_sources - valid.size)
    progress.close()

    result = torch.from_numpy(values)
    if normalize:
        totals = result.sum(-1, keepdim=True)
        result = result / torch.where(totals > 0, totals, torch.ones_like(totals))
    result = result.to(device=graph.device, dtype=torch.float32)
    return result[0] if layer is not None else result


def _source_indices(sources: int | Sequence[int] | Tensor | None, mask: Tensor) -> Tensor:
    """(B, S) LongTensor of source positions; padding sources only where ``sources`` is None."""
    batch, n = mask.shape
    if sources is None:
        return torch.arange(n, device=mask.device).expand(batch, n)
    if isinstance(sources, Tensor) and sources.dim() == 2:
        if sources.shape[0] != batch:
            raise ValueError(
                f"per-example positions must have one row per example, shape (B, S) or (B,) with B = {batch}, "
                f"got {tuple(sources.shape)}."
            )
        columns = sources.unbind(1)
    elif isinstance(sources, Tensor) and sources.dim() == 1:
        columns = [int(source) for source in sources.tolist()]
    elif isinstance(sources, (int, Tensor)):
        columns = [sources]
    elif isinstance(sources, Sequence) and not isinstance(sources, str):
        columns = list(sources)
    else:
        raise TypeError(
            f"sources must be None, an int, a sequence of ints or a (B, S) LongTensor, got {type(sources).__name__}."
        )
    if len(columns) == 0:
        raise ValueError("sources is empty: pass at least one position, or None for all positions.")
    return torch.stack([position_indices(column, mask) for column in columns], 1)
