"""The layered graph as the kernel stores it: each row's nonzero span, packed.

Row ``i`` of layer ``k`` (the edges (k + 1, i) -> (k, j)) keeps only ``[lo, hi)``, the span of
its nonzero capacities, at ``values[offsets[k, i] : offsets[k, i] + hi - lo]``. A decoder's
(causal) attention keeps its lower triangle, a sliding window its band, an encoder's dense
attention every entry; the float32 capacities take ``4 E`` bytes for the ``E`` edges kept and
the per-thread float64 flows, in the same layout, ``8 E``. A column (the edges into one node)
is read through the same index arithmetic, ``offsets[k, j] + i - rows[k, j, 0]`` for each row
``j`` of ``cols[k, i]`` whose span holds ``i``: no transposed copy of the capacities or flows.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit


class PackedGraph(NamedTuple):
    """One example's layered graph, rows packed (see the module docstring).

    Attributes:
        values: (E,) float32 capacities, row after row, layer after layer.
        offsets: (l, m) int64, where each row starts in ``values``.
        rows: (l, m, 2) int64, ``[lo, hi)`` of each row's nonzeros (0, 0 if none).
        cols: (l, m, 2) int64, ``[lo, hi)`` of the rows whose span holds each column.
        causal: whether every edge (k, i) -> (k-1, j) has j <= i, over at least two layers
            (with one, the source's edge into the sink is the whole graph).
    """

    values: np.ndarray
    offsets: np.ndarray
    rows: np.ndarray
    cols: np.ndarray
    causal: bool

    @property
    def num_layers(self) -> int:
        """l, the layers of edges."""
        return self.offsets.shape[0]

    @property
    def num_positions(self) -> int:
        """m, the positions of each layer."""
        return self.offsets.shape[1]

    def first(self, count: int) -> "PackedGraph":
        """The graph of the first ``count`` layers: views, no copy (layers are stored in order)."""
        if count == self.num_layers:
            return self
        end = self.offsets[count, 0] if count < self.num_layers else self.values.shape[0]
        rows = self.rows[:count]
        return PackedGraph(self.values[:end], self.offsets[:count], rows, self.cols[:count], _is_causal(rows))

    def with_top(self, top: np.ndarray) -> "PackedGraph":
        """The first ``l - 1`` layers with ``top`` (m, m) as layer l (a copy)."""
        packer = GraphPacker(self.num_layers, self.num_positions)
        below = self.first(self.num_layers - 1)
        packer.values[: below.values.shape[0]] = below.values
        packer.offsets[: below.num_layers] = below.offsets
        packer.rows[: below.num_layers] = below.rows
        packer.cols[: below.num_layers] = below.cols
        packer.size, packer.count = below.values.shape[0], below.num_layers
        packer.add(top)
        return packer.graph()


class GraphPacker:
    """Packs a graph layer by layer (``add``), never holding more than the packed layers.

    The array of values is allocated for the largest graph expected (``triangle``: the lower
    triangle of every layer, else the full squares) but only the entries written take memory;
    a layer larger than expected grows it.
    """

    def __init__(self, layers: int, m: int, triangle: bool = False) -> None:
        per_layer = m * (m + 1) // 2 if triangle else m * m
        self.values = np.empty(max(1, layers * per_layer), np.float32)
        self.offsets = np.zeros((layers, m), np.int64)
        self.rows = np.zeros((layers, m, 2), np.int64)
        self.cols = np.zeros((layers, m, 2), np.int64)
        self.size = 0
        self.count = 0

    def add(self, layer: np.ndarray) -> None:
        """Append ``layer`` (m, m) float32, row i the edges out of position i."""
        k = self.count
        _spans(layer, self.rows[k])
        lengths = self.rows[k, :, 1] - self.rows[k, :, 0]
        self.offsets[k] = self.size + np.cumsum(lengths) - lengths
        end = self.size + int(lengths.sum())
        if end > self.values.shape[0]:
            grown = np.empty(max(end, 2 * self.values.shape[0]), np.float32)
            grown[: self.size] = self.values[: self.size]
            self.values = grown
        _pack_rows(layer, self.rows[k], self.offsets[k], self.values)
        _column_spans(self.rows[k], self.cols[k])
        self.size = end
        self.count += 1

    def graph(self) -> PackedGraph:
        """The packed graph of the layers added."""
        rows = self.rows[: self.count]
        return PackedGraph(self.values[: self.size], self.offsets[: self.count], rows, self.cols[: self.count], _is_causal(rows))


def pack(cap: np.ndarray) -> PackedGraph:
    """The packed graph of dense capacities (l, m, m), ``cap[k - 1, i, j]`` on edge (k, i) -> (k-1, j)."""
    cap = np.asarray(cap)
    layers, m, _ = cap.shape
    packer = GraphPacker(layers, m)
    for layer in cap:
        packer.add(np.ascontiguousarray(layer, dtype=np.float32))
    return packer.graph()


@njit(cache=True)
def _spans(layer, rows):
    """``rows[i] = [lo, hi)``, the span of the nonzeros of ``layer[i]`` (0, 0 if none)."""
    m = layer.shape[1]
    for i in range(layer.shape[0]):
        lo = 0
        while lo < m and layer[i, lo] == 0.0:
            lo += 1
        hi = m
        while hi > lo and layer[i, hi - 1] == 0.0:
            hi -= 1
        if lo == m:
            lo = hi = 0
        rows[i, 0] = lo
        rows[i, 1] = hi


@njit(cache=True)
def _pack_rows(layer, rows, offsets, values):
    """Copy each row's span of ``layer`` to ``values`` from its offset."""
    for i in range(layer.shape[0]):
        start = offsets[i]
        for j in range(rows[i, 0], rows[i, 1]):
            values[start + j - rows[i, 0]] = layer[i, j]


@njit(cache=True)
def _column_spans(rows, cols):
    """``cols[j] = [lo, hi)``: the first and one past the last row whose span holds column j."""
    m = rows.shape[0]
    cols[:, 0] = m
    cols[:, 1] = 0
    for i in range(m):
        for j in range(rows[i, 0], rows[i, 1]):
            if cols[j, 0] > i:
                cols[j, 0] = i
            cols[j, 1] = i + 1
    for j in range(m):
        if cols[j, 1] == 0:
            cols[j, 0] = 0


def _is_causal(rows: np.ndarray) -> bool:
    """Whether every row span (l, m, 2) ends at or before its own position, over at least two layers."""
    positions = np.arange(rows.shape[1])
    return rows.shape[0] >= 2 and bool((rows[..., 1] <= positions + 1).all())


@njit(cache=True, inline="always")
def _slot(offsets, rows, k, i, j):
    """Where edge (k + 1, i) -> (k, j) is stored, -1 if outside its row's span (capacity 0)."""
    if j < rows[k, i, 0] or j >= rows[k, i, 1]:
        return -1
    return offsets[k, i] + j - rows[k, i, 0]


@njit(cache=True, inline="always")
def _at(array, offsets, rows, k, i, j):
    """``array`` (capacities or flows) on edge (k + 1, i) -> (k, j); 0 outside the row's span."""
    slot = _slot(offsets, rows, k, i, j)
    return array[slot] if slot >= 0 else 0.0
