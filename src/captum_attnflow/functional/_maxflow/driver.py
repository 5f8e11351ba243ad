"""The max flow of one (source, sink) pair (bound, first phase, later phases, certificate) and
:func:`max_flows`, which builds the graph's arrays once and runs every pair on threads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np
from numba import njit

from .bookkeeping import EPS, _clear, _entry, _remember
from .cuts import _causal_bounds, _cut_capacity, _threshold_cut, _trivial_bound
from .first_phase import _greedy_fill
from .later_phases import _blocking_flow, _levels_to_sink

# Starting a thread costs about 0.1 ms on an idle machine and over 1 ms on a loaded one, as
# much as a whole source of a small graph (L=6, n=32: about 1 ms). So a part runs on a thread
# of its own only with at least this much work, counted as (source, sink) pairs times graph
# edges: a few milliseconds of kernel time.
_WORK_PER_THREAD = 2_000_000
# Sources per kernel call when progress is reported: small enough for regular updates, large
# enough to keep every thread busy.
_SOURCES_PER_UPDATE = 8


@njit(cache=True)
def _max_flow(
    cap, cap_t, rows, cols, source, sink, flow, flow_t, dist, ptr, queue_k, queue_i, path_k, path_i, path_arc, touched,
    skip, room, got, sink_flow, cut_scratch, bound, causal,
):
    """Max flow from (l, source) to (0, sink), at most ``bound`` (a cut's capacity), and its certified gap.

    ``cap_t`` is ``cap`` transposed per layer. In a ``causal`` graph the positions below the
    sink are left out and, when the first phase ends below ``bound``, the threshold cuts of
    :func:`_threshold_cut` may prove it maximal before any search. ``flow``, ``flow_t`` (its
    transpose) and ``sink_flow`` must be zero on entry and are zero on exit; ``dist``, ``ptr``,
    the queues and paths, ``skip``, ``room``, ``got`` and ``cut_scratch`` (3, m + 1) are scratch.
    """
    layers, m, _ = cap.shape
    if bound <= EPS:
        return 0.0, bound
    # The DAG's first blocking flow; later phases start from it.
    first = sink if causal else 0
    value = _greedy_fill(
        cap, cap_t, flow, sink_flow, rows, source, sink, skip, ptr, path_i, room, got, touched, bound, first
    )
    if causal and value < bound - EPS:
        bound = min(bound, _threshold_cut(cap, cap_t, source, sink, cut_scratch[0], cut_scratch[1], cut_scratch[2]))
    if value < bound - EPS:
        # Later phases need the transposed flows and the sink's flows in ``flow``.
        if touched[0] >= touched.shape[0] - 1:
            # The list overflowed: some entries are missing from it.
            for k in range(layers):
                flow_t[k] = flow[k].T
        else:
            for n in range(1, touched[0] + 1):
                k, i, j = _entry(touched[n], m)
                flow_t[k, j, i] = flow[k, i, j]
        for i in range(m):
            if sink_flow[i] != 0.0:
                _remember(touched, i * m + sink)
                flow[0, i, sink] = sink_flow[i]
                flow_t[0, sink, i] = sink_flow[i]
    path_k[0] = layers
    path_i[0] = source
    gap = bound - value
    while value < bound - EPS:
        if not _levels_to_sink(cap_t, flow, flow_t, rows, cols, source, sink, dist, queue_k, queue_i, skip):
            gap = _cut_capacity(cap, cap_t, source, dist) - value
            break
        value += _blocking_flow(
            cap, flow, flow_t, rows, cols, sink, dist, ptr, path_k, path_i, path_arc, touched, bound - value
        )
        gap = bound - value
    _clear(flow, flow_t, touched)
    sink_flow[:] = 0.0
    return value, gap


@njit(cache=True, nogil=True)
def _max_flows_part(cap, cap_t, rows, cols, causal, sources, part, parts, values, gaps):
    """Fill ``values``/``gaps`` for the (source, sink) tasks ``part, part + parts, ...``."""
    layers, m, _ = cap.shape
    nodes = (layers + 1) * m
    flow = np.zeros(cap.shape)
    flow_t = np.zeros(cap.shape)
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
    sink_flow = np.zeros(m)
    cut_scratch = np.empty((3, m + 1))
    bounds = np.zeros(m)
    below = np.zeros((layers, m))
    left = np.zeros((layers, m))
    current = -1
    # Interleaved tasks balance the parts: neighbouring sinks cost about the same.
    for task in range(part, sources.shape[0] * m, parts):
        a = task // m
        t = task % m
        if causal:
            if a != current:  # tasks run source by source: one sweep of the bounds per source
                _causal_bounds(cap, cap_t, sources[a], bounds, below, left)
                current = a
            bound = bounds[t]
        else:
            bound = _trivial_bound(cap, cap_t, sources[a], t)
        values[a, t], gaps[a, t] = _max_flow(
            cap, cap_t, rows, cols, sources[a], t, flow, flow_t, dist, ptr, queue_k, queue_i, path_k, path_i, path_arc,
            touched, skip, room, got, sink_flow, cut_scratch, bound, causal,
        )


def max_flows(
    cap: np.ndarray, sources: np.ndarray, num_threads: int = 1, progress: Callable[[int], object] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Max-flow values from every (l, s), s in ``sources``, to every input node (0, t).

    The graph's arrays (transpose, nonzero spans, causality) are built once for all sources.
    The (source, sink) pairs are split over up to ``num_threads`` threads (the calling one and
    new Python threads) running the compiled kernel without the GIL; fewer when the work is
    too small to pay for starting them. Threads rather than numba's ``prange``: with the OpenMP
    threading layer every parallel launch costs about 16 ms on a loaded machine, more than a
    whole one-source computation, and plain threads never clash with torch's own OpenMP pool.

    Args:
        cap: (l, m, m), ``cap[k - 1, i, j]`` the capacity of edge (k, i) -> (k-1, j); stored
            as float32, so float32 values are taken exactly.
        sources: (S,) positions at layer l.
        num_threads: the most threads to use.
        progress: called with the number of sources done, after every few sources (for a
            progress bar); None runs all sources at once.

    Returns:
        values (S, m) and gaps (S, m), float64: ``values[a, t]`` is within ``gaps[a, t]``
        below the exact maximum flow from (l, sources[a]) to (0, t).
    """
    cap = np.ascontiguousarray(cap, dtype=np.float32)
    cap_t = np.ascontiguousarray(cap.transpose(0, 2, 1))
    rows = _nonzero_spans(cap)
    graph = (cap, cap_t, rows, _nonzero_spans(cap_t), _is_causal(rows))
    sources = np.ascontiguousarray(sources, dtype=np.int64)
    values = np.zeros((sources.shape[0], cap.shape[1]))
    gaps = np.zeros_like(values)
    step = max(1, sources.shape[0] if progress is None else _SOURCES_PER_UPDATE)
    for start in range(0, sources.shape[0], step):
        chunk = slice(start, start + step)
        _run_parts(graph, sources[chunk], num_threads, values[chunk], gaps[chunk])
        if progress is not None:
            progress(sources[chunk].shape[0])
    return values, gaps


def _run_parts(graph: tuple, sources: np.ndarray, num_threads: int, values: np.ndarray, gaps: np.ndarray) -> None:
    """Fill ``values`` and ``gaps`` (S, m) for ``sources`` on up to ``num_threads`` threads."""
    parts = max(1, min(num_threads, values.size * graph[0].size // _WORK_PER_THREAD))
    if parts == 1:
        _max_flows_part(*graph, sources, 0, 1, values, gaps)
        return
    with ThreadPoolExecutor(parts - 1) as pool:
        others = [pool.submit(_max_flows_part, *graph, sources, part, parts, values, gaps) for part in range(1, parts)]
        # The calling thread runs part 0 itself rather than wait: one thread fewer to start.
        _max_flows_part(*graph, sources, 0, parts, values, gaps)
        for done in others:
            done.result()


def _nonzero_spans(cap: np.ndarray) -> np.ndarray:
    """(l, m, 2) int64: ``[lo, hi)`` holds every nonzero of each row ``cap[k, i]`` (0, 0 if none).

    Causal and local attention have long runs of zeros; the scans of a row stay inside its span.
    """
    nonzero = cap > 0
    m = cap.shape[-1]
    lo = nonzero.argmax(-1)
    hi = m - nonzero[..., ::-1].argmax(-1)
    empty = ~nonzero.any(-1)
    lo[empty] = 0
    hi[empty] = 0
    return np.ascontiguousarray(np.stack([lo, hi], -1), dtype=np.int64)


def _is_causal(rows: np.ndarray) -> bool:
    """Whether every edge (k, i) -> (k-1, j) of the (l, m, 2) row spans has j <= i, over at least two layers
    (with one, the source's edge into the sink is the whole graph)."""
    positions = np.arange(rows.shape[1])
    return rows.shape[0] >= 2 and bool((rows[..., 1] <= positions + 1).all())
