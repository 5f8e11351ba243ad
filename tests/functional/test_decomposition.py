"""The decomposition maths on hand-built layers: ALTI against explicit loops (both code paths),
the norms of the weighted values, value zeroing's contexts and distances."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from captum_attnflow.functional import decomposition
from captum_attnflow.functional.decomposition import (
    alti_contributions,
    attention_norms,
    cosine_distances,
    normalised_rows,
    projected_values,
    zeroed_attention_outputs,
)


def _layer(seed: int, batch: int = 2, heads: int = 3, n: int = 5, size: int = 4, width: int = 6):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, heads, n, n, generator=generator, dtype=torch.float64)
    return (
        torch.softmax(scores, -1),
        torch.randn(batch, heads, n, size, generator=generator, dtype=torch.float64),
        torch.randn(batch, n, width, generator=generator, dtype=torch.float64),
        torch.randn(heads * size, width, generator=generator, dtype=torch.float64),
        torch.randn(width, generator=generator, dtype=torch.float64),
    )


def _alti_loops(probabilities, values, inputs, weight, bias, mask, norm):
    """ALTI written out per (i, j), float64, from the paper's definition."""
    batch, heads, n, size = values.shape
    result = torch.zeros(batch, n, n, dtype=torch.float64)
    for b in range(batch):
        vectors = torch.zeros(n, n, inputs.shape[-1], dtype=torch.float64)
        for i in range(n):
            for j in range(n):
                for h in range(heads):
                    vectors[i, j] += probabilities[b, h, i, j] * values[b, h, j] @ weight[h * size : (h + 1) * size]
                if i == j:
                    vectors[i, j] += inputs[b, i]
        pre = vectors.sum(1) + bias
        if norm is None:
            outputs = pre
        else:
            gamma, beta, eps = norm
            sigma = (pre.var(-1, unbiased=False, keepdim=True) + eps).sqrt()
            outputs = (pre - pre.mean(-1, keepdim=True)) / sigma * gamma + beta
            vectors = (vectors - vectors.mean(-1, keepdim=True)) * gamma / sigma[:, None]
        for i in range(n):
            if not mask[b, i]:
                continue
            for j in range(n):
                if mask[b, j]:
                    gain = outputs[i].abs().sum() - (outputs[i] - vectors[i, j]).abs().sum()
                    result[b, i, j] = max(0.0, float(gain))
            if result[b, i].sum() == 0:  # nothing brings y_i closer: the token keeps itself (documented)
                result[b, i, i] = 1.0
            result[b, i] /= result[b, i].sum()
    return result


def test_alti_matches_explicit_loops_pre_and_post_norm_on_both_code_paths():
    probabilities, values, inputs, weight, bias = _layer(0)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    probabilities = probabilities * mask[:, None, None, :]
    probabilities = probabilities / probabilities.sum(-1, keepdim=True)
    generator = torch.Generator().manual_seed(1)  # not the global generator: other tests move it
    norm = (torch.rand(6, generator=generator, dtype=torch.float64) + 0.5,
            torch.randn(6, generator=generator, dtype=torch.float64), 1e-5)
    for layer_norm in (None, norm):
        expected = _alti_loops(probabilities, values, inputs, weight, bias, mask, layer_norm)
        compiled = alti_contributions(
            probabilities.float(), values.float(), inputs.float(), weight.float(), bias.float(), mask,
            None if layer_norm is None else (layer_norm[0].float(), layer_norm[1].float(), 1e-5),
        )
        assert torch.allclose(compiled.double(), expected, atol=2e-6)
        tracked = probabilities.float().requires_grad_()  # autograd: the torch-ops path
        plain = alti_contributions(
            tracked, values.float(), inputs.float(), weight.float(), bias.float(), mask,
            None if layer_norm is None else (layer_norm[0].float(), layer_norm[1].float(), 1e-5),
        )
        assert torch.allclose(plain.detach(), compiled, atol=2e-6)


