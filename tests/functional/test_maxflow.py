"""Tests of the max-flow kernel behind functional.flow, with its certificate, and of flow's memory check.

Each value the kernel returns comes with a gap: an upper bound (a cut of the graph, or a
trivial bound) minus the flow found. The tests check the certificate itself, not only the
values: networkx's max flow lies in [value, value + gap] and the gap is at most EPS per edge.
The graphs are structured (causal attention with a sink, local bands, peaked heads, random
zero patterns) so that many flows fall below the trivial bound min(1, column sum) and the
later Dinic phases run, not only the first greedy fill.
"""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from captum_attnflow.functional import attention_graph, flow
from captum_attnflow.functional import _memory
from captum_attnflow.functional._maxflow import EPS, max_flows
from captum_attnflow.functional._maxflow.cuts import _causal_bounds, _threshold_cut
from captum_attnflow.functional._maxflow.packed import PackedGraph, pack
from helpers import banded, causal_sink, peaked


def network(graph: np.ndarray) -> nx.DiGraph:
    """networkx graph of one example's (l, n, n) capacities: node (k, i), edge (k, i) -> (k-1, j)."""
    layers, n, _ = graph.shape
    result = nx.DiGraph()
    result.add_nodes_from(itertools.product(range(layers + 1), range(n)))
    for k, i, j in zip(*np.nonzero(graph)):
        result.add_edge((k + 1, i), (k, j), capacity=float(graph[k, i, j]))
    return result


def reference(graph: np.ndarray, sources, sinks) -> np.ndarray:
    layers = graph.shape[0]
    net = network(graph)
    return np.array([[nx.maximum_flow_value(net, (layers, s), (0, t)) for t in sinks] for s in sources])


def assert_certified(graph: np.ndarray, values: np.ndarray, gaps: np.ndarray, exact: np.ndarray) -> None:
    """exact - gap <= value <= exact (to float64 rounding) and 0 <= gap <= EPS * edges."""
    assert (gaps >= -1e-15).all() and (gaps <= EPS * graph.size).all()
    assert (values <= exact + 1e-12).all()
    assert (values >= exact - gaps - 1e-12).all()


def trivial(graph: np.ndarray, sources, sinks) -> np.ndarray:
    return np.minimum(graph[-1].sum(1)[sources][:, None], graph[0].sum(0)[sinks][None, :])


STRUCTURED = {
    "causal-sink L=6 n=32": lambda: causal_sink(6, 32, heads=4, seed=11),
    "banded L=6 n=32": lambda: banded(6, 32, width=3, heads=2, seed=12),
    "peaked L=4 n=24": lambda: peaked(4, 24, heads=2, seed=13),
}


