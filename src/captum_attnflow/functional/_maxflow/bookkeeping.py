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


@njit(cache=True, inline="always")
def _remember(touched, slot):
    """Append the packed index ``slot`` of a flow entry made nonzero to ``touched`` (``touched[0]``
    counts them); a full list stops growing and counts as overflowed."""
    if touched[0] < touched.shape[0] - 1:
        touched[0] += 1
        touched[touched[0]] = slot


@njit(cache=True)
def _clear(flow, touched):
    """Zero the entries of ``flow`` listed in ``touched`` (every nonzero one if the list overflowed).

    Entries already zero are not written: pages of ``flow`` that no pair touched stay unmapped.
    """
    if touched[0] >= touched.shape[0] - 1:
        for slot in range(flow.shape[0]):
            if flow[slot] != 0.0:
                flow[slot] = 0.0
    else:
        for n in range(1, touched[0] + 1):
            flow[touched[n]] = 0.0
    touched[0] = 0
