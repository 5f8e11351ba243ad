"""Tests of functional.flow: exactness against networkx max flow, properties, padding and errors.

networkx is the reference (the authors' approach, one ``maximum_flow_value`` per pair, on the
networkx 3 API). Random Dirichlet attention almost always has flow equal to the trivial bound
min(source out-capacity, the sink's in-capacity at layer 1), so the exactness cases are
structured attention where the flow falls below it; ``test_cases_are_below_trivial_bound``
checks that they do.
"""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from captum_attnflow.capture import extract_attentions
from captum_attnflow.functional import AttentionGraph, attention_graph, flow, rollout_rows
from captum_attnflow.functional._maxflow import EPS, max_flows
from captum_attnflow.functional._maxflow.driver import _WORK_PER_THREAD
from helpers import banded, causal_sink, make_tiny_model, peaked


def networkx_flow(graph: np.ndarray, source: int, sink: int) -> float:
    """Max flow from (l, source) to (0, sink) of one example's (l, n, n) graph, with networkx."""
    layers, n, _ = graph.shape
    network = nx.DiGraph()
    for k, i, j in itertools.product(range(1, layers + 1), range(n), range(n)):
        if graph[k - 1, i, j] > 0:
            network.add_edge((k, i), (k - 1, j), capacity=float(graph[k - 1, i, j]))
    if (layers, source) not in network or (0, sink) not in network:
        return 0.0
    return nx.maximum_flow_value(network, (layers, source), (0, sink))


def tiny_model(arch: str, n: int) -> torch.Tensor:
    model = make_tiny_model(arch, seed=1)
    ids = torch.randint(3, 60, (1, n), generator=torch.Generator().manual_seed(0))
    return torch.stack(extract_attentions(model, ids))


CASES = {
    "causal-sink L=1 n=6": causal_sink(1, 6),
    "causal-sink L=3 n=8": causal_sink(3, 8, seed=1),
    "causal-sink L=6 n=12": causal_sink(6, 12, seed=2),
    "banded L=4 n=10": banded(4, 10),
    "banded L=6 n=16": banded(6, 16, width=1, seed=3),
    "peaked L=2 n=8": peaked(2, 8),
    "peaked L=5 n=12": peaked(5, 12, seed=4),
    "gpt2 L=3 n=10": tiny_model("gpt2", 10),
    "bert L=3 n=10": tiny_model("bert", 10),
}


def reference_flows(attentions: torch.Tensor, sources, sinks) -> np.ndarray:
    graph = attention_graph(attentions).weights.double().numpy()[:, 0]
    return np.array([[networkx_flow(graph, s, t) for t in sinks] for s in sources])


def trivial_bounds(attentions: torch.Tensor) -> np.ndarray:
    """min(out-capacity of each source at layer L, in-capacity of each sink at layer 1): (n, n)."""
    graph = attention_graph(attentions).weights.double().numpy()[:, 0]
    return np.minimum(graph[-1].sum(1)[:, None], graph[0].sum(0)[None, :])


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_networkx(name):
    attentions = CASES[name]
    n = attentions.shape[-1]
    ours = flow(attentions, sources=None)[0].double().numpy()
    np.testing.assert_allclose(ours, reference_flows(attentions, range(n), range(n)), rtol=0, atol=1e-6)


def test_cases_are_below_trivial_bound():
    # Each structured family must contain pairs whose flow is well below the trivial bound,
    # otherwise the exactness tests could not tell a max flow from the bound.
    for name, attentions in CASES.items():
        if attentions.shape[0] == 1:
            continue
        below = flow(attentions)[0].double().numpy() < trivial_bounds(attentions) - 1e-3
        assert below.sum() >= 2, name


def test_matches_networkx_at_six_layers_32_tokens():
    attentions = causal_sink(6, 32, heads=4, seed=5)
    sinks = [0, 1, 5, 17, 30, 31]
    ours = flow(attentions, sources=[31, 16])[0].double().numpy()[:, sinks]
    reference = reference_flows(attentions, [31, 16], sinks)
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-6)
    assert (reference < trivial_bounds(attentions)[[31, 16]][:, sinks] - 1e-3).any()


