"""Dinic's first phase: the blocking flow of the attention DAG itself, found by one depth-first fill
(no search: without flow the residual graph is the DAG)."""

from __future__ import annotations

from numba import njit

from .bookkeeping import EPS, _flow, _flow_index, _next_alive, _remember
from .packed import _slot


@njit(cache=True)
def _into_sink(cap, pool, blocks, used, offsets, rows, sink_cap, sink_flow, skip, touched, i, j, limit):
    """Push up to ``limit`` along (2, i) -> (1, j) -> (0, sink); returns how much went.

    (1, j) leaves the level graph (``skip``) once its edge into the sink is full; ``sink_cap[j]``
    is that edge's capacity.
    """
    into_sink = sink_cap[j] - sink_flow[j]
    if into_sink <= EPS:
        skip[1, j] = j + 1
        return 0.0
    slot = _slot(offsets, rows, 1, i, j)
    if slot < 0:
        return 0.0
    edge = cap[slot] - _flow(pool, blocks, slot)
    if edge <= EPS:
        return 0.0
    delta = min(edge, into_sink, limit)
    index = _flow_index(blocks, used, slot)
    if pool[index] == 0.0:
        _remember(touched, slot)
    pool[index] += delta
    sink_flow[j] += delta
    if into_sink - delta <= EPS:
        skip[1, j] = j + 1
    return delta


@njit(cache=True)
def _greedy_fill(
    cap, pool, blocks, used, offsets, rows, sink_cap, sink_flow, source, sink, skip, ptr, path_i, room, got, touched, budget, first
):
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
    ``sink_flow`` (by layer-1 position; ``sink_cap`` holds the capacities of those edges), the
    others to ``flow`` (see :func:`~.bookkeeping._flow`), and the pool entries made nonzero are
    appended to ``touched``. Returns the flow value.
    """
    layers, m = offsets.shape
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
            got[0] = min(room[0], sink_cap[i])
            sink_flow[i] = got[0]
            break
        descend = False
        if k == 2:
            # Layer 2: fill the sink through every live layer-1 node at once, the one below first.
            if skip[1, i] == i:
                left = room[depth] - got[depth]
                got[depth] += _into_sink(cap, pool, blocks, used, offsets, rows, sink_cap, sink_flow, skip, touched, i, i, left)
            arc = _next_alive(skip, 1, max(ptr[2, i], rows[1, i, 0]))
            while arc < rows[1, i, 1] and got[depth] < room[depth] - EPS:
                left = room[depth] - got[depth]
                got[depth] += _into_sink(cap, pool, blocks, used, offsets, rows, sink_cap, sink_flow, skip, touched, i, arc, left)
                if got[depth] >= room[depth] - EPS:
                    break
                arc = _next_alive(skip, 1, arc + 1)
            ptr[2, i] = arc
        elif got[depth] < room[depth] - EPS:
            start, end = rows[k - 1, i, 0], rows[k - 1, i, 1]
            base = offsets[k - 1, i] - start  # edge (k, i) -> (k-1, j) is stored at base + j
            # The node right below first, then the others in order from where the scan stopped.
            if skip[k - 1, i] == i and start <= i < end and cap[base + i] - _flow(pool, blocks, base + i) > EPS:
                arc = i
            else:
                arc = _next_alive(skip, k - 1, max(ptr[k, i], start))
                while arc < end and cap[base + arc] - _flow(pool, blocks, base + arc) <= EPS:
                    arc = _next_alive(skip, k - 1, arc + 1)
                ptr[k, i] = arc
            if arc < end:
                path_i[depth + 1] = arc
                room[depth + 1] = min(cap[base + arc] - _flow(pool, blocks, base + arc), room[depth] - got[depth])
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
            slot = offsets[k, parent] + i - rows[k, parent, 0]
            index = _flow_index(blocks, used, slot)
            if pool[index] == 0.0:
                _remember(touched, slot)
            pool[index] += sent
            got[depth] += sent
    return got[0]
