"""Cuts of the layered graph: upper bounds on a max flow that can end the search early (the trivial
cuts, a causal graph's threshold cuts) and the capacity of the cut the search ends on, which
certifies the value found."""

from __future__ import annotations

import numpy as np
from numba import njit

from .packed import _at


@njit(cache=True)
def _cut_capacity(cap, offsets, rows, cols, source, dist):
    """Capacity of the edges into the nodes that reach the sink (dist >= 0) from the others.

    Between two layers, the loop runs over the smaller of the two sides of the cut: when the
    cut lies near the source, few nodes are left outside it.
    """
    layers, m = offsets.shape
    total = 0.0
    for k in range(layers):
        if k + 1 == layers:
            # Only the source is in the graph at the top layer.
            for i in range(m):
                if dist[k, i] >= 0:
                    total += _at(cap, offsets, rows, k, source, i)
            continue
        inside = 0
        outside = 0
        for i in range(m):
            inside += dist[k, i] >= 0
            outside += dist[k + 1, i] < 0
        if inside <= outside:
            for i in range(m):
                if dist[k, i] >= 0:
                    for j in range(cols[k, i, 0], cols[k, i, 1]):
                        if dist[k + 1, j] < 0:
                            total += _at(cap, offsets, rows, k, j, i)
        else:
            for j in range(m):
                if dist[k + 1, j] < 0:
                    base = offsets[k, j] - rows[k, j, 0]
                    for i in range(rows[k, j, 0], rows[k, j, 1]):
                        if dist[k, i] >= 0:
                            total += cap[base + i]
    return total


@njit(cache=True)
def _trivial_bound(cap, offsets, rows, cols, source, sink):
    """min(out-capacity of (l, source), in-capacity of (0, sink)): both are cuts."""
    layers = offsets.shape[0]
    out_capacity = 0.0
    base = offsets[layers - 1, source] - rows[layers - 1, source, 0]
    for j in range(rows[layers - 1, source, 0], rows[layers - 1, source, 1]):
        out_capacity += cap[base + j]
    in_capacity = 0.0
    for i in range(cols[0, sink, 0], cols[0, sink, 1]):
        in_capacity += _at(cap, offsets, rows, 0, i, sink)
    return min(out_capacity, in_capacity)


@njit(cache=True)
def _causal_bounds(cap, offsets, rows, source, bounds, below, left, columns):
    """``bounds[t]``: the least capacity of the threshold cuts from (l, source) to every (0, t) of a causal graph.

    In a causal graph (edges (k, i) -> (k-1, j) only for j <= i) the nodes at positions below
    t never reach (0, t), and those above the source p are never reached, so a cut need only
    separate positions t..p. For a threshold :math:`t \\le \\tau \\le p + 1`, put the source
    and the nodes at positions :math:`\\ge \\tau` of layers 1..l-1 on the source's side; the
    edges crossing into positions t..tau-1 (and into (0, t)) then carry at most

    .. math::

        C(\\tau) = \\sum_{j=t}^{\\tau-1} A_l[p, j] + \\sum_{k=2}^{l-1} G_k(\\tau)
            + \\sum_{i=\\tau}^{p} A_1[i, t], \\quad
        G_k(\\tau) = \\sum_{i=\\tau}^{p} \\sum_{j=t}^{\\tau-1} A_k[i, j].

    :math:`\\tau = p + 1` is the source's out-capacity and :math:`\\tau = t` the sink's
    in-capacity, both over positions t..p; on causal attention the minimum over tau is usually
    the max flow itself, so that the first phase, stopped there, ends the search. Each step
    :math:`\\tau \\to \\tau + 1` updates :math:`G_k` by :math:`\\sum_{i=\\tau+1}^{p} A_k[i, \\tau]`
    (``below[k, tau]``, per source) minus :math:`\\sum_{j=t}^{\\tau-1} A_k[\\tau, j]`
    (``left[k, tau]``, per sink, grown by one column as t falls): O(l p^2) for all sinks.
    Sinks after the source get 0, exactly (no path reaches them). The columns that ``left``
    and the sink's in-capacity read are copied, a few at a time, into ``columns`` (l - 1, m, c)
    row by row: read down a packed column directly, every entry would be on a page of its own.
    """
    layers = offsets.shape[0]
    p = source
    bounds[:] = 0.0
    below[:] = 0.0
    left[:] = 0.0
    for k in range(1, layers - 1):
        # Row by row (the packed rows are contiguous); each below[k, tau] still adds its terms
        # in the order of i.
        for i in range(1, p + 1):
            base = offsets[k, i] - rows[k, i, 0]
            for tau in range(rows[k, i, 0], min(i, rows[k, i, 1])):
                below[k, tau] += cap[base + tau]
    cuts = np.zeros(layers)
    width = columns.shape[2]
    first = p + 1
    for t in range(p, -1, -1):
        if t < first:
            # columns[k, i, c] = A_{k+1}[i, first + c] for the next ``width`` columns down to t.
            first = max(0, t - width + 1)
            for k in range(layers - 1):
                for i in range(first, p + 1):
                    start, end = rows[k, i, 0], rows[k, i, 1]
                    base = offsets[k, i] - start
                    for c in range(t - first + 1):
                        j = first + c
                        columns[k, i, c] = cap[base + j] if start <= j < end else 0.0
        c = t - first
        for k in range(1, layers - 1):
            for tau in range(t + 1, p + 1):
                left[k, tau] += columns[k, tau, c]
        into_sink = 0.0
        for i in range(t, p + 1):
            into_sink += columns[0, i, c]
        best = into_sink
        from_source = 0.0
        cuts[:] = 0.0
        for tau in range(t, p + 1):
            from_source += _at(cap, offsets, rows, layers - 1, p, tau)
            into_sink -= columns[0, tau, c]
            total = from_source + into_sink
            for k in range(1, layers - 1):
                cuts[k] += below[k, tau] - left[k, tau]
                total += cuts[k]
            best = min(best, total)
        bounds[t] = max(best, 0.0)