def test_kernel_certificate_bounds_the_error():
    # The kernel certifies each value: exact - gap <= value <= exact, gap <= EPS * edges.
    attentions = banded(6, 16, width=1, seed=3)
    graph = attention_graph(attentions).weights.double().numpy()[:, 0]
    values, gaps = max_flows(np.ascontiguousarray(graph), np.arange(16), 2)
    reference = reference_flows(attentions, range(16), range(16))
    assert (gaps >= -1e-15).all() and (gaps <= EPS * graph.size).all()
    assert (values <= reference + 1e-9).all() and (values >= reference - gaps - 1e-9).all()


def test_threads_give_the_serial_values():
    # Large enough for max_flows to start a second thread (pairs x edges >= _WORK_PER_THREAD);
    # every pair runs on zeroed scratch arrays, so the split cannot change a value.
    graph = np.ascontiguousarray(attention_graph(causal_sink(4, 32, seed=9)).weights.double().numpy()[:, 0])
    sources = np.arange(32)
    assert sources.size * 32 * graph.size >= _WORK_PER_THREAD
    serial, serial_gaps = max_flows(graph, sources, 1)
    threaded, threaded_gaps = max_flows(graph, sources, 2)
    np.testing.assert_array_equal(threaded, serial)
    np.testing.assert_array_equal(threaded_gaps, serial_gaps)


def test_one_layer_is_the_mixed_attention_row():
    attentions = peaked(1, 7, seed=8)
    np.testing.assert_allclose(flow(attentions)[0].numpy(), attention_graph(attentions).weights[0, 0].numpy(), atol=1e-6)


def best_path_bottleneck(graph: np.ndarray, source: int) -> np.ndarray:
    """Widest single path from (l, source) to each (0, j): a max-min DP over the layers."""
    width = np.zeros(graph.shape[1])
    width[source] = np.inf
    for layer in graph[::-1]:
        width = np.max(np.minimum(width[:, None], layer), axis=0)
    return width


attention_stacks = st.tuples(
    st.integers(1, 4), st.integers(2, 7), st.integers(0, 2**16), st.sampled_from(["causal", "banded", "peaked"])
).map(lambda args: {"causal": causal_sink, "banded": banded, "peaked": peaked}[args[3]](args[0], args[1], seed=args[2]))


@settings(max_examples=25, deadline=None)
@given(attention_stacks)
def test_properties(attentions):
    n = attentions.shape[-1]
    graph = attention_graph(attentions).weights.double().numpy()[:, 0]
    values = flow(attentions)[0].double().numpy()
    assert (values <= 1 + 1e-6).all() and (values >= 0).all()
    assert (values <= trivial_bounds(attentions) + 1e-6).all()
    for source in range(n):
        assert (values[source] >= best_path_bottleneck(graph, source) - 1e-6).all()
    permutation = torch.randperm(n, generator=torch.Generator().manual_seed(n))
    permuted = flow(attentions[..., permutation, :][..., permutation])[0]
    np.testing.assert_allclose(permuted.numpy(), values[permutation][:, permutation], atol=1e-6)
    assert torch.equal(flow(attentions)[0], torch.from_numpy(values).float())


def test_layers_sources_and_normalize():
    attentions = causal_sink(4, 9, seed=6).repeat(1, 2, 1, 1, 1)
    every = flow(attentions, layer=None)
    assert every.shape == (4, 2, 9, 9)
    torch.testing.assert_close(flow(attentions, layer=2), every[1])
    torch.testing.assert_close(flow(attentions, layer=-1, sources=[3, -1]), every[-1][:, [3, 8]])
    torch.testing.assert_close(flow(attentions, sources=torch.tensor([[2], [5]])), every[-1][[0, 1], [2, 5]][:, None])
    torch.testing.assert_close(flow(attentions, sources=torch.tensor([2, 5])), every[-1][[0, 1], [2, 5]])  # (B,)
    normalized = flow(attentions, layer=None, sources=0, normalize=True)
    torch.testing.assert_close(normalized.sum(-1), torch.ones(4, 2))
    raw = every[:, :, 0]
    torch.testing.assert_close(normalized, raw / raw.sum(-1, keepdim=True))


