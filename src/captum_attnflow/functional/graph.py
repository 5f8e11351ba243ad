"""The attention graph of Abnar & Zuidema (2020), section 3: head fusion and residual mixing.

Every method of the paper starts from the same per-layer matrices

.. math::

    A_l = \\operatorname{renorm}\\big(\\alpha \\, \\bar W_l + (1 - \\alpha) I\\big),

where :math:`\\bar W_l` fuses the heads of layer :math:`l` (the paper averages them),
:math:`\\alpha = 0.5` accounts for the residual connection and ``renorm`` rescales each row
to sum to 1. Row :math:`i` holds the edges from position :math:`i` at layer :math:`l` to the
positions of layer :math:`l - 1`.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterable

import numpy as np
import torch
from numba import njit
from torch import Tensor
from tqdm.auto import tqdm

from captum_attnflow.functional.checks import (
    Attentions,
    as_mask,
    attention_layers,
    check_attention_values,
    check_residual_alpha,
    check_row_statistics,
)

HEAD_FUSIONS = ("mean", "max", "min")


# A streamed layer is recomputed from queries and keys when asked for (about 0.3 s for BERT-base at
# n = 4096 on 2 cores): from about this many numbers (B n^2 per layer) in the layers walked, a walk
# takes seconds and shows a progress bar.
_PROGRESS_NUMBERS = 1e8


def fuse_heads(attentions: Tensor, head_fusion: str = "mean", out: Tensor | None = None) -> Tensor:
    """Fuse the heads of (..., H, n, n) attentions into (..., n, n): :math:`\\bar W = \\operatorname{mean}_h W^h`
    (the paper's), or the element-wise ``max`` or ``min`` over heads.

    Args:
        attentions: (..., H, n, n) attention weights, heads on dimension -3.
        head_fusion: ``"mean"`` (default), ``"max"`` or ``"min"``.
        out: optional (..., n, n) tensor to write the result into.

    Returns:
        Tensor: (..., n, n), same dtype and device (``out`` if given).

    Example::

        >>> import torch
        >>> from captum_attnflow.functional import fuse_heads
        >>> heads = torch.tensor([[[0.2, 0.8], [1.0, 0.0]], [[0.6, 0.4], [0.0, 1.0]]])  # (H, n, n)
        >>> fuse_heads(heads)
        tensor([[0.4000, 0.6000],
                [0.5000, 0.5000]])
        >>> fuse_heads(heads, "max")
        tensor([[0.6000, 0.8000],
                [1.0000, 1.0000]])
    """
    check_head_fusion(head_fusion)
    reduce = {"mean": torch.mean, "max": torch.amax, "min": torch.amin}[head_fusion]
    return reduce(attentions, -3) if out is None else reduce(attentions, -3, out=out)


def check_head_fusion(head_fusion: str) -> None:
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"head_fusion must be one of {HEAD_FUSIONS}, got {head_fusion!r}.")


def add_residual(weights: Tensor, residual_alpha: float = 0.5) -> Tensor:
    """Mix (..., n, n) attention with the identity for the residual connection (paper, section 3):
    :math:`A = \\operatorname{renorm}(\\alpha W + (1 - \\alpha) I)`, each row rescaled to sum to 1.

    A row that is all zero becomes the identity row (or stays zero for ``residual_alpha=1``);
    :func:`attention_graph` zeroes padding rows afterwards.

    Args:
        weights: (..., n, n) attention weights (heads already fused), row = query.
        residual_alpha: :math:`\\alpha` in [0, 1]; 0.5 (default) is the paper's, 1.0 leaves
            the weights as they are (rows renormalised).

    Returns:
        Tensor: a new (..., n, n) tensor; ``weights`` is not modified.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional import add_residual
        >>> add_residual(torch.tensor([[0.2, 0.8], [1.0, 0.0]]))  # 0.5 W + 0.5 I
        tensor([[0.6000, 0.4000],
                [0.5000, 0.5000]])
    """
    check_residual_alpha(residual_alpha)
    mixed = weights * residual_alpha
    mixed.diagonal(dim1=-2, dim2=-1).add_(1.0 - residual_alpha)
    return _renormalise_rows(mixed)


class AttentionGraph:
    """The checked attention graph of a batch: what rollout, flow and raw attention consume.

    Built by :func:`attention_graph`, which validates the attentions, the mask, ``residual_alpha``
    and ``head_fusion`` once; the functions that take it trust it and re-check nothing.

    A graph may also be *streamed* (:meth:`streamed`): each layer's head-fused probabilities come
    from a function when a layer is asked for, so that rollout can walk the layers top-down
    holding at most one (B, n, n) layer (:meth:`propagate`, block by block when the function
    gives blocks of rows) and raw attention computes only its rows (:meth:`rows`); ``weights``
    builds all layers on first access. A graph may be used from several threads at once.

    Attributes:
        weights: (L, B, n, n) float32, :math:`A_l` per layer; rows of real tokens sum to 1,
            padding rows and columns are 0.
        mask: (B, n) bool, True on real tokens.
        residual_alpha: the :math:`\\alpha` it was built with.
        head_fusion: how its heads were fused.
        heads: (L, B, H, n, n) float32, each head's attention residual-mixed on its own,
            :math:`\\operatorname{renorm}(\\alpha W^h_l + (1 - \\alpha) I)`, padding removed as in
            ``weights``; only when built with ``keep_heads=True`` (the per-head analysis of the
            paper's Appendix A.1), else None.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional import attention_graph
        >>> graph = attention_graph(torch.softmax(torch.randn(6, 2, 8, 5, 5), -1))
        >>> graph.weights.shape, graph.mask.shape, graph.num_layers
        (torch.Size([6, 2, 5, 5]), torch.Size([2, 5]), 6)
    """

    def __init__(
        self,
        weights: Tensor | None,
        mask: Tensor,
        residual_alpha: float = 0.5,
        head_fusion: str = "mean",
        heads: Tensor | None = None,
    ) -> None:
        self._weights = weights
        self.mask = mask
        self.residual_alpha = residual_alpha
        self.head_fusion = head_fusion
        self.heads = heads
        self._stream: Callable[[int, Tensor | None], Tensor] | None = None
        self._stream_rows: Callable[[int, Tensor], Tensor] | None = None
        self._stream_blocks: Callable[[int], Iterable[tuple[int, int, Tensor]]] | None = None
        self._building = threading.Lock()
        self._num_layers = weights.shape[0] if weights is not None else 0
        self._causal: bool | None = None

    @classmethod
    def streamed(
        cls,
        fused_layer: Callable[[int, Tensor | None], Tensor],
        num_layers: int,
        attention_mask: Tensor | None,
        batch: int,
        n: int,
        device: torch.device,
        residual_alpha: float = 0.5,
        head_fusion: str = "mean",
        causal: bool | None = None,
        fused_rows: Callable[[int, Tensor], Tensor] | None = None,
        fused_blocks: Callable[[int], Iterable[tuple[int, int, Tensor]]] | None = None,
    ) -> "AttentionGraph":
        """A graph whose layers are computed when asked for: ``fused_layer(l, out)`` gives the
        head-fused attention probabilities (B, n, n) of layer l (0-based), written into ``out``
        (B, n, n) float32 when that is a tensor, else in a new tensor; the graph mixes them with
        the residual. ``causal`` tells whether the attention is causal, if known.
        ``fused_rows(l, rows)``, if given, gives only the rows ``rows`` (B, S) of that matrix,
        (B, S, n), for :meth:`rows` (else they are taken from the whole layer).
        ``fused_blocks(l)``, if given, yields the matrix by blocks of rows, ``(start, stop,
        block)`` with ``block`` (B, stop - start, w) the rows start..stop over the first w
        columns (the others 0), each valid until the next; :meth:`propagate` then never holds
        the whole layer.

        Example::

            >>> import torch
            >>> from captum_attnflow.functional import AttentionGraph, attention_graph
            >>> attentions = torch.softmax(torch.randn(2, 1, 4, 5, 5), -1)  # (L, B, H, n, n)
            >>> def fused_layer(index, out):
            ...     fused = attentions[index].mean(1)
            ...     return fused if out is None else out.copy_(fused)
            >>> graph = AttentionGraph.streamed(fused_layer, 2, None, 1, 5, torch.device("cpu"))
            >>> torch.allclose(graph.layer(1), attention_graph(attentions).weights[1])
            True
        """
        check_head_fusion(head_fusion)
        check_residual_alpha(residual_alpha)
        graph = cls(None, as_mask(attention_mask, batch, n, device), float(residual_alpha), head_fusion)
        graph._stream = fused_layer
        graph._stream_rows = fused_rows
        graph._stream_blocks = fused_blocks
        graph._num_layers = num_layers
        graph._causal = causal
        return graph

    @classmethod
    def from_fused(
        cls, fused: Tensor, residual_alpha: float = 0.5, head_fusion: str = "mean", attention_mask: Tensor | None = None
    ) -> "AttentionGraph":
        """The graph of head-fused attention probabilities (L, B, n, n), e.g. collected layer by
        layer during a forward pass; mixed with the residual in place (``fused`` becomes the
        graph's ``weights``, no copy). Rows are trusted to be fused probability rows.

        Example::

            >>> import torch
            >>> from captum_attnflow.functional import AttentionGraph, attention_graph
            >>> attentions = torch.softmax(torch.randn(2, 1, 4, 5, 5), -1)  # (L, B, H, n, n)
            >>> graph = AttentionGraph.from_fused(attentions.mean(2))
            >>> torch.allclose(graph.weights, attention_graph(attentions).weights)
            True
        """
        check_head_fusion(head_fusion)
        check_residual_alpha(residual_alpha)
        if fused.dim() != 4 or fused.shape[-1] != fused.shape[-2]:
            raise ValueError(f"fused attentions must be (L, B, n, n), got {tuple(fused.shape)}.")
        mask = as_mask(attention_mask, fused.shape[1], fused.shape[2], fused.device)
        for layer in fused:  # in place, one layer at a time: no second (L, B, n, n) tensor
            _mix_in_place(layer, mask, float(residual_alpha))
        return cls(fused, mask, float(residual_alpha), head_fusion)

    def first_layers(self, count: int) -> Tensor:
        """(count, B, n, n) float32 :math:`A_1..A_{count}`; a streamed graph computes only these
        (and keeps none of them)."""
        if self._weights is not None or count == self._num_layers:
            return self.weights[:count]
        return self._computed(count)

    def _computed(self, count: int) -> Tensor:
        """(count, B, n, n) float32: the first ``count`` layers, computed one by one into a new tensor."""
        batch, n = self.mask.shape
        layers = torch.empty(count, batch, n, n, dtype=torch.float32, device=self.mask.device)
        for index in self.walk(range(count), "attention layers"):
            self.layer(index, out=layers[index])
        return layers

    @property
    def weights(self) -> Tensor:
        """(L, B, n, n) float32 :math:`A_l`; a streamed graph builds all its layers here, once,
        and lets go of the functions that computed them."""
        if self._weights is None:
            with self._building:  # threads sharing the graph build it once
                if self._weights is None:
                    self._weights = self._computed(self._num_layers)
                    # Never asked again: what they hold (a lean capture's queries and keys) can
                    # go. Readers take a function before looking at ``_weights``, set first.
                    self._stream = self._stream_rows = self._stream_blocks = None
        return self._weights

    @property
    def is_streamed(self) -> bool:
        """Whether the layers are still computed one at a time (``weights`` not built yet)."""
        return self._weights is None

    def layer(self, index: int, out: Tensor | None = None) -> Tensor:
        """:math:`A_l` of layer ``index`` (0-based), (B, n, n) float32; written into ``out``
        (B, n, n) float32 if given (a streamed graph then allocates no layer of its own)."""
        stream = self._stream
        if stream is None or self._weights is not None:
            return self.weights[index] if out is None else out.copy_(self.weights[index])
        fused = stream(index, out).float()
        if out is not None and fused.data_ptr() != out.data_ptr():
            fused = out.copy_(fused)
        return _mix_in_place(fused, self.mask, self.residual_alpha)

    def walk(self, indices: Iterable[int], description: str, show_progress: bool | None = None) -> Iterable[int]:
        """The layer ``indices`` in order, with a tqdm progress bar: shown when ``show_progress``
        is True, or when None (default) for a streamed graph whose layers walked hold more than
        about 1e8 numbers (B n^2 each), where recomputing them takes seconds."""
        indices = list(indices)
        batch, n = self.mask.shape
        large = self.is_streamed and batch * n * n * len(indices) > _PROGRESS_NUMBERS
        show = large if show_progress is None else show_progress
        return tqdm(indices, desc=description, unit="layer", disable=not show)

    @property
    def is_blockwise(self) -> bool:
        """Whether :meth:`propagate` multiplies block by block, never building a whole layer."""
        return self._weights is None and self._stream_blocks is not None

    def propagate(self, index: int, rows: Tensor, layer: Tensor | None = None) -> Tensor:
        """``rows`` (B, c, n) times :math:`A_l` of layer ``index``: (B, c, n) float32.

        A streamed graph with ``fused_blocks`` multiplies block by block and mixes the residual
        in implicitly: with :math:`s_i = \\alpha \\sum_{j \\text{ real}} W_{ij} + 1 - \\alpha`
        (the row sums :math:`A` is renormalised by) and :math:`u = v \\odot m / s`,
        :math:`v A = m \\odot (\\alpha\\, u W + (1 - \\alpha) u)` (:math:`m` the real-token
        mask), so the (B, n, n) layer is never written out. Otherwise the layer is built, into
        ``layer`` (B, n, n) if given.
        """
        blocks = self._stream_blocks
        if blocks is None or self._weights is not None:
            return torch.bmm(rows, self.layer(index, out=layer))
        alpha = self.residual_alpha
        mask = self.mask.to(rows.dtype)  # (B, n)
        product = torch.zeros_like(rows)
        scaled = torch.empty_like(rows)  # u
        for start, stop, block in blocks(index):  # block (B, R, w): W[start:stop, :w]
            width = block.shape[-1]
            sums = torch.bmm(block, mask[:, :width, None]).squeeze(-1).mul_(alpha).add_(1.0 - alpha)  # (B, R)
            sums = torch.where(sums > 0, sums, torch.ones_like(sums))
            scaled[..., start:stop] = rows[..., start:stop] * (mask[:, None, start:stop] / sums[:, None, :])
            product[..., :width].baddbmm_(scaled[..., start:stop], block)
        return product.mul_(alpha).add_(scaled, alpha=1.0 - alpha).mul_(mask[:, None, :])

    def rows(self, index: int, positions: Tensor) -> Tensor:
        """Rows ``positions`` (B, S) of :math:`A_l`, layer ``index`` (0-based): (B, S, n) float32.
        A streamed graph with ``fused_rows`` computes only those rows."""
        stream_rows = self._stream_rows
        if stream_rows is not None and self._weights is None:
            fused = stream_rows(index, positions).float()
            return _mix_in_place(fused, self.mask, self.residual_alpha, positions)
        batch = torch.arange(positions.shape[0], device=positions.device)[:, None]
        return self.layer(index)[batch, positions]

    @property
    def num_layers(self) -> int:
        """L, the number of layers."""
        return self._num_layers

    @property
    def is_causal(self) -> bool:
        """Whether every real token attends only to itself and earlier tokens, in every layer
        (a decoder's attention): then the last real token is the one that has seen the input."""
        if self._causal is None:
            # One layer at a time: a triu of all layers at once would copy the whole graph.
            self._causal = not any(bool(self.layer(index).triu(1).any()) for index in range(self._num_layers))
        return self._causal


def _mix_in_place(layer: Tensor, mask: Tensor, residual_alpha: float, positions: Tensor | None = None) -> Tensor:
    """(B, n, n) fused probabilities -> :math:`A`: padding removed, :math:`\\alpha W + (1 - \\alpha) I`,
    rows renormalised, all in place; returns ``layer``. With ``positions`` (B, S), ``layer`` is
    (B, S, n), the rows of those positions only."""
    row_mask = mask if positions is None else mask.gather(1, positions)
    keep = None if mask.all() else row_mask[:, :, None] & mask[:, None, :]
    if keep is not None:
        layer.mul_(keep)
    layer.mul_(residual_alpha)
    if positions is None:
        layer.diagonal(dim1=-2, dim2=-1).add_(1.0 - residual_alpha)
    else:  # the residual's 1 - alpha sits in each row's own column
        layer.scatter_add_(-1, positions[..., None], torch.full_like(layer[..., :1], 1.0 - residual_alpha))
    sums = layer.sum(-1, keepdim=True)
    layer.div_(torch.where(sums > 0, sums, torch.ones_like(sums)))
    if keep is not None:
        layer.mul_(keep)
    return layer


def attention_graph(
    attentions: Attentions,
    residual_alpha: float = 0.5,
    head_fusion: str = "mean",
    attention_mask: Tensor | None = None,
    keep_heads: bool = False,
) -> AttentionGraph:
    """Residual-adjusted, head-fused attention matrices :math:`A_l`, checked once.

    Args:
        attentions: L tensors (B, H, n, n) as returned by transformers for
            ``output_attentions=True`` (row = query), or one (L, B, H, n, n) tensor.
        residual_alpha: weight :math:`\\alpha` of attention against the residual identity;
            0.5 is the paper's, 1.0 keeps raw attention.
        head_fusion: ``"mean"`` (paper), ``"max"`` or ``"min"`` over heads.
        attention_mask: optional (B, n), 1 on real tokens, 0 on padding. Padding positions
            are removed from the graph: their rows and columns are zero, and the rows of real
            tokens are renormalised over real tokens only.
        keep_heads: also keep every head's residual-mixed matrices (``heads``, H times the
            memory of ``weights``), for per-head rollout and flow.

    Returns:
        AttentionGraph: ``weights`` float32 (L, B, n, n), rows of real tokens summing to 1,
        and the (B, n) bool ``mask``.

    Raises:
        ValueError: attentions of the wrong shape, rows of real tokens that are negative,
            NaN or do not sum to 1 (see :func:`~captum_attnflow.functional.checks.check_attention_values`),
            a mask of other values than 0/1, ``residual_alpha`` outside [0, 1], an unknown ``head_fusion``.

    On CPU, for attentions that need no gradient, each layer is fused and mixed in one compiled
    pass (numba, compiled on first use and cached) that also gathers the row statistics, checked
    once for all layers; otherwise (CUDA, autograd) torch ops compute the same, differentiably.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional import attention_graph
        >>> attentions = torch.softmax(torch.randn(6, 2, 8, 5, 5), -1)  # (L, B, H, n, n)
        >>> attention_graph(attentions).weights.sum(-1).allclose(torch.ones(6, 2, 5))
        True
    """
    layers = attention_layers(attentions)
    batch, _, n, _ = layers[0].shape
    device = layers[0].device
    mask = as_mask(attention_mask, batch, n, device)
    check_head_fusion(head_fusion)
    check_residual_alpha(residual_alpha)
    residual_alpha = float(residual_alpha)
    heads = _head_graphs(layers, residual_alpha, mask) if keep_heads else None
    weights = _fused_graph(layers, residual_alpha, head_fusion, mask)
    return AttentionGraph(weights, mask, residual_alpha, head_fusion, heads)


def as_graph(
    attentions: Attentions | AttentionGraph,
    residual_alpha: float = 0.5,
    head_fusion: str = "mean",
    attention_mask: Tensor | None = None,
    keep_heads: bool = False,
) -> AttentionGraph:
    """``attentions`` as an :class:`AttentionGraph`: built by :func:`attention_graph`, or
    returned as it is when it already is one (built with heads when ``keep_heads`` asks for them)."""
    if isinstance(attentions, AttentionGraph):
        if keep_heads and attentions.heads is None:
            raise ValueError(
                "per-head results need the heads of the graph: build it with attention_graph(..., keep_heads=True)."
            )
        return attentions
    return attention_graph(attentions, residual_alpha, head_fusion, attention_mask, keep_heads)


def _fused_graph(layers: list[Tensor], residual_alpha: float, head_fusion: str, mask: Tensor) -> Tensor:
    """(L, B, n, n) fused, residual-mixed graph; the attentions' values are checked on the way."""
    batch, _, n, _ = layers[0].shape
    graph = torch.empty(len(layers), batch, n, n, dtype=torch.float32, device=mask.device)
    if mask.device.type == "cpu" and not any(layer.requires_grad for layer in layers):
        heads = layers[0].shape[1]
        row_sums = np.empty((len(layers), batch, heads, n), dtype=np.float32)
        negative_sums = np.empty_like(row_sums)
        for index, layer in enumerate(layers):
            _compiled_graph_layer(
                layer.float(), mask, head_fusion, residual_alpha, graph[index], row_sums[index], negative_sums[index]
            )
        # One check of all layers' row statistics: a call per layer costs more than a small graph.
        check_row_statistics(torch.from_numpy(row_sums), torch.from_numpy(negative_sums), mask)
        return graph
    # Layer by layer rather than on a stacked copy: only the fused (L, B, n, n) graph is allocated.
    fused = []
    for layer in layers:
        layer = layer.float()
        check_attention_values(layer, mask)
        fused.append(fuse_heads(layer, head_fusion))
    return _mixed(torch.stack(fused), residual_alpha, mask)


def _head_graphs(layers: list[Tensor], residual_alpha: float, mask: Tensor) -> Tensor:
    """(L, B, H, n, n): every head residual-mixed on its own, padding removed."""
    heads = torch.stack([layer.float() for layer in layers])
    check_attention_values(heads, mask)
    return _mixed(heads, residual_alpha, mask[:, None])


def _mixed(weights: Tensor, residual_alpha: float, mask: Tensor) -> Tensor:
    """Residual mixing of (..., B, [H,] n, n) weights with padding rows and columns removed."""
    if not mask.all():
        keep = mask[..., :, None] & mask[..., None, :]  # real query and real key
        return add_residual(weights * keep, residual_alpha) * keep
    return add_residual(weights, residual_alpha)


def _compiled_graph_layer(
    layer: Tensor,
    mask: Tensor,
    head_fusion: str,
    residual_alpha: float,
    out: Tensor,
    row_sums: np.ndarray,
    negative_sums: np.ndarray,
) -> None:
    """One layer of :func:`attention_graph` for CPU tensors without gradients, written into ``out`` (B, n, n).

    The same maths as the torch ops above, in one pass over the attentions; the statistics
    the checks need, each row's sum and the sum of its negative entries, go to ``row_sums``
    and ``negative_sums`` (B, H, n).
    """
    _graph_layer_kernel(
        layer.contiguous().numpy(),
        mask.numpy(),
        HEAD_FUSIONS.index(head_fusion),
        float(residual_alpha),
        out.numpy(),
        row_sums,
        negative_sums,
    )


# Attentions are far larger than anything else here (144 MiB for BERT-base at n=512), so the
# graph costs about as much as reading them once. Torch needs a pass each for the row sums, the
# negativity check and the head fusion, and more for residual mixing on the (L, B, n, n) result;
# this kernel reads the attentions once, in memory order, checking each row while folding it
# into the fused (n, n) map that stays in cache, then mixes in the residual. One thread already
# runs at memory speed, and a thread pool would compete with torch's.
@njit(cache=True, fastmath={"reassoc", "contract", "nsz", "arcp"})
def _graph_layer_kernel(layer, mask, fusion, alpha, out, row_sums, negative_sums):  # pragma: no cover
    batch, heads, n, _ = layer.shape
    zero = np.float32(0.0)
    for b in range(batch):
        for h in range(heads):
            for i in range(n):
                row = layer[b, h, i]
                fused = out[b, i]
                total = zero
                negative = zero
                if h == 0:
                    for j in range(n):
                        value = row[j]
                        total += value
                        negative += min(value, zero)
                        fused[j] = value
                elif fusion == 0:
                    for j in range(n):
                        value = row[j]
                        total += value
                        negative += min(value, zero)
                        fused[j] += value
                elif fusion == 1:
                    for j in range(n):
                        value = row[j]
                        total += value
                        negative += min(value, zero)
                        fused[j] = value if value > fused[j] else fused[j]
                else:
                    for j in range(n):
                        value = row[j]
                        total += value
                        negative += min(value, zero)
                        fused[j] = value if value < fused[j] else fused[j]
                row_sums[b, h, i] = total
                negative_sums[b, h, i] = negative
        scale = alpha / heads if fusion == 0 else alpha
        for i in range(n):
            fused = out[b, i]
            if not mask[b, i]:
                fused[:] = zero
                continue
            for j in range(n):
                fused[j] = fused[j] * scale if mask[b, j] else zero
            fused[i] += 1.0 - alpha
            total = fused.sum()
            if total > 0:
                fused /= total


def _renormalise_rows(matrix: Tensor) -> Tensor:
    sums = matrix.sum(-1, keepdim=True)
    return matrix / torch.where(sums > 0, sums, torch.ones_like(sums))