@njit(cache=True)
def _threshold_cut(cap, offsets, rows, source, sink, cost, following, row_sums, into_sink):
    """The least capacity of a wider family of cuts of a causal graph than :func:`_causal_bounds`'s.

    Each layer k of 2..l-1 has its own threshold :math:`\\tau_k` (the source's side holds the
    positions :math:`\\ge \\tau_k`, :math:`\\tau_l = p`), and each layer-1 node, whose one edge
    to the sink is its only way out, takes the cheaper side: the cut costs

    .. math::

        \\sum_{k=3}^{l} F_k(\\tau_k, \\tau_{k-1})
            + \\sum_{i=t}^{p} \\min\\Big(A_1[i, t], \\sum_{h=\\tau_2}^{p} A_2[h, i]\\Big), \\quad
        F_k(a, b) = \\sum_{i=a}^{p} \\sum_{j=t}^{b-1} A_k[i, j],

    minimised layer by layer (dynamic programming, O(l w^2) for the w = p - t + 1 positions
    between sink and source). It finds the cuts near the sink that flow creeping towards it a
    few positions per layer meets. ``cost``, ``following``, ``row_sums`` and ``into_sink`` are
    scratch of size >= w + 1.
    """
    layers = offsets.shape[0]
    t, p = sink, source
    w = p - t + 1
    # cost[a]: the least cut of the layers above with threshold t + a at the current layer.
    cost[: w + 1] = np.inf
    cost[w - 1] = 0.0
    for k in range(layers - 1, 1, -1):
        following[: w + 1] = np.inf
        row_sums[: w + 1] = 0.0  # row_sums[b] = F_k(t + a, t + b) for the current a
        for a in range(w - 1, -1, -1):
            # prefix: the sum of A_k[t + a, j] over t <= j < t + b, for b = 1..w
            start, end = rows[k, t + a, 0], rows[k, t + a, 1]
            base = offsets[k, t + a] - start
            lo = min(max(start - t, 0), w)
            hi = max(min(end - t, w), lo)
            prefix = 0.0
            for b in range(1, lo + 1):
                row_sums[b] += prefix
            for b in range(lo + 1, hi + 1):
                prefix += cap[base + t + b - 1]
                row_sums[b] += prefix
            for b in range(hi + 1, w + 1):
                row_sums[b] += prefix
            if cost[a] < np.inf:
                for b in range(w + 1):
                    following[b] = min(following[b], cost[a] + row_sums[b])
        following[w] = min(following[w], cost[w])
        cost[: w + 1] = following[: w + 1]
    best = cost[w]
    row_sums[: w + 1] = 0.0  # row_sums[i] = sum of A_2[h, t + i] over h >= t + a
    for i in range(w):
        into_sink[i] = _at(cap, offsets, rows, 0, t + i, t)
    for a in range(w - 1, -1, -1):
        for i in range(a + 1):
            row_sums[i] += _at(cap, offsets, rows, 1, t + a, t + i)
        if cost[a] < np.inf:
            total = cost[a]
            for i in range(w):
                total += min(into_sink[i], row_sums[i])
            best = min(best, total)
    return max(best, 0.0)
