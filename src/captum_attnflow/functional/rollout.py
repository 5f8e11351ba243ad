"""Attention rollout (Abnar & Zuidema 2020, section 3, equation 1).

.. math::

    \\tilde A_l = A_l \\, \\tilde A_{l-1}, \\qquad \\tilde A_1 = A_1,

with :math:`A_l` the residual-adjusted attention of :func:`~captum_attnflow.functional.attention_graph`.
Entry :math:`\\tilde A_l[p, j]` is the share of input token :math:`j` in the representation of
position :math:`p` after layer :math:`l`, summed over all paths, each path weighted by the
product of its edges.

Per head (the paper's Appendix A.1): head :math:`k` of layer :math:`l` is
:math:`A_{l,k} \\tilde A_{l-1}`, that head's residual-mixed attention on top of the fused
rollout of the layers below, "treating all the layers below the layer of interest as single
head layers".
"""

from __future__ import annotations

import bisect

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from captum_attnflow.docstrings import fill_docstring
from captum_attnflow.functional.checks import (
    POSITION_DOC,
    Attentions,
    default_position,
    head_indices,
    layer_indices,
    positions,
    shape_result,
)
from captum_attnflow.functional.compiled import njit_on_first_call
from captum_attnflow.functional.graph import AttentionGraph, as_graph

HEAD_DOC = """``None`` (default) for the heads fused; an int k for head k of the
            explained layer on top of the fused layers below (Appendix A.1); ``"all"`` for
            every head, an extra head axis right after the layer axis."""


@fill_docstring(head=HEAD_DOC)
def rollout(
    attentions: Attentions | AttentionGraph,
    residual_alpha: float = 0.5,
    head_fusion: str = "mean",
    attention_mask: Tensor | None = None,
    head: int | str | None = None,
) -> Tensor:
    """Full attention rollout maps of every layer.

    Costs O(L n^3) per example; for the rows of a few positions use :func:`rollout_rows`.
    Differentiable: attentions that require grad give maps that do.

    Args:
        attentions: L tensors (B, H, n, n) in the transformers layout (row = query), one
            (L, B, H, n, n) tensor, or an :class:`~captum_attnflow.functional.AttentionGraph`
            (then ``residual_alpha``, ``head_fusion`` and ``attention_mask`` are the graph's).
        residual_alpha: :math:`\\alpha` in :math:`A = \\alpha W + (1 - \\alpha) I` (rows
            renormalised); 0.5 is the paper's.
        head_fusion: ``"mean"`` (paper), ``"max"`` or ``"min"`` over heads.
        attention_mask: optional (B, n), 1 on real tokens, 0 on padding; padding gets 0 and
            never influences real tokens.
        head: {head}

    Returns:
        (L, B, n, n) float32 (``head="all"``: (L, H, B, n, n)): entry ``[l, b, p, j]`` is the
        rollout of position ``p`` after layer ``l + 1`` onto input token ``j``.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional import rollout
        >>> attentions = torch.softmax(torch.randn(6, 2, 8, 5, 5), -1)  # (L, B, H, n, n)
        >>> rollout(attentions).shape, rollout(attentions, head="all").shape
        (torch.Size([6, 2, 5, 5]), torch.Size([6, 8, 2, 5, 5]))
    """
    graph = as_graph(attentions, residual_alpha, head_fusion, attention_mask, keep_heads=head is not None)
    maps = _fused_rollout(graph.weights)
    if head is None:
        return maps
    heads = graph.heads[:, :, head_indices(head, graph.heads.shape[2])]  # (L, B, H', n, n)
    identity = torch.eye(maps.shape[-1], dtype=maps.dtype, device=maps.device).expand_as(maps[:1])
    below = torch.cat([identity, maps[:-1]])  # rollout up to the layer below each layer, (L, B, n, n)
    per_head = (heads @ below[:, :, None]).transpose(1, 2)  # (L, H', B, n, n)
    return per_head.squeeze(1) if head != "all" else per_head


