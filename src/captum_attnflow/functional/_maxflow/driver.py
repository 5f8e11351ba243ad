"""The max flow of one (source, sink) pair (bound, first phase, later phases, certificate) and
:func:`max_flows`, which builds the graph's arrays once and runs every pair on threads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np
from numba import njit

from .bookkeeping import BLOCK, EPS, NO_BLOCK, _clear, _flow_index, _remember
from .cuts import _causal_bounds, _cut_capacity, _threshold_cut, _trivial_bound
from .first_phase import _greedy_fill
from .later_phases import _blocking_flow, _levels_to_sink
from .packed import PackedGraph, _at, _slot, pack

# Starting a thread costs about 0.1 ms on an idle machine and over 1 ms on a loaded one, as
# much as a whole source of a small graph (L=6, n=32: about 1 ms). So a part runs on a thread
# of its own only with at least this much work, counted as (source, sink) pairs times graph
# edges: a few milliseconds of kernel time.
_WORK_PER_THREAD = 2_000_000
# Columns of the graph a causal bound copies at a time (:func:`.cuts._causal_bounds`).
_COLUMNS = 16
# Up to this many bytes of float64 flows per thread (4M edges: L = 6 at n = 800, L = 12 causal at
# n = 800) a thread's flows are one array in the graph's layout, read without the block lookup of
# pooled flows: 12-24 % less kernel time on such graphs. Larger graphs pool them in blocks.
_DENSE_FLOW_BYTES = 32 * 2**20
# Sources per kernel call when progress is reported: small enough for regular updates, large
# enough to keep every thread busy.
_SOURCES_PER_UPDATE = 8


@njit(cache=True)
def _max_flow(
    cap, offsets, rows, cols, source, sink, pool, blocks, used, dist, ptr, queue_k, queue_i, path_k, path_i, path_arc, touched,
    skip, room, got, sink_cap, sink_flow, cut_scratch, bound, causal,
):
    """Max flow from (l, source) to (0, sink), at most ``bound`` (a cut's capacity), and its certified gap.

    ``cap`` is packed (:mod:`.packed`); ``pool``, ``blocks`` and ``used`` hold the flows
    (:func:`~.bookkeeping._flow`). In a ``causal`` graph the positions below
    the sink are left out and, when the first phase ends below ``bound``, the threshold cuts of
    :func:`_threshold_cut` may prove it maximal before any search. The flows (no row) and
    ``sink_flow`` (zeros) are so on entry and on exit; ``dist``, ``ptr``, the queues and paths,
    ``skip``, ``room``, ``got``, ``sink_cap`` (m,) and ``cut_scratch`` (4, m + 1) are scratch.
    """
    m = offsets.shape[1]
    if bound <= EPS:
        return 0.0, bound
    # The sink's column, read once rather than strided at every visit of a layer-1 node.
    sink_cap[:] = 0.0
    for j in range(cols[0, sink, 0], cols[0, sink, 1]):
        sink_cap[j] = _at(cap, offsets, rows, 0, j, sink)
    # The DAG's first blocking flow; later phases start from it.
    first = sink if causal else 0
    value = _greedy_fill(
        cap, pool, blocks, used, offsets, rows, sink_cap, sink_flow, source, sink, skip, ptr, path_i, room, got, touched, bound, first
    )
    if causal and value < bound - EPS:
        bound = min(
            bound,
            _threshold_cut(
                cap, offsets, rows, source, sink, cut_scratch[0], cut_scratch[1], cut_scratch[2], cut_scratch[3]
            ),
        )
    if value < bound - EPS:
        # Later phases need the sink's flows in ``flow``.
        for i in range(m):
            if sink_flow[i] != 0.0:
                slot = _slot(offsets, rows, 0, i, sink)
                index = _flow_index(blocks, used, slot)
                _remember(touched, slot)
                pool[index] = sink_flow[i]
    path_k[0] = offsets.shape[0]
    path_i[0] = source
    gap = bound - value
    while value < bound - EPS:
        if not _levels_to_sink(cap, pool, blocks, used, offsets, rows, cols, source, sink, dist, queue_k, queue_i, skip):
            gap = _cut_capacity(cap, offsets, rows, cols, source, dist) - value
            break
        value += _blocking_flow(
            cap, pool, blocks, used, offsets, rows, cols, sink, dist, ptr, path_k, path_i, path_arc, touched, bound - value
        )
        gap = bound - value
    _clear(pool, blocks, used, touched)
    sink_flow[:] = 0.0
    return value, gap


@njit(cache=True, nogil=True)
def _max_flows_part(cap, offsets, rows, cols, causal, sources, part, parts, values, gaps, pool, blocks):
    """Fill ``values``/``gaps`` for the (source, sink) tasks ``part, part + parts, ...``; ``pool``
    (zeros, as long as ``cap``) and ``blocks`` (None: the flows in the graph's layout; else
    ``NO_BLOCK`` for every block of ``BLOCK`` edges) hold this part's flows (:func:`~.bookkeeping._flow`)."""
    layers, m = offsets.shape
    nodes = (layers + 1) * m
    used = np.zeros(1, np.int64)
    touched = np.zeros(16 * layers * m + 1, np.int64)
    dist = np.empty((layers + 1, m), np.int64)
    ptr = np.empty((layers + 1, m), np.int64)
    queue_k = np.empty(nodes, np.int64)
    queue_i = np.empty(nodes, np.int64)
    path_k = np.empty(nodes + 1, np.int64)
    path_i = np.empty(nodes + 1, np.int64)
    path_arc = np.empty(nodes + 1, np.int64)
    skip = np.empty((layers + 1, m + 1), np.int64)
    room = np.empty(layers + 1)
    got = np.empty(layers + 1)
    sink_cap = np.empty(m)
    sink_flow = np.zeros(m)
    cut_scratch = np.empty((4, m + 1))
    bounds = np.zeros(m)
    below = np.zeros((layers, m))
    left = np.zeros((layers, m))
    columns = np.empty((layers - 1, m, _COLUMNS))
    current = -1
    # Interleaved tasks balance the parts: neighbouring sinks cost about the same.
    for task in range(part, sources.shape[0] * m, parts):
        a = task // m
        t = task % m
        if causal:
            if a != current:  # tasks run source by source: one sweep of the bounds per source
                _causal_bounds(cap, offsets, rows, sources[a], bounds, below, left, columns)
                current = a
            bound = bounds[t]
        else:
            bound = _trivial_bound(cap, offsets, rows, cols, sources[a], t)
        values[a, t], gaps[a, t] = _max_flow(
            cap, offsets, rows, cols, sources[a], t, pool, blocks, used, dist, ptr, queue_k, queue_i, path_k, path_i, path_arc,
            touched, skip, room, got, sink_cap, sink_flow, cut_scratch, bound, causal,
        )


def max_flows(
    graph: PackedGraph | np.ndarray,
    sources: np.ndarray,
    num_threads: int = 1,
    progress: Callable[[int], object] | None = None,
    pooled: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Max-flow values from every (l, s), s in ``sources``, to every input node (0, t).

    The (source, sink) pairs are split over up to ``num_threads`` threads (the calling one and
    new Python threads) running the compiled kernel without the GIL; fewer when the work is
    too small to pay for starting them. Threads rather than numba's ``prange``: with the OpenMP
    threading layer every parallel launch costs about 16 ms on a loaded machine, more than a
    whole one-source computation, and plain threads never clash with torch's own OpenMP pool.
    Each thread stores its float64 flows in an array of the graph's size, allocated as zeros
    that take memory only where written, at most 8 bytes per edge: on a graph whose flows
    take at most ``_DENSE_FLOW_BYTES`` in the graph's own layout; on a larger one as a pool
    into which the blocks that carry flow in one (source, sink) pair are packed from its
    start, so that it takes the most any one pair needs.

    Args:
        graph: the packed graph (:func:`.packed.pack`, :class:`.packed.GraphPacker`), or dense
            capacities (l, m, m), ``cap[k - 1, i, j]`` on edge (k, i) -> (k-1, j), packed here;
            capacities are stored as float32, so float32 values are taken exactly.
        sources: (S,) positions at layer l.
        num_threads: the most threads to use.
        progress: called with the number of sources done, after every few sources (for a
            progress bar); None runs all sources at once.
        pooled: pool the flows in blocks (True) or keep them in the graph's layout (False);
            None (default): pooled when they would take more than ``_DENSE_FLOW_BYTES``. The
            values are the same bits either way.

    Returns:
        values (S, m) and gaps (S, m), float64: ``values[a, t]`` is within ``gaps[a, t]``
        below the exact maximum flow from (l, sources[a]) to (0, t).
    """
    if not isinstance(graph, PackedGraph):
        graph = pack(graph)
    sources = np.ascontiguousarray(sources, dtype=np.int64)
    values = np.zeros((sources.shape[0], graph.num_positions))
    gaps = np.zeros_like(values)
    step = max(1, sources.shape[0] if progress is None else _SOURCES_PER_UPDATE)
    pairs = min(step, sources.shape[0]) * graph.num_positions
    parts = max(1, min(num_threads, pairs * graph.values.shape[0] // _WORK_PER_THREAD))
    # Zeros from numpy (calloc): pages no flow is written to are never mapped.
    size = -(-graph.values.shape[0] // BLOCK) * BLOCK
    flows = [np.zeros(size) for _ in range(parts)]
    pooled = 8 * size > _DENSE_FLOW_BYTES if pooled is None else pooled
    blocks = [np.full(size // BLOCK, NO_BLOCK, np.int64) if pooled else None for _ in range(parts)]
    for start in range(0, sources.shape[0], step):
        chunk = slice(start, start + step)
        _run_parts(graph, flows, blocks, sources[chunk], values[chunk], gaps[chunk])
        if progress is not None:
            progress(sources[chunk].shape[0])
    return values, gaps


def _run_parts(
    graph: PackedGraph, flows: list, blocks: list, sources: np.ndarray, values: np.ndarray, gaps: np.ndarray
) -> None:
    """Fill ``values`` and ``gaps`` (S, m) for ``sources``, one part per array of ``flows`` (with
    its ``blocks``), each on a thread."""
    arrays = (graph.values, graph.offsets, graph.rows, graph.cols, graph.causal)
    parts = len(flows)
    if parts == 1:
        _max_flows_part(*arrays, sources, 0, 1, values, gaps, flows[0], blocks[0])
        return
    with ThreadPoolExecutor(parts - 1) as pool:
        others = [
            pool.submit(_max_flows_part, *arrays, sources, part, parts, values, gaps, flows[part], blocks[part])
            for part in range(1, parts)
        ]
        # The calling thread runs part 0 itself rather than wait: one thread fewer to start.
        _max_flows_part(*arrays, sources, 0, parts, values, gaps, flows[0], blocks[0])
        for done in others:
            done.result()
