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
CPU with each row's nonzero span packed (a decoder's causal attention: its lower triangles),
built one (B, n, n) layer at a time, so that with ``E`` = L n^2 edges (L n (n + 1) / 2 when
causal) it takes about ``(4 B + 8 T) E`` bytes with ``T`` kernel threads; a call that would not
fit in the memory available raises ValueError before it starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from captum_attnflow.docstrings import fill_docstring
from captum_attnflow.functional._memory import check_flow_fits
from captum_attnflow.functional.checks import POSITION_DOC, Attentions, head_indices, layer_indices, positions, shape_result
from captum_attnflow.functional.graph import AttentionGraph, as_graph
from captum_attnflow.functional.rollout import HEAD_DOC

if TYPE_CHECKING:
    from captum_attnflow.functional._maxflow import PackedGraph

# Below about this many edge visits (pairs x layers x n^2) a call takes well under a second,
# and a progress bar would only flicker.
_PROGRESS_WORK = 2e9


@fill_docstring(position=POSITION_DOC, head=HEAD_DOC)
def flow(
    attentions: Attentions | AttentionGraph,
    layer: int | None = -1,
    sources: int | Sequence[int] | Tensor | None = None,
    residual_alpha: float = 0.5,
    head_fusion: str = "mean",
    attention_mask: Tensor | None = None,
    normalize: bool = False,
    show_progress: bool | None = None,
    head: int | str | None = None,
) -> Tensor:
    """Attention flow from positions after ``layer`` to every input token.

    Entry ``[b, a, j]`` is the maximum flow from node ``(layer, sources[b, a])`` to node
    ``(0, j)`` in the graph of :math:`A_1..A_{layer}` of example ``b`` (section 3 of the paper);
    it lies in ``[0, 1]`` because a node's out-capacity is a row of :math:`A`, which sums to 1
    (up to the float32 rounding of that sum: a flow may exceed 1 by ~1e-7). Per head
    (Appendix A.1), the top layer's capacities are that head's residual-mixed attention and
    the layers below are fused.

    Args:
        attentions: L tensors (B, H, n, n) in the transformers layout (row = query), one
            (L, B, H, n, n) tensor, or an :class:`~captum_attnflow.functional.AttentionGraph`
            (then ``residual_alpha``, ``head_fusion`` and ``attention_mask`` are the graph's).
        layer: 1..L (or negative from the top) for one layer, None for all layers.
        sources: {position}
            None (default): all n positions, as a position axis of size n.
        residual_alpha: :math:`\\alpha` in :math:`A = \\alpha W + (1 - \\alpha) I` (rows
            renormalised); 0.5 is the paper's.
        head_fusion: ``"mean"`` (paper), ``"max"`` or ``"min"`` over heads.
        attention_mask: optional (B, n), 1 on real tokens, 0 on padding. Padding positions are
            not in the graph: their flows are 0, also as sources.
        normalize: False (default) returns the raw max-flow values, the paper's definition;
            True rescales each source's vector to sum to 1, as the authors' released code did.
        show_progress: show a tqdm progress bar; None (default) shows one only for long
            computations.
        head: {head}

    Returns:
        float32 (B, S, n) for one layer (``sources`` None, a list or (B, S)), (B, n) for one
        source per example (an int or a (B,) tensor); a leading layer axis for
        ``layer=None`` and a head axis after it for ``head="all"``; on the attentions' device.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional import flow
        >>> attentions = torch.softmax(torch.randn(6, 2, 8, 5, 5), -1)  # (L, B, H, n, n)
        >>> flow(attentions, layer=-1, sources=0).shape  # one source per example
        torch.Size([2, 5])
        >>> flow(attentions, layer=None).shape  # every position after every layer
        torch.Size([6, 2, 5, 5])
    """
    graph = as_graph(attentions, residual_alpha, head_fusion, attention_mask, keep_heads=head is not None)
    batch, n = graph.mask.shape
    layers = layer_indices(layer, graph.num_layers)
    if sources is None:
        source_positions, has_axis = torch.arange(n, device=graph.mask.device).expand(batch, n), True
    else:
        source_positions, has_axis = positions(sources, graph.mask, "sources")
    num_sources = source_positions.shape[1]
    heads = head_indices(head, graph.heads.shape[2]) if head is not None else [None]

    # The kernel (numba, imported here: a process that never computes flow does not load it).
    # numba's threading layer, started by its first call, resets the process's OpenMP thread count,
    # which torch reads too: the caller's torch thread count is put back afterwards.
    import numba

    from captum_attnflow.functional._maxflow import max_flows

    torch_threads = torch.get_num_threads()
    threads = numba.get_num_threads()
    torch.set_num_threads(torch_threads)
    check_flow_fits(layers[-1] + 1, batch, n, num_sources, len(layers) * len(heads), threads, graph.is_causal)
    caps = _packed_graphs(graph, layers[-1] + 1, show_progress)
    head_caps = graph.heads.detach().to("cpu", torch.float32).numpy() if head is not None else None
    real = graph.mask.cpu().numpy()
    source_positions = source_positions.cpu().numpy()
    values = np.zeros((len(layers), len(heads), batch, num_sources, n))
    lengths = real.sum(1)
    work = len(heads) * sum(num_sources * int(m) * int(m) ** 2 for m in lengths) * sum(index + 1 for index in layers)
    show = work > _PROGRESS_WORK if show_progress is None else show_progress
    progress = tqdm(
        total=len(layers) * len(heads) * batch * num_sources, desc="attention flow", unit="source", disable=not show
    )
    try:
        for b in range(batch):
            keep = np.flatnonzero(real[b])
            renumber = np.full(n, -1)
            renumber[keep] = np.arange(keep.size)
            example_sources = renumber[source_positions[b]]
            valid = np.flatnonzero(example_sources >= 0)
            for out, index in enumerate(layers):
                for slot, k in enumerate(heads):
                    cap = caps[b].first(index + 1)  # a prefix of the packed layers: no copy
                    if k is not None:  # Appendix A.1: head k on top, the layers below fused
                        cap = cap.with_top(np.ascontiguousarray(head_caps[index, b, k][keep[:, None], keep]))
                    # All sources of the example in one call on one graph.
                    result, _ = max_flows(cap, example_sources[valid], threads, progress.update if show else None)
                    values[out, slot, b, valid[:, None], keep[None, :]] = result
                    progress.update(num_sources - valid.size)
            caps[b] = None  # done with this example's graph
    finally:
        torch.set_num_threads(torch_threads)
    progress.close()

    result = torch.from_numpy(values)
    if normalize:
        totals = result.sum(-1, keepdim=True)
        result = result / torch.where(totals > 0, totals, torch.ones_like(totals))
    result = result.to(device=graph.mask.device, dtype=torch.float32)
    if head is None:
        result = result[:, 0]
    return shape_result(result, layer, has_axis, head)