def _distance_loops(probabilities, projected, inputs, outputs, scale):
    """(B, n, n) float64 :math:`\\lVert y_i - T_i(x_j) \\rVert_1` per (i, j), +inf where i != j and
    no head attends; ``scale`` (B, n, D) is the linearised LayerNorm's, or None."""
    batch, heads, n, _ = projected.shape
    result = torch.empty(batch, n, n, dtype=torch.float64)
    for b in range(batch):
        for i in range(n):
            for j in range(n):
                if i != j and not bool(probabilities[b, :, i, j].ne(0).any()):
                    result[b, i, j] = float("inf")
                    continue
                vector = sum(probabilities[b, h, i, j] * projected[b, h, j] for h in range(heads))
                if i == j:
                    vector = vector + inputs[b, i]
                if scale is not None:
                    vector = (vector - vector.mean()) * scale[b, i]
                result[b, i, j] = (outputs[b, i] - vector).abs().sum()
    return result


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 19), heads=st.integers(1, 6), causal=st.booleans(), post_norm=st.booleans())
def test_compiled_distances_match_explicit_loops_for_any_head_count_and_length(seed, n, heads, causal, post_norm):
    # The kernel takes heads four at a time and rows two at a time in tasks of 16 rows: head
    # counts that are not a multiple of 4, odd lengths and lengths past one task, causal or not.
    # Its distances are compared, not the contributions: ||y_i||_1 - ||y_i - T_i(x_j)||_1
    # cancels, so float32 contributions differ from float64 ones by more than the kernel's error.
    probabilities, values, inputs, weight, _ = _layer(seed, batch=1, heads=heads, n=n, width=9)
    if causal:
        probabilities = probabilities * torch.ones(n, n, dtype=torch.float64).tril()
        probabilities = probabilities / probabilities.sum(-1, keepdim=True)
    generator = torch.Generator().manual_seed(seed)
    projected = projected_values(values, weight).double()
    outputs = torch.randn(1, n, 9, generator=generator, dtype=torch.float64)
    scale = torch.rand(1, n, 9, generator=generator, dtype=torch.float64) + 0.5 if post_norm else None
    expected = _distance_loops(probabilities, projected, inputs, outputs, scale)
    compiled = decomposition._compiled_distances(
        probabilities.float(), projected.float(), inputs.float(), outputs.float(), None if scale is None else scale.float()
    ).double()
    finite = torch.isfinite(expected)
    assert torch.equal(torch.isfinite(compiled), finite)
    assert torch.allclose(compiled[finite], expected[finite], rtol=1e-5, atol=1e-5)
    if causal:  # masked pairs are exactly 0 in the contributions
        contributions = alti_contributions(
            probabilities.float(), values.float(), inputs.float(), weight.float(), None, torch.ones(1, n, dtype=torch.bool)
        )
        assert bool((contributions.triu(1) == 0).all())


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 7), heads=st.integers(1, 4))
def test_alti_rows_are_a_distribution_over_real_tokens(seed, n, heads):
    probabilities, values, inputs, weight, bias = _layer(seed, heads=heads, n=n)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, n // 2 + 1 :] = False
    probabilities = probabilities * mask[:, None, None, :]
    probabilities = probabilities / probabilities.sum(-1, keepdim=True)
    result = alti_contributions(probabilities.float(), values.float(), inputs.float(), weight.float(), bias.float(), mask)
    assert bool((result >= 0).all())
    assert torch.allclose(result.sum(-1), mask.float(), atol=1e-5)
    assert bool((result[~mask] == 0).all()) and bool((result.transpose(1, 2)[~mask] == 0).all())


def test_attention_norms_are_the_length_of_each_tokens_share():
    probabilities, values, _, weight, _ = _layer(1)
    mask = torch.ones(2, 5, dtype=torch.bool)
    norms = attention_norms(probabilities, values, weight, mask)
    vector = sum(probabilities[1, h, 3, 0] * values[1, h, 0] @ weight[4 * h : 4 * h + 4] for h in range(3))
    assert torch.allclose(norms[1, 3, 0].double(), vector.norm())


def test_zeroed_outputs_equal_attention_over_zeroed_values():
    probabilities, values, _, weight, bias = _layer(2)

    def attention_output(values):
        return (probabilities @ values).transpose(1, 2).reshape(2, 5, 12) @ weight + bias

    outputs = attention_output(values)
    zeroed = zeroed_attention_outputs(probabilities, projected_values(values, weight), outputs, torch.tensor([1, 4]))
    for slot, token in enumerate([1, 4]):
        without = values.clone()
        without[:, :, token] = 0
        assert torch.allclose(zeroed[:, slot].double(), attention_output(without), atol=1e-5)


