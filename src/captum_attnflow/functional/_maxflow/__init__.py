"""Compiled maximum flow on the layered attention graph (the kernel behind :func:`flow`).

Hand-written rather than scipy's or networkx's max-flow because those take a general sparse
graph: one call per (source, sink) pair rebuilds it and pays Python overhead, about 0.9 s for
one source of a 12-layer, 128-token graph with scipy. Here the graph is built once for all
pairs, the trivial cuts stop a search as soon as they are reached, and threads run the
(source, sink) pairs in parallel.

Layout (:mod:`.packed`). Each row of each layer keeps only the span of its nonzero capacities,
packed one after another in one float32 array: a decoder's causal attention keeps its lower
triangles (half the square), a sliding window its band, padding nothing (it is removed before),
an encoder every entry; one kernel reads every case through the same index arithmetic
(``offsets[k, i] + j - lo``). A column, the edges into one node, is read down the rows whose
span holds it: there is no transposed copy of the graph. The graph is packed layer by layer
(:class:`~.packed.GraphPacker`), so that :func:`~captum_attnflow.functional.flow` needs one
(B, n, n) layer at a time, never the (L, B, n, n) stack.

Flows. Each thread has its own float64 flows (float32 sums would drift). On a small graph
(flows of at most 32 MiB a thread, ``driver._DENSE_FLOW_BYTES``) they are one array in the
graph's layout. On a larger one the block lookup below pays for itself, for a pair's flows
are sparse: the depth-first fill and the augmenting paths write to a small share of the
edges, scattered over most rows (so that a store per row would hold nearly the whole graph,
and a dense array gets nearly every page written over the pairs of a source). They are kept
in blocks of ``BLOCK`` = 64 consecutive packed edges: the first write to a block gives it room at the end of the used
part of a pool, ``blocks[b]`` says where, and after the pair the entries written are zeroed and
the blocks released, so each pair starts again from the pool's start. The pool has room for
every block (a thread can never need more than the graph itself) but is allocated as zeros
that the operating system maps only when written: a thread's memory is what the busiest pair
touched (at n = 2048, L = 12, causal, both threads' pools together about 20 MB, where float64
arrays of the graph's size took 330 MB). Reading a flow costs one more lookup (its block) than
reading a dense array: 12-24 % of the kernel's time on small graphs, which is why they keep one.

The algorithm is Dinic's: breadth-first levels in the residual graph, then blocking flows along
level-increasing paths. Its first phase needs no search: without flow the residual graph is
the DAG itself, and :func:`~.first_phase._greedy_fill` computes its blocking flow as a depth-first
pass in which every node sends what it can to its children in turn and returns the total to its
parent (no path is walked twice), layer-1 nodes are filled straight into the sink, and nodes
that can send nothing more leave their layer's skip list (:func:`~.bookkeeping._next_alive`), so that
no later scan looks at them; scans of a row stay inside its nonzero span (causal and local
attention). On a pretrained encoder's attention (MiniLM) this first phase alone reaches a trivial
bound for about 99 % of the pairs and ends the search; later phases reroute flow through
residual (upward) edges, which is what the trivial bounds cannot capture (causal attention
with a sink needs them for most pairs).

A causal graph (a decoder's attention: edges only to the same or earlier positions) gets
tighter cuts than the trivial ones: only positions between the sink and the source matter,
and the least of the cuts that put the positions above a threshold on the source's side
(:func:`~.cuts._causal_bounds`, all sinks of a source in O(l n^2)) is, on a language model's
attention, usually the max flow itself. The first phase is given that bound as its budget and
skips the positions before the sink, so reaching it settles the pair without a breadth-first
search or a cut; where it stops below, a wider family of cuts (:func:`~.cuts._threshold_cut`, one
threshold per layer and a free side for every layer-1 node) often still proves it maximal.

Capacities are stored in float32 (the attention graph's own precision, so nothing is rounded),
flows and sums in float64. A residual capacity counts as positive only above ``EPS``. When the
search stops, either the flow equals one of these bounds (the source's out-capacity, the
sink's in-capacity or a causal graph's threshold cuts, all cuts), or the nodes reachable from
the source through residual capacity above ``EPS`` form a cut whose capacity exceeds the flow found by at most ``EPS`` per crossing
edge. Either way ``0 <= max_flow - value <= gap <= EPS * (number of edges)``, and the kernel
returns that ``gap`` (cut capacity minus flow, measured) with every value as a certificate.

The package follows those phases: :mod:`.packed` (the layout), :mod:`.bookkeeping` (``EPS``,
skip lists, the blocks of flows and the list of entries to clear), :mod:`.first_phase`,
:mod:`.later_phases`, :mod:`.cuts` (the bounds and the certifying cut) and :mod:`.driver` (one
pair, and :func:`max_flows` over all pairs on threads).
Its modules import each other relatively, so that a copy of the package taken from any git
revision runs on its own (``benchmarks/flow.py --previous``). Numba's on-disk cache of a compiled
function is keyed on its own file only: after editing one module of the kernel, delete this
package's ``__pycache__`` so that the functions of the other modules that call it are recompiled.
"""

from .bookkeeping import EPS
from .driver import max_flows
from .packed import GraphPacker, PackedGraph, pack

__all__ = ["EPS", "GraphPacker", "PackedGraph", "max_flows", "pack"]