@fill_docstring(position=POSITION_DOC, head=HEAD_DOC)
def rollout_rows(
    attentions: Attentions | AttentionGraph,
    position: int | list[int] | Tensor | None = None,
    layer: int | None = -1,
    residual_alpha: float = 0.5,
    head_fusion: str = "mean",
    attention_mask: Tensor | None = None,
    head: int | str | None = None,
    show_progress: bool | None = None,
) -> Tensor:
    """Rollout of the explained positions onto the input tokens, top-down.

    Propagates the row vector :math:`e_p` down through the layers,
    :math:`r_l = e_p A_l A_{l-1} \\cdots A_1`, which costs O(l n^2) per explained layer
    instead of the O(L n^3) of the full maps. For ``layer=None`` the rows of all layers travel
    down together, so each :math:`A_l` is read once.

    Args:
        attentions: as in :func:`rollout`.
        position: {position}
            None (default): each example's last real token when the attention is causal (a
            decoder), else 0 (the CLS token).
        layer: 1..L (or negative from the top) for one layer, None for all layers.
        residual_alpha, head_fusion, attention_mask: as in :func:`rollout`.
        head: {head}
        show_progress: show a tqdm progress bar over the layers; None (default) shows one for
            a streamed graph (lean capture) whose layers hold more than about 1e8 numbers.

    Returns:
        float32 (B, n) for one layer and one position per example; a leading layer axis
        (L, ...) for ``layer=None``, a head axis after it for ``head="all"``, a position axis
        (..., S, n) for a list or (B, S) ``position``. Equal to
        ``rollout(...)[l, b, position[b]]``.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional import rollout_rows
        >>> attentions = torch.softmax(torch.randn(6, 2, 8, 5, 5), -1)  # (L, B, H, n, n)
        >>> rollout_rows(attentions, position=0, layer=None).shape
        torch.Size([6, 2, 5])
        >>> rollout_rows(attentions, position=[0, 4]).shape  # two positions in each example
        torch.Size([2, 2, 5])
    """
    graph, sources, has_axis, layers = explained_rows(
        attentions, position, layer, residual_alpha, head_fusion, attention_mask, head
    )
    if head is not None:
        scores = _head_rows(graph, sources, layers, head_indices(head, graph.heads.shape[2]))
    elif graph.is_streamed or graph.weights.device.type != "cpu" or graph.weights.requires_grad:
        scores = _propagate_rows(graph, sources, layers, show_progress)  # streamed: a layer at a time, top-down
    else:
        scores = torch.from_numpy(_rows_compiled(graph.weights.numpy(), sources.numpy(), layers, bool(show_progress)))
    return shape_result(scores, layer, has_axis, head)


def explained_rows(
    attentions: Attentions | AttentionGraph,
    position: int | list[int] | Tensor | None,
    layer: int | None,
    residual_alpha: float,
    head_fusion: str,
    attention_mask: Tensor | None,
    head: int | str | None,
) -> tuple[AttentionGraph, Tensor, bool, list[int]]:
    """The checked request of :func:`rollout_rows` and :func:`~captum_attnflow.functional.raw_attention`:
    ``(graph, sources (B, S), has_position_axis, layers)``, the graph keeping its heads when
    ``head`` is given, ``position`` None taken as each example's default (see :func:`rollout_rows`),
    ``layers`` 0-based."""
    graph = as_graph(attentions, residual_alpha, head_fusion, attention_mask, keep_heads=head is not None)
    if position is None:
        position = default_position(graph.mask, graph.is_causal)
    sources, has_axis = positions(position, graph.mask)
    return graph, sources, has_axis, layer_indices(layer, graph.num_layers)


def _fused_rollout(graph: Tensor) -> Tensor:
    """(L, B, n, n) products :math:`A_l \\cdots A_1`; stacked from a list under autograd, where
    writing into a preallocated tensor (``out=``) is not differentiable."""
    if graph.requires_grad:
        maps = [graph[0]]
        for index in range(1, graph.shape[0]):
            maps.append(graph[index] @ maps[-1])
        return torch.stack(maps)
    maps = torch.empty_like(graph)
    maps[0] = graph[0]
    for index in range(1, graph.shape[0]):
        torch.matmul(graph[index], maps[index - 1], out=maps[index])
    return maps


