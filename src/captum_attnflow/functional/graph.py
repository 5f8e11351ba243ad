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
from typing import Any, Callable, Iterable

import torch
from torch import Tensor
from tqdm.auto import tqdm

from captum_attnflow.functional.checks import Attentions, as_mask, attention_layers, check_residual_alpha
from captum_attnflow.functional.graph_layers import _fused_graph, _head_graphs
from captum_attnflow.functional.mixing import _mix_in_place, check_head_fusion

# A streamed layer is recomputed from queries and keys when asked for (about 0.3 s for BERT-base at
# n = 4096 on 2 cores): from about this many numbers (B n^2 per layer) in the layers walked, a walk
# takes seconds and shows a progress bar.
_PROGRESS_NUMBERS = 1e8


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
        self._stream_product: Callable[[int, Tensor, int], Any] | None = None
        self._order: Tensor | None = None
        self._back: Tensor | None = None
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
        order: Tensor | None = None,
        fused_product: Callable[[int, Tensor, int], Any] | None = None,
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
        the whole layer. ``fused_product(l, real, c)``, if given, gives that matrix :math:`W` as
        a function of ``c`` row vectors, ``product(u)`` = u W for u (B, c, n), with
        ``product.real_sums`` (B, n) its row sums over the columns ``real`` (B, n) marks, or None
        where the blocks serve better; :meth:`propagate` then never writes a block either.

        ``order`` (B, n): the three functions give their matrices in another token order, that of
        a run whose k-th token of example b was token ``order[b, k]`` (a left-padded batch run
        with its real tokens first); rows and columns are taken back to the graph's order here,
        and ``rows`` and ``propagate`` move their vectors instead of the matrix (O(n) a row).

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
        graph._stream_product = fused_product
        if order is not None:
            graph._order = order.to(device)
            graph._back = graph._order.argsort(dim=-1)  # the place in the run of each of the graph's tokens
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
        order = self._order
        fused = stream(index, out if order is None else None).float()
        if order is not None:  # entry [b, i, j] from the run's [b, place of i, place of j]
            back = self._back
            fused = fused.gather(1, back[:, :, None].expand_as(fused)).gather(2, back[:, None, :].expand_as(fused))
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
        order = self._order
        # The blocks are in the run's order: the rows go there and come back (columns permuted).
        mask = self.mask if order is None else self.mask.gather(1, order)
        in_run = rows if order is None else rows.gather(-1, order[:, None].expand_as(rows))
        layer_product = None if self._stream_product is None else self._stream_product(index, mask, rows.shape[1])
        if layer_product is not None:
            product = _mixed_product(layer_product, in_run, mask, self.residual_alpha)
        else:
            product = _blockwise_product(blocks(index), in_run, mask, self.residual_alpha)
        return product if order is None else product.gather(-1, self._back[:, None].expand_as(product))

    def rows(self, index: int, positions: Tensor) -> Tensor:
        """Rows ``positions`` (B, S) of :math:`A_l`, layer ``index`` (0-based): (B, S, n) float32.
        A streamed graph with ``fused_rows`` computes only those rows."""
        stream_rows = self._stream_rows
        if stream_rows is not None and self._weights is None:
            if self._order is None:
                fused = stream_rows(index, positions).float()
            else:  # the positions' rows in the run, their columns back in the graph's order
                back = self._back
                fused = stream_rows(index, back.gather(1, positions)).float()
                fused = fused.gather(2, back[:, None, :].expand_as(fused))
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


def _blockwise_product(
    blocks: Iterable[tuple[int, int, Tensor]], rows: Tensor, mask: Tensor, alpha: float
) -> Tensor:
    """``rows`` (B, c, n) times :math:`A` given as fused ``blocks`` of rows of :math:`W` (see
    :meth:`AttentionGraph.propagate`), ``mask`` (B, n) the real tokens in the blocks' order."""
    mask = mask.to(rows.dtype)
    product = torch.zeros_like(rows)
    scaled = torch.empty_like(rows)  # u
    for start, stop, block in blocks:  # block (B, R, w): W[start:stop, :w]
        width = block.shape[-1]
        sums = torch.bmm(block, mask[:, :width, None]).squeeze(-1).mul_(alpha).add_(1.0 - alpha)  # (B, R)
        sums = torch.where(sums > 0, sums, torch.ones_like(sums))
        scaled[..., start:stop] = rows[..., start:stop] * (mask[:, None, start:stop] / sums[:, None, :])
        product[..., :width].baddbmm_(scaled[..., start:stop], block)
    return product.mul_(alpha).add_(scaled, alpha=1.0 - alpha).mul_(mask[:, None, :])


def _mixed_product(layer_product: Any, rows: Tensor, mask: Tensor, alpha: float) -> Tensor:
    """``rows`` (B, c, n) times :math:`A` with :math:`W` given as a function of row vectors with
    its ``real_sums`` (see :meth:`AttentionGraph.streamed`); the mixing of :func:`_blockwise_product`."""
    mask = mask.to(rows.dtype)
    sums = layer_product.real_sums * alpha + (1.0 - alpha)  # s_i
    scaled = rows * (mask / torch.where(sums > 0, sums, torch.ones_like(sums)))[:, None, :]  # u
    return layer_product(scaled).mul_(alpha).add_(scaled, alpha=1.0 - alpha).mul_(mask[:, None, :])


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
