import pytest
import torch

from captum_attnflow.functional.checks import (
    as_mask,
    attention_layers,
    check_attention_values,
    check_residual_alpha,
    layer_indices,
    default_position,
    positions,
    stack_attentions,
)


def softmax_attentions(*shape, seed=0):
    return torch.softmax(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), -1)


def test_attention_layers_accepts_tuple_list_and_stacked_tensor_without_copying():
    stacked = softmax_attentions(3, 2, 4, 5, 5)
    layers = tuple(stacked)
    for attentions in (layers, list(layers), stacked):
        out = attention_layers(attentions)
        assert len(out) == 3
        assert all(a.data_ptr() == b.data_ptr() for a, b in zip(out, layers))


def test_stack_attentions_is_float32_of_shape_l_b_h_n_n():
    layers = tuple(softmax_attentions(2, 1, 3, 4, 4).to(torch.bfloat16))
    stacked = stack_attentions(layers)
    assert stacked.shape == (2, 1, 3, 4, 4) and stacked.dtype == torch.float32
    torch.testing.assert_close(stacked, torch.stack(layers).float())


@pytest.mark.parametrize(
    ("attentions", "error", "match"),
    [
        (torch.rand(2, 3, 4, 4), ValueError, r"shape \(L, B, H, n, n\)"),
        ("attentions", TypeError, "sequence of L tensors"),
        ((), ValueError, "returned no attention maps"),
        ((torch.rand(1, 2, 4, 4), torch.rand(2, 4, 4)), ValueError, r"attentions\[1\] must be a tensor of shape"),
        ((torch.rand(1, 2, 4, 4), torch.rand(1, 2, 5, 5)), ValueError, "same shape"),
        ((torch.rand(1, 2, 4, 3),), ValueError, "must be square"),
        ((torch.rand(1, 2, 0, 0),), ValueError, "empty sequence"),
        ((torch.rand(0, 2, 4, 4),), ValueError, "at least one example and one head"),
        ((torch.ones(1, 2, 4, 4, dtype=torch.long),), TypeError, "floating point"),
    ],
)
def test_attention_layers_rejects_bad_shapes_and_types(attentions, error, match):
    with pytest.raises(error, match=match):
        attention_layers(attentions)


def test_check_attention_values_accepts_softmax_rows():
    check_attention_values(softmax_attentions(2, 3, 6, 6), torch.ones(2, 6, dtype=torch.bool))


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (float("nan"), "NaN or infinite"),
        (float("inf"), "NaN or infinite"),
        (-0.3, "must be nonnegative"),
        (0.9, "must sum to 1"),
    ],
)
def test_check_attention_values_names_the_problem(value, match):
    attentions = softmax_attentions(2, 3, 6, 6)
    attentions[1, 2, 4, 1] += value
    with pytest.raises(ValueError, match=match):
        check_attention_values(attentions, torch.ones(2, 6, dtype=torch.bool))


def test_check_attention_values_ignores_rows_of_padding_queries():
    attentions = softmax_attentions(2, 3, 6, 6)
    attentions[1, :, 4:] = float("nan")  # models fill padding rows with anything
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False
    check_attention_values(attentions, mask)
    with pytest.raises(ValueError, match="NaN"):
        check_attention_values(attentions, torch.ones(2, 6, dtype=torch.bool))


def test_as_mask():
    assert as_mask(None, 2, 3, torch.device("cpu")).all()
    mask = as_mask([[1, 1, 0], [1, 0, 0]], 2, 3, torch.device("cpu"))
    assert mask.dtype == torch.bool and mask.tolist() == [[True, True, False], [True, False, False]]
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(B, n\) = \(2, 3\)"):
        as_mask(torch.ones(2, 4), 2, 3, torch.device("cpu"))
    with pytest.raises(ValueError, match=r"examples \[1\] are all padding"):
        as_mask(torch.tensor([[1, 1, 0], [0, 0, 0]]), 2, 3, torch.device("cpu"))


def test_layer_indices():
    assert layer_indices(None, 4) == [0, 1, 2, 3]
    assert layer_indices(1, 4) == [0]
    assert layer_indices(4, 4) == [3]
    assert layer_indices(-1, 4) == [3]
    assert layer_indices(-4, 4) == [0]
    for bad in (0, 5, -5):
        with pytest.raises(ValueError, match=f"layer={bad} is out of range for a model with L=4 layers"):
            layer_indices(bad, 4)
    for bad in (1.0, True, "1"):
        with pytest.raises(TypeError, match="layer must be an int"):
            layer_indices(bad, 4)


def test_positions_one_meaning_for_every_form():
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)

    def check(position, expected, has_axis):
        indices, axis = positions(position, mask)
        assert indices.tolist() == expected and axis == has_axis and indices.dtype == torch.long

    check(0, [[0], [0]], False)  # an int: every example, no position axis
    check(-3, [[1], [1]], False)
    check(torch.tensor(1), [[1], [1]], False)
    check(torch.tensor([3, 1]), [[3], [1]], False)  # (B,): one per example
    check([0, 1], [[0, 1], [0, 1]], True)  # a list: the same S positions everywhere
    check(torch.tensor([[0, 3], [1, 0]]), [[0, 3], [1, 0]], True)  # (B, S)
    with pytest.raises(ValueError, match=r"out of range for sequences of n=4"):
        positions(4, mask)
    with pytest.raises(ValueError, match=r"out of range for sequences of n=4"):
        positions(-5, mask)
    with pytest.raises(ValueError, match=r"padding token in examples \[1\]"):
        positions(-1, mask)
    with pytest.raises(ValueError, match=r"padding token in examples \[1\]"):
        positions([0, 3], mask)
    with pytest.raises(ValueError, match=r"\(B,\) = \(2,\), one per example"):
        positions(torch.tensor([0, 1, 2]), mask)
    with pytest.raises(ValueError, match="empty list"):
        positions([], mask)
    for bad in (torch.tensor([0.0, 1.0]), torch.tensor([True, False])):
        with pytest.raises(TypeError, match="integer token indices"):
            positions(bad, mask)
    for bad in (0.5, True, "0", [0.0, 1.0]):
        with pytest.raises(TypeError, match="position|positions"):
            positions(bad, mask)


def test_default_position_is_cls_or_last_real_token():
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 1, 1]], dtype=torch.bool)
    assert default_position(mask, causal=False).tolist() == [0, 0, 0]
    assert default_position(mask, causal=True).tolist() == [3, 1, 3]


def test_mask_values_other_than_zero_and_one_are_refused():
    for bad in (torch.tensor([[1, 2, 1]]), torch.tensor([[1.0, 0.5, 1.0]]), torch.tensor([[1, -1, 0]])):
        with pytest.raises(ValueError, match="only 0 \\(padding\\) and 1"):
            as_mask(bad, 1, 3, torch.device("cpu"))
    assert as_mask(torch.tensor([[1.0, 1.0, 0.0]]), 1, 3, torch.device("cpu")).tolist() == [[True, True, False]]
    assert as_mask(torch.tensor([[True, False, True]]), 1, 3, torch.device("cpu")).tolist() == [[True, False, True]]


def test_check_residual_alpha():
    for alpha in (0, 0.5, 1):
        check_residual_alpha(alpha)
    for alpha in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"residual_alpha must lie in \[0, 1\]"):
            check_residual_alpha(alpha)
    for alpha in (None, "0.5", True):
        with pytest.raises(TypeError, match="residual_alpha must be a number"):
            check_residual_alpha(alpha)
