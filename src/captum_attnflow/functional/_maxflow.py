"""Compiled maximum flow on the layered attention graph (the kernel behind :func:`flow`).

Hand-written rather than scipy's or networkx's max-flow because those take a general sparse
graph: one call per (source, sink) pair rebuilds it and pays Python overhead, about 0.9 s for
one source of a 12-layer, 128-token graph with scipy. Here the graph stays as dense per-layer
arrays, the trivial cuts stop a search as soon as they are reached, and threads run the
(source, sink) pairs in parallel.

The algorithm is Dinic's: breadth-first levels in the residual graph, then blocking flows along
level-increasing paths. Its first phase needs no search: without flow the residual graph is
the DAG itself, and :func:`_greedy_fill` computes its blocking flow as a depth-first pass in
which every node sends what it can to its children in turn and returns the total to its
parent (no path is walked twice), layer-1 nodes are filled straight into the sink, and nodes
that can send nothing more leave their layer's skip list (:func:`_next_alive`), so that no
later scan looks at them; scans of a row stay inside its nonzero span (causal and local
attention). On a pretrained encoder's attention (MiniLM) this first phase alone reaches a trivial
bound for about 99 % of the pairs and ends the search; later phases reroute flow through
residual (upward) edges, which is what the trivial bounds cannot capture (causal attention
with a sink needs them for most pairs).

A causal graph (a decoder's attention: edges only to the same or earlier positions) gets
tighter cuts than the trivial ones: only positions between the sink and the source matter,
and the least of the cuts that put the positions above a threshold on the source's side
(:func:`_causal_bounds`, all sinks of a source in O(l n^2)) is, on a language model's
attention, usually the max flow itself. The first phase is given that bound as its budget and
skips the positions before the sink, so reaching it settles the pair without a breadth-first
search or a cut; where it stops below, a wider family of cuts (:func:`_threshold_cut`, one
threshold per layer and a free side for every layer-1 node) often still proves it maximal.

Capacities are stored in float32 (the attention graph's own precision, so nothing is rounded),
flows and sums in float64. A residual capacity counts as positive only above ``EPS``. When the
search stops, either the flow equals one of these bounds (the source's out-capacity, the
sink's in-capacity or a causal graph's threshold cuts, all cuts), or the nodes reachable from
the source through residual capacity above ``EPS`` form a cut whose capacity exceeds the flow found by at most ``EPS`` per crossing
edge. Either way ``0 <= max_flow - value <= gap <= EPS * (number of edges)``, and the kernel
returns that ``gap`` (cut capacity minus flow, measured) with every value as a certificate.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np
from numba import njit

# Residual capacities at or below this count as saturated. Far above float64 rounding of
# values <= 1 (~1e-16 per operation), far below the 1e-6 accuracy anyone reads flows at.
EPS = 1e-12
# Starting a thread costs about 0.1 ms on an idle machine and over 1 ms on a loaded one, as
# much as a whole source of a small graph (L=6, n=32: about 1 ms). So a part runs on a thread
# of its own only with at least this much work, counted as (source, sink) pairs times graph
# edges: a few milliseconds of kernel time.
_WORK_PER_THREAD = 2_000_000
# Sources per kernel call when progress is reported: small enough for regular updates, large
# enough to keep every thread busy.
_SOURCES_PER_UPDATE = 8


@njit(cache=True)
def _next_alive(skip, k, j):
    """The first node (k, j') with j' >= j still in the level graph, ``m`` if none.

    ``skip[k]`` is a union-find over positions: ``skip[k, j] == j`` while (k, j) is in the
    graph, ``j + 1`` once it left. Path compression makes a scan past a run of removed nodes
    cost about one step, so a node's children are scanned in time proportional to the live
    ones rather than to n.
    """
    root = j
    while skip[k, root] != root:
        root = skip[k, root]
    while skip[k, j] != root:
        following = skip[k, j]
        skip[k, j] = root
        j = following
    return root


@njit(cache=True)
def _levels_to_sink(cap_t, flow, flow_t, rows, cols, source, sink, dist, queue_k, queue_i, unseen):
    """Residual BFS towards (0, sink): ``dist`` = residual distance to the sink, -1 if none.

    Searching backwards from the sink rather than forwards from the source pays off at the
    end: when no augmenting path is left, the nodes that still reach the sink are usually a
    small region near it, and that region is also the minimum cut. Returns whether the source
    reaches the sink; stops as soon as it does. ``unseen`` holds skip lists of the nodes not
    reached yet (see :func:`_next_alive`): a node scans only those for new neighbours, so
    once a layer is mostly reached its scans are short.
    """
    layers, m, _ = cap_t.shape
    for k in range(layers + 1):
        for j in range(m + 1):
            unseen[k, j] = j
    dist[:] = -1
    dist[0, sink] = 0
    queue_k[0] = 0
    queue_i[0] = sink
    head = 0
    tail = 1
    while head < tail:
        k = queue_k[head]
        i = queue_i[head]
        head += 1
        level = dist[k, i] + 1
        if k + 1 == layers:
            if cap_t[k, i, source] - flow_t[k, i, source] > EPS:
                dist[layers, source] = level
                return True
        elif k + 1 < layers:
            j = _next_alive(unseen, k + 1, cols[k, i, 0])
            while j < cols[k, i, 1]:
                if cap_t[k, i, j] - flow_t[k, i, j] > EPS:
                    dist[k + 1, j] = level
                    unseen[k + 1, j] = j + 1
                    queue_k[tail] = k + 1
                    queue_i[tail] = j
                    tail += 1
                j = _next_alive(unseen, k + 1, j + 1)
        if k >= 2:
            # Residual arc (k-1, j) -> (k, i): cancelling flow sent down (k, i) -> (k-1, j).
            j = _next_alive(unseen, k - 1, rows[k - 1, i, 0])
            while j < rows[k - 1, i, 1]:
                if flow[k - 1, i, j] > EPS:
                    dist[k - 1, j] = level
                    unseen[k - 1, j] = j + 1
                    queue_k[tail] = k - 1
                    queue_i[tail] = j
                    tail += 1
                j = _next_alive(unseen, k - 1, j + 1)
    return False


@njit(cache=True)
def _residual(cap, flow, flow_t, k, i, arc, m):
    """Residual capacity of arc ``arc`` of node (k, i): arcs < m go down to (k-1, arc), others up."""
    if arc < m:
        return cap[k - 1, i, arc] - flow[k - 1, i, arc]
    return flow_t[k, i, arc - m]


@njit(cache=True)
def _blocking_flow(cap, flow, flow_t, rows, cols, sink, dist, ptr, path_k, path_i, path_arc, touched, budget):
    """Augment along residual paths on which ``dist`` drops by one per arc, until none is left.

    The path starts at ``path_k[0], path_i[0]`` (the source) and ends at the node of distance
    0 (the sink); at most ``budget`` is pushed. Arcs ``< m`` of a node go down, the others up.
    Returns the flow pushed; flow entries it makes nonzero are appended to ``touched``.
    """
    layers, m, _ = cap.shape
    num_arcs = 2 * m
    ptr[:] = 0
    pushed = 0.0
    depth = 0
    num_touched = touched[0]
    while pushed < budget - EPS:
        k = path_k[depth]
        i = path_i[depth]
        if k == 0:
            delta = budget - pushed
            for d in range(depth):
                res = _residual(cap, flow, flow_t, path_k[d], path_i[d], path_arc[d], m)
                if res < delta:
                    delta = res
            first_saturated = depth
            for d in range(depth):
                kd = path_k[d]
                idx = path_i[d]
                arc = path_arc[d]
                if arc < m:
                    if flow[kd - 1, idx, arc] == 0.0 and num_touched < touched.shape[0] - 1:
                        num_touched += 1
                        touched[num_touched] = ((kd - 1) * m + idx) * m + arc
                    flow[kd - 1, idx, arc] += delta
                    flow_t[kd - 1, arc, idx] = flow[kd - 1, idx, arc]
                else:
                    flow_t[kd, idx, arc - m] -= delta
                    flow[kd, arc - m, idx] = flow_t[kd, idx, arc - m]
                if first_saturated == depth and _residual(cap, flow, flow_t, kd, idx, arc, m) <= EPS:
                    first_saturated = d
            pushed += delta
            depth = first_saturated
            continue
        target = dist[k, i] - 1
        arc = ptr[k, i]
        if arc < m and k >= 2:
            # Downward arcs (k, i) -> (k-1, j): one tight scan along contiguous rows.
            arc = max(arc, rows[k - 1, i, 0])
            end = rows[k - 1, i, 1]
            while arc < end and not (dist[k - 1, arc] == target and cap[k - 1, i, arc] - flow[k - 1, i, arc] > EPS):
                arc += 1
            if arc >= end:
                arc = m
        elif arc < m:
            # Layer 1: the sink is the only input node in the graph, its arc the only downward one.
            admissible = arc <= sink and dist[0, sink] == target and cap[0, i, sink] - flow[0, i, sink] > EPS
            arc = sink if admissible else m
        if arc >= m:
            end = num_arcs if k == layers else m + cols[k, i, 1]
            arc = num_arcs if k == layers else max(arc, m + cols[k, i, 0])
            # Upward arcs (k, i) -> (k+1, j): cancelling flow sent down (k+1, j) -> (k, i).
            while arc < end and not (dist[k + 1, arc - m] == target and flow_t[k, i, arc - m] > EPS):
                arc += 1
            if arc >= end:
                arc = num_arcs
        ptr[k, i] = arc
        if arc < num_arcs:
            path_arc[depth] = arc
            depth += 1
            if arc < m:
                path_k[depth] = k - 1
                path_i[depth] = arc
            else:
                path_k[depth] = k + 1
                path_i[depth] = arc - m
            continue
        # A dead end: no admissible arc left, the node leaves the level graph.
        dist[k, i] = -1
        if depth == 0:
            break
        depth -= 1
        ptr[path_k[depth], path_i[depth]] += 1
    touched[0] = num_touched
    return pushed


@njit(cache=True)
def _into_sink(cap, cap_t, flow, sink_flow, skip, touched, i, j, sink, limit):
    """Push up to ``limit`` along (2, i) -> (1, j) -> (0, sink); returns how much went.

    (1, j) leaves the level graph (``skip``) once its edge into the sink is full.
    """
    into_sink = cap_t[0, sink, j] - sink_flow[j]
    if into_sink <= EPS:
        skip[1, j] = j + 1
        return 0.0
    edge = cap[1, i, j] - flow[1, i, j]
    if edge <= EPS:
        return 0.0
    delta = min(edge, into_sink, limit)
    if flow[1, i, j] == 0.0:
        _remember(touched, (cap.shape[1] + i) * cap.shape[2] + j)
    flow[1, i, j] += delta
    sink_flow[j] += delta
    if into_sink - delta <= EPS:
        skip[1, j] = j + 1
    return delta


@njit(cache=True)
def _greedy_fill(cap, cap_t, flow, sink_flow, rows, source, sink, skip, ptr, path_i, room, got, touched, budget, first):
    """Dinic's first phase: a blocking flow of the DAG itself, from (l, source) to (0, sink).

    A depth-first pass: the node at ``depth`` (layer l - depth, position ``path_i[depth]``)
    may send ``room[depth]`` (the least residual capacity on its path, and what the budget
    leaves) and has sent ``got[depth]``; it offers the rest to its children in turn, then
    returns the total to its parent, whose edge to it carries that much more. A node that
    could not use its room can send nothing more and leaves the graph. Layer-2 nodes push
    into the sink through every live layer-1 node in one loop. Every node tries the node right
    below it first: with the residual term of the attention graph that edge is usually the
    widest, and flow sent along it spreads over fewer edges, so fewer nodes are visited. Nodes
    at positions below ``first`` (known not to reach the sink) are never entered, and the pass
    stops once ``budget`` (a cut's capacity, when known the least) has gone. Flows into the sink go to
    ``sink_flow`` (by layer-1 position), the others to ``flow`` (not to its transpose), and
    entries made nonzero are appended to ``touched``. Returns the flow value.
    """
    layers, m, _ = cap.shape
    for k in range(layers + 1):
        for j in range(m + 1):
            # Positions below ``first`` never reach the sink: out of the graph from the start.
            skip[k, j] = j if j >= first or k == 0 else first
    ptr[:] = 0
    path_i[0] = source
    room[0] = budget
    got[0] = 0.0
    depth = 0
    while True:
        k = layers - depth
        i = path_i[depth]
        if k == 1:
            # The source itself at layer 1 (l = 1): its one edge into the sink.
            got[0] = min(room[0], cap_t[0, sink, i])
            sink_flow[i] = got[0]
            break
        descend = False
        if k == 2:
            # Layer 2: fill the sink through every live layer-1 node at once, the one below first.
            if skip[1, i] == i:
                left = room[depth] - got[depth]
                got[depth] += _into_sink(cap, cap_t, flow, sink_flow, skip, touched, i, i, sink, left)
            arc = _next_alive(skip, 1, max(ptr[2, i], rows[1, i, 0]))
            while arc < rows[1, i, 1] and got[depth] < room[depth] - EPS:
                left = room[depth] - got[depth]
                got[depth] += _into_sink(cap, cap_t, flow, sink_flow, skip, touched, i, arc, sink, left)
                if got[depth] >= room[depth] - EPS:
                    break
                arc = _next_alive(skip, 1, arc + 1)
            ptr[2, i] = arc
        elif got[depth] < room[depth] - EPS:
            end = rows[k - 1, i, 1]
            # The node right below first, then the others in order from where the scan stopped.
            if skip[k - 1, i] == i and cap[k - 1, i, i] - flow[k - 1, i, i] > EPS:
                arc = i
            else:
                arc = _next_alive(skip, k - 1, max(ptr[k, i], rows[k - 1, i, 0]))
                while arc < end and cap[k - 1, i, arc] - flow[k - 1, i, arc] <= EPS:
                    arc = _next_alive(skip, k - 1, arc + 1)
                ptr[k, i] = arc
            if arc < end:
                path_i[depth + 1] = arc
                room[depth + 1] = min(cap[k - 1, i, arc] - flow[k - 1, i, arc], room[depth] - got[depth])
                got[depth + 1] = 0.0
                depth += 1
                descend = True
        if descend:
            continue
        # Return to the parent with what this node sent.
        if got[depth] < room[depth] - EPS:
            skip[k, i] = i + 1
        if depth == 0:
            break
        sent = got[depth]
        depth -= 1
        parent = path_i[depth]
        if sent > 0.0:
            if flow[k, parent, i] == 0.0:
                _remember(touched, (k * m + parent) * m + i)
            flow[k, parent, i] += sent
            got[depth] += sent
    return got[0]


@njit(cache=True)
def _cut_capacity(cap, cap_t, source, dist):
    """Capacity of the edges into the nodes that reach the sink (dist >= 0) from the others.

    Between two layers, the loop runs over the smaller of the two sides of the cut: when the
    cut lies near the source, few nodes are left outside it.
    """
    layers, m, _ = cap.shape
    total = 0.0
    for k in range(layers):
        if k + 1 == layers:
            # Only the source is in the graph at the top layer.
            for i in range(m):
                if dist[k, i] >= 0:
                    total += cap[k, source, i]
            continue
        inside = 0
        outside = 0
        for i in range(m):
            inside += dist[k, i] >= 0
            outside += dist[k + 1, i] < 0
        if inside <= outside:
            for i in range(m):
                if dist[k, i] >= 0:
                    for j in range(m):
                        if dist[k + 1, j] < 0:
                            total += cap_t[k, i, j]
        else:
            for j in range(m):
                if dist[k + 1, j] < 0:
                    for i in range(m):
                        if dist[k, i] >= 0:
                            total += cap[k, j, i]
    return total


@njit(cache=True, inline="always")
def _remember(touched, index):
    """Append the flat index ``(k * m + i) * m + j`` of a flow entry made nonzero to ``touched``
    (``touched[0]`` counts them); a full list stops growing and counts as overflowed."""
    if touched[0] < touched.shape[0] - 1:
        touched[0] += 1
        touched[touched[0]] = index


@njit(cache=True, inline="always")
def _entry(index, m):
    """(k, i, j) of the flat index of a (layers, m, m) flow entry."""
    return index // (m * m), (index // m) % m, index % m


@njit(cache=True)
def _clear(flow, flow_t, touched):
    """Zero the entries of ``flow`` listed in ``touched`` (all of it if the list overflowed)."""
    layers, m, _ = flow.shape
    if touched[0] >= touched.shape[0] - 1:
        flow[:] = 0.0
        flow_t[:] = 0.0
    else:
        for n in range(1, touched[0] + 1):
            k, i, j = _entry(touched[n], m)
            flow[k, i, j] = 0.0
            flow_t[k, j, i] = 0.0
    touched[0] = 0


@njit(cache=True)
def _trivial_bound(cap, cap_t, source, sink):
    """min(out-capacity of (l, source), in-capacity of (0, sink)): both are cuts."""
    layers, m, _ = cap.shape
    out_capacity = 0.0
    for j in range(m):
        out_capacity += cap[layers - 1, source, j]
    in_capacity = 0.0
    for i in range(m):
        in_capacity += cap_t[0, sink, i]
    return min(out_capacity, in_capacity)


@njit(cache=True)
def _causal_bounds(cap, cap_t, source, bounds, below, left):
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
    Sinks after the source get 0, exactly (no path reaches them).
    """
    layers, m, _ = cap.shape
    p = source
    bounds[:] = 0.0
    below[:] = 0.0
    left[:] = 0.0
    for k in range(1, layers - 1):
        for tau in range(p):
            total = 0.0
            for i in range(tau + 1, p + 1):
                total += cap_t[k, tau, i]
            below[k, tau] = total
    cuts = np.zeros(layers)
    for t in range(p, -1, -1):
        for k in range(1, layers - 1):
            for tau in range(t + 1, p + 1):
                left[k, tau] += cap_t[k, t, tau]
        into_sink = 0.0
        for i in range(t, p + 1):
            into_sink += cap_t[0, t, i]
        best = into_sink
        from_source = 0.0
        cuts[:] = 0.0
        for tau in range(t, p + 1):
            from_source += cap[layers - 1, p, tau]
            into_sink -= cap_t[0, t, tau]
            total = from_source + into_sink
            for k in range(1, layers - 1):
                cuts[k] += below[k, tau] - left[k, tau]
                total += cuts[k]
            best = min(best, total)
        bounds[t] = max(best, 0.0)


@njit(cache=True)
def _threshold_cut(cap, cap_t, source, sink, cost, following, row_sums):
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
    few positions per layer meets. ``cost``, ``following`` and ``row_sums`` are scratch of size
    >= w + 1.
    """
    layers = cap.shape[0]
    t, p = sink, source
    w = p - t + 1
    # cost[a]: the least cut of the layers above with threshold t + a at the current layer.
    cost[: w + 1] = np.inf
    cost[w - 1] = 0.0
    for k in range(layers - 1, 1, -1):
        following[: w + 1] = np.inf
        row_sums[: w + 1] = 0.0  # row_sums[b] = F_k(t + a, t + b) for the current a
        for a in range(w - 1, -1, -1):
            prefix = 0.0
            for b in range(1, w + 1):
                prefix += cap[k, t + a, t + b - 1]
                row_sums[b] += prefix
            if cost[a] < np.inf:
                for b in range(w + 1):
                    following[b] = min(following[b], cost[a] + row_sums[b])
        following[w] = min(following[w], cost[w])
        cost[: w + 1] = following[: w + 1]
    best = cost[w]
    row_sums[: w + 1] = 0.0  # row_sums[i] = sum of A_2[h, t + i] over h >= t + a
    for a in range(w - 1, -1, -1):
        for i in range(a + 1):
            row_sums[i] += cap[1, t + a, t + i]
        if cost[a] < np.inf:
            total = cost[a]
            for i in range(w):
                total += min(cap_t[0, t, t + i], row_sums[i])
            best = min(best, total)
    return max(best, 0.0)


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
