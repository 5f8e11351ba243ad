"""The max-flow kernel's shared bookkeeping: the saturation tolerance ``EPS``, the skip lists
that drop nodes out of a level graph, and the list of flow entries made nonzero (so that
clearing the flow between (source, sink) pairs costs what the pair touched, not the graph)."""

from __future__ import annotations

from numba import njit

# Residual capacities at or below this count as saturated. Far above float64 rounding of
# values <= 1 (~1e-16 per operation), far below the 1e-6 accuracy anyone reads flows at.
EPS = 1e-12


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


# Flows are stored in blocks of BLOCK = 2 ** _SHIFT consecutive edges of the packed graph (a
# power of two: a slot's block and place in it are a shift and a mask).
_SHIFT = 6
BLOCK = 1 << _SHIFT
_MASK = BLOCK - 1
# ``blocks[b]`` of a block that holds no flow.
NO_BLOCK = -1


@njit(cache=True, inline="always")
def _remember(touched, slot):
    """Append the packed index ``slot`` of an edge whose flow was made nonzero to ``touched``
    (``touched[0]`` counts them); a full list stops growing and counts as overflowed."""
    if touched[0] < touched.shape[0] - 1:
        touched[0] += 1
        touched[touched[0]] = slot


@njit(cache=True, inline="always")
def _flow(pool, blocks, slot):
    """The flow on the edge stored at ``slot`` of the packed graph.

    A thread's flows are ``pool``, ``blocks`` and ``used``. On a small graph ``blocks`` is
    None and ``pool`` (float64) holds them in the graph's own layout, ``pool[slot]``; numba
    compiles that case on its own, without the lookup. Otherwise ``pool`` holds the blocks of
    ``BLOCK`` edges that carry flow in the current (source, sink) pair, packed in the order
    they were first written, block ``b`` from ``pool[blocks[b]]`` (``NO_BLOCK`` for the
    others); ``used[0]`` is the end of the pool in use.
    """
    if blocks is None:
        return pool[slot]
    start = blocks[slot >> _SHIFT]
    return pool[start + (slot & _MASK)] if start != NO_BLOCK else 0.0


@njit(cache=True, inline="always")
def _flow_at(pool, blocks, offsets, rows, k, i, j):
    """The flow on edge (k + 1, i) -> (k, j), 0 outside the row's span."""
    if j < rows[k, i, 0] or j >= rows[k, i, 1]:
        return 0.0
    return _flow(pool, blocks, offsets[k, i] + j - rows[k, i, 0])


@njit(cache=True, inline="always")
def _flow_index(blocks, used, slot):
    """Where the flow of the edge at ``slot`` is in the pool: ``slot`` itself without blocks,
    else in its block, given room there (zeros) on first use."""
    if blocks is None:
        return slot
    start = blocks[slot >> _SHIFT]
    if start == NO_BLOCK:
        start = used[0]
        blocks[slot >> _SHIFT] = start
        used[0] += BLOCK
    return start + (slot & _MASK)


@njit(cache=True)
def _clear(pool, blocks, used, touched):
    """Zero the flows of the edges listed in ``touched`` (the whole pool in use if the list
    overflowed) and release their blocks: the pool is all zeros again, from its start."""
    if blocks is None:
        if touched[0] >= touched.shape[0] - 1:
            pool[:] = 0.0
        else:
            for n in range(1, touched[0] + 1):
                pool[touched[n]] = 0.0
    elif touched[0] >= touched.shape[0] - 1:
        pool[: used[0]] = 0.0
        blocks[:] = NO_BLOCK
    else:
        # Every block in use holds an edge of the list: the one that first wrote to it.
        for n in range(1, touched[0] + 1):
            start = blocks[touched[n] >> _SHIFT]
            if start != NO_BLOCK:
                pool[start + (touched[n] & _MASK)] = 0.0
        for n in range(1, touched[0] + 1):
            blocks[touched[n] >> _SHIFT] = NO_BLOCK
    used[0] = 0
    touched[0] = 0
