import functools
import math

import networkx as nx
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from captum_attnflow.functional import rollout, rollout_rows


def softmax_attentions(*shape, seed=0):
    return torch.softmax(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2, -1)


def residual_mixed(attentions, alpha):
    """alpha * mean over heads + (1 - alpha) * I, rows renormalised, in float64 numpy: (L, B, n, n)."""
    weights = attentions.double().numpy().mean(2)
    mixed = alpha * weights + (1 - alpha) * np.eye(weights.shape[-1])
    return mixed / mixed.sum(-1, keepdims=True)


def path_sum_rollout(graph):
    """Rollout of one example as the sum over all paths of the product of their edge weights (networkx).

    ``graph`` is (L, n, n) with ``graph[l][i, j]`` the edge from position i after layer l+1 to
    position j before it; returns (L, n, n).
    """
    layers, n, _ = graph.shape
    dag = nx.DiGraph()
    for layer in range(layers):
        for i in range(n):
            for j in range(n):
                dag.add_edge((layer + 1, i), (layer, j), weight=graph[layer, i, j])
    maps = np.zeros((layers, n, n))
    for layer in range(layers):
        for p in range(n):
            for j in range(n):
                for path in nx.all_simple_paths(dag, (layer + 1, p), (0, j)):
                    maps[layer, p, j] += math.prod(dag.edges[a, b]["weight"] for a, b in zip(path, path[1:]))
    return maps


# Two layers, three tokens, one head; the paper's alpha = 0.5.
W1 = [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 0.5, 0.5]]
W2 = [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
# A1 = .5 W1 + .5 I = [[1, 0, 0], [1/4, 3/4, 0], [0, 1/4, 3/4]]
# A2 = .5 W2 + .5 I = [[1/2, 1/2, 0], [0, 1/2, 1/2], [1/2, 0, 1/2]]
A1 = [[1.0, 0.0, 0.0], [0.25, 0.75, 0.0], [0.0, 0.25, 0.75]]
# A2 @ A1, row by row: 1/2 (A1[0] + A1[1]), 1/2 (A1[1] + A1[2]), 1/2 (A1[0] + A1[2])
A2_A1 = [[5 / 8, 3 / 8, 0.0], [1 / 8, 1 / 2, 3 / 8], [1 / 2, 1 / 8, 3 / 8]]


def test_rollout_two_layers_three_tokens_by_hand():
    attentions = (torch.tensor(W1)[None, None], torch.tensor(W2)[None, None])  # L tensors (B=1, H=1, 3, 3)
    maps = rollout(attentions)
    assert maps.shape == (2, 1, 3, 3) and maps.dtype == torch.float32
    torch.testing.assert_close(maps[:, 0], torch.tensor([A1, A2_A1]))
    torch.testing.assert_close(rollout_rows(attentions, position=2, layer=2), torch.tensor([A2_A1[2]]))
    torch.testing.assert_close(rollout_rows(attentions, position=1, layer=None), torch.tensor([[A1[1]], [A2_A1[1]]]))


def test_rollout_of_a_padded_example_by_hand():
    # Token 2 is padding: what W1 and W2 give it must not count, the real rows are renormalised.
    attentions = (torch.tensor(W1)[None, None], torch.tensor(W2)[None, None])
    maps = rollout(attentions, attention_mask=torch.tensor([[1, 1, 0]]))
    # A1 over tokens {0, 1} is unchanged; A2 = renorm(.5 [[0, 1], [0, 0]] + .5 I) = [[1/2, 1/2], [0, 1]]
    expected_a2_a1 = [[5 / 8, 3 / 8, 0.0], [1 / 4, 3 / 4, 0.0], [0.0, 0.0, 0.0]]
    expected_a1 = [[1.0, 0.0, 0.0], [0.25, 0.75, 0.0], [0.0, 0.0, 0.0]]
    torch.testing.assert_close(maps[:, 0], torch.tensor([expected_a1, expected_a2_a1]))


def test_rollout_matches_networkx_path_sums():
    attentions = softmax_attentions(3, 2, 2, 4, 4, seed=3)
    maps = rollout(attentions, residual_alpha=0.5)
    graph = residual_mixed(attentions, 0.5)
    for example in range(2):
        expected = path_sum_rollout(graph[:, example])
        torch.testing.assert_close(maps[:, example].double(), torch.from_numpy(expected), atol=1e-6, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    layers=st.integers(1, 4),
    batch=st.integers(1, 3),
    heads=st.integers(1, 3),
    n=st.integers(1, 8),
    alpha=st.floats(0.0, 1.0),
    fusion=st.sampled_from(["mean", "max", "min"]),
    seed=st.integers(0, 2**16),
)
def test_rollout_properties(layers, batch, heads, n, alpha, fusion, seed):
    attentions = softmax_attentions(layers, batch, heads, n, n, seed=seed)
    maps = rollout(attentions, alpha, fusion)
    assert maps.shape == (layers, batch, n, n)
    assert (maps >= 0).all()
    if alpha < 1 or fusion != "min":  # min over heads with alpha=1 can leave a row empty
        torch.testing.assert_close(maps.sum(-1), torch.ones(layers, batch, n))
    if fusion == "mean":
        mixed = residual_mixed(attentions, alpha)
        torch.testing.assert_close(maps[0].double(), torch.from_numpy(mixed[0]), atol=1e-6, rtol=1e-5)  # L = 1
        for example in range(batch):
            product = functools.reduce(np.matmul, mixed[::-1, example])  # A_L ... A_1
            torch.testing.assert_close(maps[-1, example].double(), torch.from_numpy(product), atol=1e-6, rtol=1e-5)
    for layer in range(1, layers + 1):
        for position in range(n):
            torch.testing.assert_close(
                rollout_rows(attentions, position, layer, alpha, fusion), maps[layer - 1, :, position]
            )
    positions = torch.randint(0, n, (batch,), generator=torch.Generator().manual_seed(seed))
    rows = rollout_rows(attentions, positions, None, alpha, fusion)
    assert rows.shape == (layers, batch, n)
    torch.testing.assert_close(rows, maps[:, torch.arange(batch), positions])
    # tensors that need gradients take the torch ops instead of the compiled kernels
    differentiable = rollout_rows(attentions.clone().requires_grad_(), positions, None, alpha, fusion)
    torch.testing.assert_close(differentiable.detach(), rows)


def test_rollout_is_batch_invariant():
    attentions = softmax_attentions(3, 4, 2, 6, 6, seed=5)
    maps = rollout(attentions)
    rows = rollout_rows(attentions, torch.tensor([0, 5, 2, 3]), layer=None)
    for example in range(4):
        alone = attentions[:, example : example + 1]
        torch.testing.assert_close(maps[:, example : example + 1], rollout(alone), atol=1e-6, rtol=0)
        torch.testing.assert_close(
            rows[:, example : example + 1], rollout_rows(alone, int([0, 5, 2, 3][example]), None), atol=1e-6, rtol=0
        )


@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_never_influences_real_tokens(side):
    """Padding rows and columns filled with garbage attention give exactly 0, real tokens are unchanged."""
    real = softmax_attentions(2, 1, 3, 4, 4, seed=7)
    padded = softmax_attentions(2, 1, 3, 7, 7, seed=8)
    where = slice(0, 4) if side == "right" else slice(3, 7)
    # real queries give padding keys zero weight, as a masked softmax does
    padded[:, :, :, where] = 0
    padded[:, :, :, where, where] = real
    mask = torch.zeros(1, 7, dtype=torch.long)
    mask[:, where] = 1
    maps = rollout(padded, attention_mask=mask)
    torch.testing.assert_close(maps[:, :, where, where], rollout(real), atol=1e-6, rtol=0)
    assert (maps[:, :, mask[0] == 0] == 0).all() and (maps[..., mask[0] == 0] == 0).all()
    position = 0 if side == "right" else 3
    rows = rollout_rows(padded, position, None, attention_mask=mask)
    torch.testing.assert_close(rows[..., where], rollout_rows(real, 0, None), atol=1e-6, rtol=0)
    assert (rows[..., mask[0] == 0] == 0).all()


def test_rollout_rows_rejects_bad_positions_and_layers():
    attentions = softmax_attentions(2, 2, 2, 4, 4)
    with pytest.raises(ValueError, match="layer=3 is out of range for a model with L=2 layers"):
        rollout_rows(attentions, 0, 3)
    with pytest.raises(ValueError, match="position .* is out of range for sequences of n=4"):
        rollout_rows(attentions, 4)
    with pytest.raises(ValueError, match=r"padding token in examples \[1\]"):
        rollout_rows(attentions, 3, attention_mask=torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]))