def test_cosine_distances_and_row_normalisation():
    outputs = torch.randn(1, 3, 8, dtype=torch.float64)
    zeroed = outputs[:, None].repeat(1, 2, 1, 1) + 1e-3 * torch.randn(1, 2, 3, 8, dtype=torch.float64)
    expected = 1 - torch.nn.functional.cosine_similarity(zeroed, outputs[:, None], dim=-1).transpose(1, 2)
    assert torch.allclose(cosine_distances(zeroed, outputs).double(), expected, atol=1e-9)
    scores = torch.tensor([[[1.0, 3.0], [0.0, 0.0]]])
    rows = normalised_rows(scores, torch.tensor([[True, True]]))
    assert torch.equal(rows, torch.tensor([[[0.25, 0.75], [0.0, 1.0]]]))  # an empty row keeps its token


def _in_blocks(probabilities: torch.Tensor, rows: int) -> list[tuple[int, torch.Tensor]]:
    return [(start, probabilities[:, :, start : start + rows]) for start in range(0, probabilities.shape[2], rows)]


@given(seed=st.integers(0, 100), rows=st.integers(1, 7), causal=st.booleans())
@settings(max_examples=25, deadline=None)
def test_alti_and_norms_of_row_blocks_equal_those_of_the_whole_map(seed, rows, causal):
    """Fed block by block (as a lean capture recomputes them), every path gives the whole map's
    result: the compiled kernel (pre- and post-LN), the torch blocks of a scaled attention output
    and the norms."""
    probabilities, values, inputs, weight, bias = (t.float() for t in _layer(seed, n=7))
    generator = torch.Generator().manual_seed(seed)
    if causal:
        scores = torch.randn(2, 3, 7, 7, generator=generator)
        probabilities = torch.softmax(scores.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf")), -1)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 5:] = False
    norm = (torch.rand(6, generator=generator) + 0.5, torch.randn(6, generator=generator), 1e-5)
    scale = torch.rand(2, 7, 6, generator=generator) + 0.5
    for kwargs in ({}, {"norm": norm}, {"attention_scale": scale}):
        whole = alti_contributions(probabilities, values, inputs, weight, bias, mask, **kwargs)
        blocks = alti_contributions(_in_blocks(probabilities, rows), values, inputs, weight, bias, mask, **kwargs)
        # The attention output of a block of rows is another product shape, rounded otherwise in
        # float32; a contribution, a difference of nearly equal L1 norms of random vectors here,
        # shows that rounding at up to 1e-5 (1e-6 on the models' layers: tests/capture/test_decomposition.py).
        torch.testing.assert_close(blocks, whole, atol=1e-5, rtol=0)
    whole = attention_norms(probabilities, values, weight, mask)
    torch.testing.assert_close(attention_norms(_in_blocks(probabilities, rows), values, weight, mask), whole, atol=1e-6, rtol=1e-5)


def test_rows_of_a_block_are_normalised_as_rows_of_the_whole():
    scores, mask = torch.rand(2, 6, 6), torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    scores[0, 3] = 0.0  # a real row with nothing left keeps its own token
    whole = normalised_rows(scores, mask)
    torch.testing.assert_close(torch.cat([normalised_rows(scores[:, s : s + 4], mask, s) for s in (0, 4)], 1), whole)
    assert whole[0, 3, 3] == 1.0


def _cross_loops(probabilities, values, inputs, weight, bias, query_mask, key_mask, norm):
    """ALTI+'s cross-attention contributions written out per (t, j), float64: the encoder outputs'
    vectors, then the residual's, each position's distances to its block output."""
    batch, heads, m, n = probabilities.shape
    size = values.shape[-1]
    result = torch.zeros(batch, m, n + 1, dtype=torch.float64)
    for b in range(batch):
        for t in range(m):
            if not query_mask[b, t]:
                continue
            vectors = torch.zeros(n + 1, inputs.shape[-1], dtype=torch.float64)
            for j in range(n):
                for h in range(heads):
                    vectors[j] += probabilities[b, h, t, j] * values[b, h, j] @ weight[h * size : (h + 1) * size]
            vectors[n] = inputs[b, t]
            pre = vectors.sum(0) + bias
            if norm is None:
                output = pre
            else:
                gamma, beta, eps = norm
                sigma = (pre.var(unbiased=False) + eps).sqrt()
                output = (pre - pre.mean()) / sigma * gamma + beta
                vectors = (vectors - vectors.mean(-1, keepdim=True)) * gamma / sigma
            for j in range(n + 1):
                if j == n or key_mask[b, j]:
                    gain = output.abs().sum() - (output - vectors[j]).abs().sum()
                    result[b, t, j] = max(0.0, float(gain))
            if result[b, t].sum() == 0:  # nothing brings y_t closer: the residual keeps it (documented)
                result[b, t, n] = 1.0
            result[b, t] /= result[b, t].sum()
    return result


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), post_ln=st.booleans())
def test_cross_attention_contributions_follow_the_definition(seed, post_ln):
    """Three decoder queries over five encoder keys, the second example's last two keys padding
    (probability 0) and its last query padding."""
    generator = torch.Generator().manual_seed(seed)
    batch, heads, m, n, size, width = 2, 3, 3, 5, 4, 6
    scores = torch.randn(batch, heads, m, n, generator=generator, dtype=torch.float64)
    key_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]).bool()
    query_mask = torch.tensor([[1, 1, 1], [1, 1, 0]]).bool()
    probabilities = torch.softmax(scores.masked_fill(~key_mask[:, None, None], -torch.inf), -1)
    values = torch.randn(batch, heads, n, size, generator=generator, dtype=torch.float64)
    inputs = torch.randn(batch, m, width, generator=generator, dtype=torch.float64)
    weight = torch.randn(heads * size, width, generator=generator, dtype=torch.float64)
    bias = torch.randn(width, generator=generator, dtype=torch.float64)
    norm = (1 + torch.rand(width, generator=generator, dtype=torch.float64), torch.randn(width, generator=generator,
            dtype=torch.float64), 1e-5) if post_ln else None
    expected = _cross_loops(probabilities, values, inputs, weight, bias, query_mask, key_mask, norm)
    ours = decomposition.alti_cross_contributions(probabilities, values, inputs, weight, bias, query_mask, key_mask, norm)
    torch.testing.assert_close(ours.double(), expected, atol=1e-5, rtol=1e-4)
    blocks = [(0, probabilities[:, :, :2]), (2, probabilities[:, :, 2:])]  # rows block by block, as a lean capture gives them
    blocked = decomposition.alti_cross_contributions(blocks, values, inputs, weight, bias, query_mask, key_mask, norm)
    torch.testing.assert_close(blocked, ours)