def test_padding_is_removed_from_the_graph():
    attentions = banded(3, 8, width=3, seed=7).repeat(1, 2, 1, 1, 1)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :2] = 0
    mask[1, 6:] = 0
    padded = flow(attentions, attention_mask=mask)
    graph = attention_graph(attentions, attention_mask=mask).weights[:, 1, 2:6, 2:6].double().numpy()
    reference = [[networkx_flow(graph, s, t) for t in range(4)] for s in range(4)]
    np.testing.assert_allclose(padded[1][2:6, 2:6].numpy(), reference, atol=1e-6)
    assert (padded[1][:, :2] == 0).all() and (padded[1][:2] == 0).all() and (padded[1][6:] == 0).all()
    torch.testing.assert_close(padded[0], flow(attentions[:, :1])[0])


def test_causal_padding_on_either_side_gives_the_flows_of_the_prompt_alone():
    # A decoder's graph is packed as its lower triangles once padding is removed; padding on the
    # left (example 0) or the right (example 1) leaves the flows of the real tokens as they were.
    alone = causal_sink(4, 9, heads=2, seed=5)
    padded = torch.zeros(4, 2, 2, 12, 12)
    padded[:, 0, :, 3:, 3:] = alone[:, 0]
    padded[:, 1, :, :9, :9] = alone[:, 0]
    padded[:, 0, :, :3, :3] = torch.eye(3)  # what a model's padding rows hold does not matter
    mask = torch.zeros(2, 12, dtype=torch.long)
    mask[0, 3:] = 1
    mask[1, :9] = 1
    expected = flow(alone, layer=None)[:, 0]
    both = flow(padded, layer=None, attention_mask=mask)
    assert torch.equal(both[:, 0, 3:, 3:], expected) and torch.equal(both[:, 1, :9, :9], expected)
    assert (both[:, 0, :3] == 0).all() and (both[:, 0, :, :3] == 0).all() and (both[:, 1, 9:] == 0).all()


def test_a_streamed_graph_is_read_one_layer_at_a_time():
    # Flow asks a streamed graph for one (B, n, n) layer at a time, always into the same buffer,
    # and never for the (L, B, n, n) stack of them.
    attentions = causal_sink(3, 10, heads=2, seed=6).repeat(1, 2, 1, 1, 1)
    buffers = []

    def fused_layer(index, out):
        buffers.append(out.data_ptr())
        return out.copy_(attentions[index].mean(1))

    graph = AttentionGraph.streamed(fused_layer, 3, None, 2, 10, torch.device("cpu"), causal=True)
    graph.first_layers = None  # not called
    stored = AttentionGraph.from_fused(attentions.mean(2))  # the same layers, stored
    assert torch.equal(flow(graph, sources=9), flow(stored, sources=9))
    assert len(buffers) == 3 and len(set(buffers)) == 1 and graph.is_streamed


def test_causal_model_flow_reaches_what_rollout_reaches():
    attentions = CASES["gpt2 L=3 n=10"]
    graph = attention_graph(attentions).weights.double().numpy()[:, 0]
    values = flow(attentions, sources=9)[0, 0].double().numpy()
    assert (values >= best_path_bottleneck(graph, 9) - 1e-6).all()
    # In a causal model, token j only reaches later positions: flow from 9 is positive everywhere,
    # and its rollout row is positive exactly where the flow is.
    assert ((values > 0) == (rollout_rows(attentions, position=9)[0].numpy() > 0)).all()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(sources=8), ValueError, "out of range"),
        (dict(sources=[]), ValueError, "empty"),
        (dict(sources=1.5), TypeError, "sources"),
        (dict(sources=torch.zeros(3, 1, dtype=torch.long)), ValueError, "one per example"),
        (dict(layer=0), ValueError, "layer"),
        (dict(residual_alpha=2.0), ValueError, "residual_alpha"),
        (dict(head_fusion="sum"), ValueError, "head_fusion"),
        (dict(attention_mask=torch.ones(2, 7)), ValueError, "attention_mask"),
    ],
)
def test_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        flow(causal_sink(2, 8).repeat(1, 2, 1, 1, 1), **kwargs)


def test_source_on_padding_is_an_error():
    mask = torch.tensor([[1, 1, 1, 0]])
    with pytest.raises(ValueError, match="padding"):
        flow(causal_sink(2, 4), sources=3, attention_mask=mask)
