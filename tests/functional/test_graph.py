import gc
import weakref

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from captum_attnflow.functional import AttentionGraph, add_residual, attention_graph, fuse_heads


def softmax_attentions(*shape, seed=0):
    return torch.softmax(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2, -1)


def reference_graph(attentions, alpha, fusion, mask):
    """The graph of section 3 in float64 numpy, one matrix at a time."""
    attentions = attentions.double().numpy()
    mask = np.ones(attentions.shape[1:2] + attentions.shape[-1:], bool) if mask is None else mask.bool().numpy()
    graph = np.zeros(attentions.shape[:2] + attentions.shape[-2:])
    reduce = {"mean": np.mean, "max": np.max, "min": np.min}[fusion]
    for layer in range(attentions.shape[0]):
        for example in range(attentions.shape[1]):
            real = mask[example]
            weights = reduce(attentions[layer, example], axis=0)[np.ix_(real, real)]
            mixed = alpha * weights + (1 - alpha) * np.eye(real.sum())
            sums = mixed.sum(1, keepdims=True)
            graph[layer, example][np.ix_(real, real)] = mixed / np.where(sums > 0, sums, 1)
    return torch.from_numpy(graph).float()


# The graph's options and the data's seed, drawn alike by every property test of the graph.
GRAPH_OPTIONS = dict(
    alpha=st.sampled_from([0.0, 0.3, 0.5, 1.0]),
    fusion=st.sampled_from(["mean", "max", "min"]),
    padded=st.booleans(),
    seed=st.integers(0, 2**16),
)


def right_padding_mask(batch, n, generator):
    """(B, n) long mask of random lengths 1..n, padding on the right."""
    lengths = torch.randint(1, n + 1, (batch,), generator=generator)
    return (torch.arange(n)[None] < lengths[:, None]).long()


def test_fuse_heads_by_hand():
    heads = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]])  # (H=2, 2, 2)
    torch.testing.assert_close(fuse_heads(heads, "mean"), torch.full((2, 2), 0.5))
    torch.testing.assert_close(fuse_heads(heads, "max"), torch.ones(2, 2))
    torch.testing.assert_close(fuse_heads(heads, "min"), torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"head_fusion must be one of \('mean', 'max', 'min'\), got 'sum'"):
        fuse_heads(heads, "sum")


def test_add_residual_by_hand():
    weights = torch.tensor([[0.5, 0.5], [0.0, 0.0]])
    # row 0: 0.5 * [0.5, 0.5] + 0.5 * [1, 0] = [0.75, 0.25]; row 1 (all zero) becomes the identity row
    torch.testing.assert_close(add_residual(weights, 0.5), torch.tensor([[0.75, 0.25], [0.0, 1.0]]))
    torch.testing.assert_close(add_residual(weights, 1.0), weights)
    torch.testing.assert_close(add_residual(weights, 0.0), torch.eye(2))
    with pytest.raises(ValueError, match="residual_alpha must lie in"):
        add_residual(weights, 2.0)


@pytest.mark.parametrize("differentiable", [False, True], ids=["compiled", "torch"])
def test_attention_graph_by_hand(differentiable):
    heads = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]])[None, None]  # (L=1, B=1, 2, 2, 2)
    heads.requires_grad_(differentiable)
    # mean [[.5, .5], [.5, .5]] -> .5 * mean + .5 * I = [[.75, .25], [.25, .75]]
    expected = {"mean": [[0.75, 0.25], [0.25, 0.75]], "max": [[2 / 3, 1 / 3], [1 / 3, 2 / 3]], "min": [[1.0, 0.0], [0.0, 1.0]]}
    for fusion, matrix in expected.items():
        graph = attention_graph(heads, 0.5, fusion).weights
        torch.testing.assert_close(graph.detach(), torch.tensor(matrix)[None, None])