@pytest.mark.parametrize("name", sorted(STRUCTURED))
def test_structured_graphs_match_networkx_with_certificate(name):
    # Capacities in float32, as flow passes them; networkx gets the same numbers in float64.
    graph = attention_graph(STRUCTURED[name]()).weights[:, 0].numpy().astype(np.float64)
    n = graph.shape[1]
    sources = [n - 1, n // 2, 3]
    sinks = list(range(0, n, 4))
    values, gaps = max_flows(graph, np.array(sources), 2)
    exact = reference(graph, sources, sinks)
    assert_certified(graph, values[:, sinks], gaps[:, sinks], exact)
    # The cases must be hard: many flows strictly below the trivial bound.
    below = exact < trivial(graph, sources, sinks) - 1e-3
    assert below.mean() >= 0.5, below.mean()


def capacity_graphs():
    """(l, n, n) float32-valued capacities: rows of random weights on random supports, some rows empty."""
    return st.tuples(st.integers(1, 4), st.integers(2, 7), st.integers(0, 2**16), st.floats(0.2, 0.9)).map(_graph)


def _graph(args) -> np.ndarray:
    layers, n, seed, density = args
    rng = np.random.default_rng(seed)
    weights = rng.exponential(size=(layers, n, n)) ** 3
    weights *= rng.random((layers, n, n)) < density
    rows = weights.sum(-1, keepdims=True)
    graph = np.where(rows > 0, weights / np.where(rows > 0, rows, 1), 0)
    return graph.astype(np.float32).astype(np.float64)


@settings(max_examples=40, deadline=None)
@given(capacity_graphs())
def test_kernel_matches_networkx_on_sparse_graphs(graph):
    n = graph.shape[1]
    values, gaps = max_flows(graph, np.arange(n), 1)
    assert_certified(graph, values, gaps, reference(graph, range(n), range(n)))


@settings(max_examples=40, deadline=None)
@given(capacity_graphs())
def test_kernel_matches_networkx_on_sparse_causal_graphs(graph):
    # Edges only to the same or earlier positions: the kernel bounds each pair by threshold cuts
    # and skips the positions before the sink; sinks after the source get 0.
    graph = np.tril(graph)
    n = graph.shape[1]
    values, gaps = max_flows(graph, np.arange(n), 1)
    assert_certified(graph, values, gaps, reference(graph, range(n), range(n)))


def test_threshold_cuts_bound_causal_flows_and_mostly_meet_them():
    # Near-uniform causal attention, as a language model with random weights has: the least
    # threshold cut is the max flow for most pairs, which the first phase then reaches.
    generator = torch.Generator().manual_seed(5)
    logits = 0.1 * torch.randn(4, 1, 2, 24, 24, generator=generator)
    attentions = torch.softmax(logits.masked_fill(torch.ones(24, 24, dtype=torch.bool).triu(1), float("-inf")), -1)
    graph = attention_graph(attentions).weights[:, 0].numpy()
    packed = pack(graph)
    arrays = (packed.values, packed.offsets, packed.rows)
    bounds, below, left, scratch = np.zeros(24), np.zeros((4, 24)), np.zeros((4, 24)), np.zeros((4, 25))
    for source in (23, 15, 6):
        _causal_bounds(*arrays, source, bounds, below, left, np.zeros((3, 24, 5)))
        cuts = np.array([_threshold_cut(*arrays, source, t, *scratch) for t in range(source + 1)])
        exact = reference(graph.astype(np.float64), [source], range(source + 1))[0]
        assert (bounds[: source + 1] >= exact - 1e-12).all() and (cuts >= exact - 1e-12).all()
        assert (bounds[source + 1 :] == 0).all()
        assert np.mean(bounds[: source + 1] <= exact + 1e-9) >= 0.6
        assert np.mean(np.minimum(bounds[: source + 1], cuts) <= exact + 1e-9) >= 0.95


def test_progress_reports_every_source_and_changes_nothing():
    graph = attention_graph(causal_sink(3, 20, seed=4)).weights[:, 0].numpy()
    sources = np.arange(20)
    done = []
    values, gaps = max_flows(graph, sources, 2, done.append)
    assert sum(done) == 20 and len(done) > 1
    expected, expected_gaps = max_flows(graph, sources, 2)
    assert np.array_equal(values, expected) and np.array_equal(gaps, expected_gaps)


def test_memory_estimate_by_hand():
    # L=2, B=3, n=4: 32 edges per example (20 in the lower triangles); capacities 4*3*E, flows
    # 8*2*E on 2 threads, row offsets and spans 40*3*2*4, one layer 4*3*4*4, result 12*1*3*2*4.
    assert _memory.flow_bytes(layers=2, batch=3, n=4, num_sources=2, out_layers=1, threads=2) == (
        384 + 512 + 960 + 192 + 288
    )
    assert _memory.flow_bytes(layers=2, batch=3, n=4, num_sources=2, out_layers=1, threads=2, causal=True) == (
        240 + 320 + 960 + 192 + 288
    )


def test_flow_that_does_not_fit_fails_before_starting(monkeypatch):
    attentions = causal_sink(3, 8)
    needed = _memory.flow_bytes(3, 1, 8, 8, 1, 4)
    monkeypatch.setattr(_memory, "available_bytes", lambda: needed // 100)
    with pytest.raises(ValueError, match="fewer sources.*shorter input"):
        flow(attentions, sources=None)
    monkeypatch.setattr(_memory, "available_bytes", lambda: None)
    assert flow(attentions, sources=None).shape == (1, 8, 8)


def test_available_memory_is_known_here():
    available = _memory.available_bytes()
    assert available is None or available > 0
    if available is not None:
        # A flow the size of the whole machine's memory cannot be accepted.
        with pytest.raises(ValueError, match="GiB"):
            _memory.check_flow_fits(layers=12, batch=available // 2**20, n=2**10, num_sources=1, out_layers=1, threads=1)


def test_flow_keeps_float32_capacities_exact():
    # A float32 graph goes to the kernel unchanged: one layer's flow is its mixed attention row.
    attentions = torch.softmax(torch.randn(1, 1, 2, 6, 6, generator=torch.Generator().manual_seed(3)), -1)
    expected = attention_graph(attentions).weights[0, 0]
    assert torch.equal(flow(attentions, sources=None)[0], expected)


def full_rows(graph: np.ndarray) -> PackedGraph:
    """``graph`` (l, n, n) in the packed layout with every row stored whole, zeros included."""
    layers, n, _ = graph.shape
    rows = np.zeros((layers, n, 2), np.int64)
    rows[..., 1] = n
    cols = rows.copy()
    offsets = np.arange(layers * n, dtype=np.int64).reshape(layers, n) * n
    return PackedGraph(np.ascontiguousarray(graph, np.float32).ravel(), offsets, rows, cols, False)


def sliding_window(layers: int, n: int, window: int, seed: int) -> torch.Tensor:
    """Causal attention over the last ``window`` positions (Mistral's sliding window), with a sink at 0."""
    generator = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(layers, 1, 2, n, n, generator=generator)
    logits[..., 0] += 2
    index = torch.arange(n)
    outside = (index[None, :] > index[:, None]) | (index[:, None] - index[None, :] >= window)
    return torch.softmax(logits.masked_fill(outside, float("-inf")), -1)


def test_packing_keeps_each_rows_nonzero_span():
    graph = attention_graph(sliding_window(3, 12, window=4, seed=1)).weights[:, 0].numpy()
    graph[1, 5] = 0  # an empty row
    packed = pack(graph)
    assert packed.causal and packed.values.dtype == np.float32
    assert packed.values.size == np.count_nonzero(graph)  # a band: nothing but its nonzeros
    unpacked = np.zeros_like(graph)
    for k, i in itertools.product(range(3), range(12)):
        lo, hi = packed.rows[k, i]
        unpacked[k, i, lo:hi] = packed.values[packed.offsets[k, i] : packed.offsets[k, i] + hi - lo]
        column = np.flatnonzero(graph[k, :, i])
        assert tuple(packed.cols[k, i]) == ((column[0], column[-1] + 1) if column.size else (0, 0))
    assert np.array_equal(unpacked, graph) and tuple(packed.rows[1, 5]) == (0, 0)
    assert packed.first(2).values.size == np.count_nonzero(graph[:2]) and not pack(graph[:1]).causal
    assert not pack(graph.transpose(0, 2, 1)).causal


@pytest.mark.parametrize(
    "name, attentions",
    [
        ("sliding window", sliding_window(5, 24, window=5, seed=2)),
        ("causal sink", causal_sink(4, 20, heads=3, seed=6)),
        ("banded", banded(4, 20, width=2, seed=7)),
        ("peaked", peaked(3, 12, seed=8)),
    ],
)
def test_packed_rows_give_the_values_of_whole_rows_and_of_networkx(name, attentions):
    # The same graph stored row by row whole (zeros included, as a dense kernel reads it) and as
    # its nonzero spans: the kernel reads both through the same index arithmetic, to the same bits;
    # and its flows kept in the graph's layout (small graphs) or pooled in blocks (large ones).
    graph = attention_graph(attentions).weights[:, 0].numpy()
    n = graph.shape[1]
    sources = [n - 1, n // 2, 1]
    values, gaps = max_flows(pack(graph), np.array(sources), 2)
    whole_values, whole_gaps = max_flows(full_rows(graph), np.array(sources), 2)
    np.testing.assert_array_equal(values, whole_values)
    np.testing.assert_array_equal(gaps, whole_gaps)
    pooled_values, pooled_gaps = max_flows(pack(graph), np.array(sources), 2, pooled=True)
    np.testing.assert_array_equal(values, pooled_values)
    np.testing.assert_array_equal(gaps, pooled_gaps)
    assert_certified(graph, values, gaps, reference(graph.astype(np.float64), sources, range(n)))


@pytest.mark.parametrize("pooled", [False, True], ids=["flows in the graph's layout", "pooled flows"])
def test_the_pool_of_flows_is_zero_between_pairs(pooled):
    # Each thread reuses its flows from pair to pair: the order of the pairs, and which thread
    # runs them, cannot change a value.
    graph = attention_graph(sliding_window(6, 40, window=9, seed=3)).weights[:, 0].numpy()
    packed = pack(graph)
    values, gaps = max_flows(packed, np.array([39, 20, 31]), 1, pooled=pooled)
    reordered, reordered_gaps = max_flows(packed, np.array([31, 20, 39]), 2, pooled=pooled)
    np.testing.assert_array_equal(values, reordered[::-1])
    np.testing.assert_array_equal(gaps, reordered_gaps[::-1])