def _packed_graphs(graph: AttentionGraph, count: int, show_progress: bool | None) -> list[PackedGraph]:
    """Each example's graph of :math:`A_1..A_{count}`, padding removed (the real positions
    renumbered), rows packed; built one (B, n, n) layer at a time (a streamed graph computes
    each into one reused buffer), never as an (L, B, n, n) tensor; ``show_progress`` as in
    :meth:`AttentionGraph.walk`."""
    from captum_attnflow.functional._maxflow import GraphPacker

    batch, n = graph.mask.shape
    real = graph.mask.cpu().numpy()
    keeps = [np.flatnonzero(real[b]) for b in range(batch)]
    packers = [GraphPacker(count, keep.size, triangle=graph.is_causal) for keep in keeps]
    on_cpu = graph.mask.device.type == "cpu"
    buffer = torch.empty(batch, n, n, dtype=torch.float32, device=graph.mask.device) if graph.is_streamed else None
    # Only a streamed graph computes its layers here; a stored one is packed in a moment.
    show = show_progress if graph.is_streamed else False
    for index in graph.walk(range(count), "attention graph", show):
        layer = graph.layer(index, out=buffer).detach()
        layer = (layer if on_cpu else layer.cpu()).float().numpy()
        for b, keep in enumerate(keeps):
            if keep.size == n:  # no padding: the layer itself, not a copy
                packers[b].add(np.ascontiguousarray(layer[b]))
            else:  # one copy (chained indexing would copy twice)
                packers[b].add(np.ascontiguousarray(layer[b][keep[:, None], keep]))
    return [packer.graph() for packer in packers]
