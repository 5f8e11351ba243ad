"""Dinic's later phases: breadth-first levels in the residual graph (searched from the sink), then
blocking flows along level-increasing paths, which reroute flow through residual (upward) edges."""

from __future__ import annotations

from numba import njit

from .bookkeeping import EPS, _flow, _flow_at, _flow_index, _next_alive
from .packed import _at, _slot


@njit(cache=True)
def _levels_to_sink(cap, pool, blocks, used, offsets, rows, cols, source, sink, dist, queue_k, queue_i, unseen):
    """Residual BFS towards (0, sink): ``dist`` = residual distance to the sink, -1 if none.

    Searching backwards from the sink rather than forwards from the source pays off at the
    end: when no augmenting path is left, the nodes that still reach the sink are usually a
    small region near it, and that region is also the minimum cut. Returns whether the source
    reaches the sink; stops as soon as it does. ``unseen`` holds skip lists of the nodes not
    reached yet (see :func:`_next_alive`): a node scans only those for new neighbours, so
    once a layer is mostly reached its scans are short.
    """
    layers, m = offsets.shape
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
            slot = _slot(offsets, rows, k, source, i)
            if slot >= 0 and cap[slot] - _flow(pool, blocks, slot) > EPS:
                dist[layers, source] = level
                return True
        elif k + 1 < layers:
            # Residual arcs (k+1, j) -> (k, i) down the column of (k, i).
            j = _next_alive(unseen, k + 1, cols[k, i, 0])
            while j < cols[k, i, 1]:
                slot = _slot(offsets, rows, k, j, i)
                if slot >= 0 and cap[slot] - _flow(pool, blocks, slot) > EPS:
                    dist[k + 1, j] = level
                    unseen[k + 1, j] = j + 1
                    queue_k[tail] = k + 1
                    queue_i[tail] = j
                    tail += 1
                j = _next_alive(unseen, k + 1, j + 1)
        if k >= 2:
            # Residual arc (k-1, j) -> (k, i): cancelling flow sent down (k, i) -> (k-1, j).
            base = offsets[k - 1, i] - rows[k - 1, i, 0]
            j = _next_alive(unseen, k - 1, rows[k - 1, i, 0])
            while j < rows[k - 1, i, 1]:
                if _flow(pool, blocks, base + j) > EPS:
                    dist[k - 1, j] = level
                    unseen[k - 1, j] = j + 1
                    queue_k[tail] = k - 1
                    queue_i[tail] = j
                    tail += 1
                j = _next_alive(unseen, k - 1, j + 1)
    return False


@njit(cache=True)
def _residual(cap, pool, blocks, used, offsets, rows, k, i, arc, m):
    """Residual capacity of arc ``arc`` of node (k, i): arcs < m go down to (k-1, arc), others up
    (the flow of (k+1, arc - m) -> (k, i), which they cancel)."""
    if arc < m:
        return _at(cap, offsets, rows, k - 1, i, arc) - _flow_at(pool, blocks, offsets, rows, k - 1, i, arc)
    return _flow_at(pool, blocks, offsets, rows, k, arc - m, i)


@njit(cache=True)
def _blocking_flow(cap, pool, blocks, used, offsets, rows, cols, sink, dist, ptr, path_k, path_i, path_arc, touched, budget):
    """Augment along residual paths on which ``dist`` drops by one per arc, until none is left.

    The path starts at ``path_k[0], path_i[0]`` (the source) and ends at the node of distance
    0 (the sink); at most ``budget`` is pushed. Arcs ``< m`` of a node go down, the others up.
    Returns the flow pushed; flow entries it makes nonzero are appended to ``touched``.
    """
    layers, m = offsets.shape
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
                res = _residual(cap, pool, blocks, used, offsets, rows, path_k[d], path_i[d], path_arc[d], m)
                if res < delta:
                    delta = res
            first_saturated = depth
            for d in range(depth):
                kd = path_k[d]
                idx = path_i[d]
                arc = path_arc[d]
                if arc < m:
                    slot = offsets[kd - 1, idx] + arc - rows[kd - 1, idx, 0]
                    index = _flow_index(blocks, used, slot)
                    if pool[index] == 0.0 and num_touched < touched.shape[0] - 1:
                        num_touched += 1
                        touched[num_touched] = slot
                    pool[index] += delta
                else:
                    pool[_flow_index(blocks, used, offsets[kd, arc - m] + idx - rows[kd, arc - m, 0])] -= delta
                if first_saturated == depth and _residual(cap, pool, blocks, used, offsets, rows, kd, idx, arc, m) <= EPS:
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
            base = offsets[k - 1, i] - rows[k - 1, i, 0]
            while arc < end and not (dist[k - 1, arc] == target and cap[base + arc] - _flow(pool, blocks, base + arc) > EPS):
                arc += 1
            if arc >= end:
                arc = m
        elif arc < m:
            # Layer 1: the sink is the only input node in the graph, its arc the only downward one.
            admissible = (
                arc <= sink
                and dist[0, sink] == target
                and _at(cap, offsets, rows, 0, i, sink) - _flow_at(pool, blocks, offsets, rows, 0, i, sink) > EPS
            )
            arc = sink if admissible else m
        if arc >= m:
            end = num_arcs if k == layers else m + cols[k, i, 1]
            arc = num_arcs if k == layers else max(arc, m + cols[k, i, 0])
            # Upward arcs (k, i) -> (k+1, j): cancelling flow sent down (k+1, j) -> (k, i).
            while arc < end and not (dist[k + 1, arc - m] == target and _flow_at(pool, blocks, offsets, rows, k, arc - m, i) > EPS):
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