def _head_rows(graph: AttentionGraph, sources: Tensor, layers: list[int], heads: list[int]) -> Tensor:
    """(len(layers), H', B, S, n): row of each source in head h of each layer, then down the fused layers."""
    batch = torch.arange(sources.shape[0], device=sources.device)[:, None]
    results = []
    for index in layers:
        rows = graph.heads[index][:, heads][batch[:, :, None], torch.arange(len(heads), device=sources.device)[None, :, None], sources[:, None, :]]
        for below in range(index - 1, -1, -1):  # rows (B, H', S, n) times A_below (B, n, n)
            rows = rows @ graph.weights[below][:, None]
        results.append(rows.transpose(0, 1))
    return torch.stack(results)


def _propagate_rows(graph: AttentionGraph, sources: Tensor, layers: list[int], show_progress: bool | None) -> Tensor:
    """Rows of ``sources`` (B, S) after each of ``layers`` (sorted, 0-based) through ``graph``,
    each layer asked for once, top-down: (len(layers), B, S, n). Of the top layer only the
    sources' rows are asked for (a streamed graph computes just those)."""
    batch, count = sources.shape
    n = graph.mask.shape[1]
    # rows[:, k] explains the output of layers[k]; it is multiplied by A_l for every l <= layers[k].
    rows = graph.rows(layers[-1], sources)  # (B, S, n): the one-hot rows of the top layer, multiplied
    start = torch.nn.functional.one_hot(sources, n).to(rows.dtype)  # (B, S, n)
    rows = torch.cat([start[:, None].expand(batch, len(layers) - 1, count, n).reshape(batch, -1, n), rows], 1)
    # A streamed graph that builds its layers writes each one into ``layer``.
    builds = graph.is_streamed and not graph.is_blockwise and layers[-1] > 0
    layer = torch.empty(batch, n, n, device=rows.device) if builds else None
    for index in graph.walk(range(layers[-1] - 1, -1, -1), "attention rollout", show_progress):
        first = bisect.bisect_left(layers, index) * count
        rows = torch.cat([rows[:, :first], graph.propagate(index, rows[:, first:], layer)], 1)
    return rows.reshape(batch, len(layers), count, n).permute(1, 0, 2, 3)


def _rows_compiled(graph: np.ndarray, sources: np.ndarray, layers: list[int], show_progress: bool) -> np.ndarray:
    """:func:`_propagate_rows` for CPU arrays, one compiled call per source column: (len(layers), B, S, n).
    Milliseconds of work: a progress bar over the columns only when asked for."""
    _, batch, n, _ = graph.shape
    rows = np.empty((len(layers), batch, sources.shape[1], n), dtype=np.float32)
    for column in tqdm(range(sources.shape[1]), desc="attention rollout", unit="position", disable=not show_progress):
        out = np.empty((len(layers), batch, n), dtype=np.float32)
        _propagate_rows_kernel(graph, np.ascontiguousarray(sources[:, column]), np.asarray(layers), out)
        rows[:, :, column] = out
    return rows


# The same products as _propagate_rows for CPU tensors, serial on purpose: they are tiny (O(L^2 n^2)
# in all), and torch hands each one to a multithreaded BLAS whose threads, when other processes
# share the cores, wait for a time slice each call; that made 12 products of 2 ms take 200 ms.
@njit_on_first_call(cache=True, fastmath={"reassoc", "contract", "nsz", "arcp"})
def _propagate_rows_kernel(graph, positions, layers, rows):  # pragma: no cover
    _, batch, n, _ = graph.shape
    count = len(layers)
    step = np.empty((count, n), dtype=np.float32)
    for b in range(batch):
        rows[:, b] = 0.0
        rows[:, b, positions[b]] = 1.0
        first = count
        for index in range(layers[-1], -1, -1):
            while first > 0 and layers[first - 1] >= index:
                first -= 1
            step[first:] = 0.0
            for i in range(n):
                edges = graph[index, b, i]
                for k in range(first, count):
                    weight = rows[k, b, i]
                    if weight != 0.0:  # one-hot starts and padding make many rows sparse
                        target = step[k]
                        for j in range(n):
                            target[j] += weight * edges[j]
            rows[first:, b] = step[first:]