def test_rollout_rejects_bad_attentions():
    with pytest.raises(ValueError, match=r"must have shape \(L, B, H, n, n\)"):
        rollout(torch.rand(2, 4, 4))
    with pytest.raises(ValueError, match="empty sequence"):
        rollout(torch.rand(2, 1, 2, 0, 0))
    with pytest.raises(ValueError, match="rows must sum to 1"):
        rollout(torch.rand(2, 1, 2, 4, 4) + 0.5)
    with pytest.raises(ValueError, match="nonnegative"):
        rollout(softmax_attentions(2, 1, 2, 4, 4) - softmax_attentions(2, 1, 2, 4, 4, seed=1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_rollout_on_cuda_equals_cpu():
    attentions = softmax_attentions(3, 2, 4, 9, 9, seed=2)
    mask = torch.ones(2, 9)
    mask[1, 6:] = 0
    maps = rollout(attentions.cuda(), attention_mask=mask.cuda())
    rows = rollout_rows(attentions.cuda(), torch.tensor([0, 5]).cuda(), None, attention_mask=mask.cuda())
    assert maps.device.type == "cuda" and rows.device.type == "cuda"
    torch.testing.assert_close(maps.cpu(), rollout(attentions, attention_mask=mask), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(
        rows.cpu(), rollout_rows(attentions, torch.tensor([0, 5]), None, attention_mask=mask), atol=1e-6, rtol=1e-5
    )
    with pytest.raises(ValueError, match="sum to 1"):
        rollout(attentions.cuda() * 2)