@pytest.mark.parametrize("differentiable", [False, True], ids=["compiled", "torch"])
def test_attention_graph_removes_padding_by_hand(differentiable):
    weights = torch.tensor([[0.5, 0.25, 0.25], [0.2, 0.2, 0.6], [0.0, 0.0, 1.0]])
    attentions = weights[None, None, None].requires_grad_(differentiable)  # (L=1, B=1, H=1, 3, 3)
    graph = attention_graph(attentions, 0.5, "mean", attention_mask=torch.tensor([[1, 1, 0]])).weights
    # row 0 without key 2: [.5, .25] -> .5 * [.5, .25] + .5 * [1, 0] = [.75, .125], renormalised by .875
    expected = torch.tensor([[6 / 7, 1 / 7, 0.0], [0.1 / 0.7, 0.6 / 0.7, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(graph.detach()[0, 0], expected)


@settings(max_examples=40, deadline=None)
@given(
    layers=st.integers(1, 3),
    batch=st.integers(1, 3),
    heads=st.integers(1, 4),
    n=st.integers(1, 9),
    **GRAPH_OPTIONS,
)
def test_attention_graph_matches_numpy_reference(layers, batch, heads, n, alpha, fusion, padded, seed):
    attentions = softmax_attentions(layers, batch, heads, n, n, seed=seed)
    mask = right_padding_mask(batch, n, torch.Generator().manual_seed(seed)) if padded else None
    expected = reference_graph(attentions, alpha, fusion, mask)
    compiled = attention_graph(attentions, alpha, fusion, mask).weights
    differentiable = attention_graph(attentions.clone().requires_grad_(), alpha, fusion, mask).weights
    torch.testing.assert_close(compiled, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(differentiable.detach(), expected, atol=1e-6, rtol=1e-5)
    real = torch.ones(batch, n) if mask is None else mask.float()
    assert (compiled >= 0).all()
    if alpha < 1 or fusion != "min":  # min over heads with alpha=1 can leave a row empty
        torch.testing.assert_close(compiled.sum(-1), real.expand_as(compiled.sum(-1)))
    padding = real[None, :, :, None] * real[None, :, None, :] == 0
    assert (compiled[padding.expand_as(compiled)] == 0).all()


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 3),
    n=st.integers(1, 8),
    count=st.integers(1, 4),
    **GRAPH_OPTIONS,
)
def test_streamed_graph_layers_and_rows_match_numpy_reference(batch, n, count, alpha, fusion, padded, seed):
    attentions = softmax_attentions(2, batch, 3, n, n, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    mask = right_padding_mask(batch, n, generator) if padded else None
    expected = reference_graph(attentions, alpha, fusion, mask)
    fused = fuse_heads(attentions, fusion)  # (L, B, n, n)
    asked = []

    def fused_rows(index, rows):
        asked.append(rows)
        return fused[index][torch.arange(batch)[:, None], rows]

    graph = AttentionGraph.streamed(lambda index, out: fused[index].clone(), 2, mask, batch, n, torch.device("cpu"),
                                    alpha, fusion, fused_rows=fused_rows)
    positions = torch.randint(0, n, (batch, count), generator=generator)  # repeats and padding included
    for index in range(2):
        rows = graph.rows(index, positions)
        torch.testing.assert_close(rows, expected[index][torch.arange(batch)[:, None], positions], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(graph.layer(index), expected[index], atol=1e-6, rtol=1e-5)
        out = torch.full((batch, n, n), float("nan"))
        assert graph.layer(index, out=out) is out
        torch.testing.assert_close(out, expected[index], atol=1e-6, rtol=1e-5)
    assert len(asked) == 2 and graph.is_streamed  # rows computed on their own, no layer stored


def test_attention_graph_is_differentiable_for_tensors_that_need_gradients():
    attentions = softmax_attentions(2, 1, 2, 4, 4).requires_grad_()
    attention_graph(attentions).weights[1, 0, 0, 0].backward()
    assert attentions.grad is not None and attentions.grad.abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_attention_graph_computes_in_float32(dtype):
    attentions = softmax_attentions(2, 2, 3, 5, 5)
    graph = attention_graph(tuple(attentions.to(dtype))).weights
    assert graph.dtype == torch.float32
    torch.testing.assert_close(graph, attention_graph(attentions).weights, atol=1e-2, rtol=0)


@pytest.mark.parametrize(
    ("value", "match"), [(float("nan"), "NaN"), (-0.5, "nonnegative"), (0.5, "sum to 1")]
)
@pytest.mark.parametrize("differentiable", [False, True], ids=["compiled", "torch"])
def test_attention_graph_rejects_bad_rows_of_real_tokens_only(value, match, differentiable):
    attentions = softmax_attentions(2, 2, 3, 5, 5)
    attentions[1, 1, 2, 3, 0] += value
    with pytest.raises(ValueError, match=match):
        attention_graph(attentions.requires_grad_(differentiable))
    mask = torch.ones(2, 5)
    mask[1, 3:] = 0
    attention_graph(attentions, attention_mask=mask)


def test_attention_graph_rejects_bad_arguments():
    attentions = softmax_attentions(2, 1, 2, 4, 4)
    with pytest.raises(ValueError, match="head_fusion must be one of"):
        attention_graph(attentions, head_fusion="median")
    with pytest.raises(ValueError, match="residual_alpha must lie in"):
        attention_graph(attentions, residual_alpha=-1)
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        attention_graph(attentions, attention_mask=torch.ones(1, 5))


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 3),
    n=st.integers(1, 8),
    count=st.integers(1, 3),
    block=st.integers(1, 8),
    causal=st.booleans(),
    **GRAPH_OPTIONS,
)
def test_propagate_block_by_block_equals_the_explicit_product(
    batch, n, count, block, alpha, fusion, padded, causal, seed
):
    """v A_l with the residual mixed in implicitly, from blocks of rows (causal blocks narrower)."""
    generator = torch.Generator().manual_seed(seed)
    attentions = softmax_attentions(1, batch, 3, n, n, seed=seed)
    if causal:
        attentions = attentions.tril()
        attentions = attentions / attentions.sum(-1, keepdim=True)
    mask = right_padding_mask(batch, n, generator) if padded else None
    expected_layer = reference_graph(attentions, alpha, fusion, mask)[0].double()
    fused = fuse_heads(attentions, fusion)[0]  # (B, n, n)

    def fused_blocks(index):
        for start in range(0, n, block):
            stop = min(n, start + block)
            width = stop if causal else n
            yield start, stop, fused[:, start:stop, :width].clone()

    graph = AttentionGraph.streamed(lambda index, out: fused.clone(), 1, mask, batch, n, torch.device("cpu"),
                                    alpha, fusion, fused_blocks=fused_blocks)
    rows = torch.rand(batch, count, n, generator=generator)
    assert graph.is_blockwise
    torch.testing.assert_close(graph.propagate(0, rows).double(), rows.double() @ expected_layer, atol=1e-6, rtol=1e-5)
    assert graph.is_streamed


def test_a_streamed_graph_lets_go_of_its_source_once_all_layers_are_built():
    attentions = softmax_attentions(2, 1, 3, 4, 4)

    class Source:  # stands for a lean capture holding every layer's queries and keys
        def __call__(self, index, out):
            return fuse_heads(attentions[index])

    source = Source()
    alive = weakref.ref(source)
    graph = AttentionGraph.streamed(source, 2, None, 1, 4, torch.device("cpu"))
    del source
    torch.testing.assert_close(graph.first_layers(1), attention_graph(attentions).weights[:1])
    assert alive() is not None and graph.is_streamed  # still needed while layers are computed on demand
    torch.testing.assert_close(graph.weights, attention_graph(attentions).weights)
    gc.collect()
    assert alive() is None and not graph.is_streamed
    torch.testing.assert_close(graph.layer(1), attention_graph(attentions).weights[1])


def test_walking_a_large_streamed_graph_shows_a_progress_bar(capfd):
    def never(index, out):
        raise AssertionError("walk computes no layer")

    large = AttentionGraph.streamed(never, 7, None, 1, 4000, torch.device("cpu"))  # 7 x 4000^2 = 1.1e8 numbers
    small = AttentionGraph.streamed(never, 7, None, 1, 3000, torch.device("cpu"))
    assert list(large.walk(range(7), "layers")) == list(range(7))
    assert "layers" in capfd.readouterr().err
    assert list(small.walk(range(6, -1, -1), "layers")) == list(range(6, -1, -1))
    assert "layers" not in capfd.readouterr().err
    list(small.walk(range(7), "layers", show_progress=True))
    assert "layers" in capfd.readouterr().err