def test_cross_attention_distances_in_torch_equal_the_kernels():
    """Under autograd the distances are torch operations: a key past the queries is no query's own token."""
    probabilities, values, inputs, weight, bias = _layer(3, n=4)
    cross = probabilities[:, :, :3]  # three queries over four keys
    projected = projected_values(values, weight)
    outputs = torch.randn(2, 3, weight.shape[1], dtype=torch.float64)
    kernel = decomposition._distances_where_they_are(cross.float(), projected.float(), inputs[:, :3].float(),
                                                     outputs.float(), None, None, 4)
    grad = decomposition._distances_where_they_are(cross.float().requires_grad_(), projected.float(),
                                                   inputs[:, :3].float(), outputs.float(), None, None, 4)
    torch.testing.assert_close(grad.detach(), kernel, atol=1e-5, rtol=1e-5)


def test_norms_of_a_cross_attention_are_over_its_keys():
    probabilities, values, _, weight, _ = _layer(4, n=5)
    cross = probabilities[:, :, :3]  # three queries over five keys
    query_mask = torch.tensor([[1, 1, 1], [1, 1, 0]]).bool()
    key_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]).bool()
    norms = attention_norms(cross, values, weight, query_mask, key_mask)
    size = values.shape[-1]
    for b, t, j in [(0, 2, 4), (1, 1, 3)]:
        vector = sum(cross[b, h, t, j] * values[b, h, j] @ weight[h * size : (h + 1) * size] for h in range(3))
        torch.testing.assert_close(norms[b, t, j].double(), vector.norm(), atol=1e-5, rtol=1e-5)
    assert norms.shape == (2, 3, 5) and norms[1, 2].abs().max() == 0 and norms[1, :, 4].abs().max() == 0
