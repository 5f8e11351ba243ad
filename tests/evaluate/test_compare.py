import math
import warnings

import numpy as np
import pytest
import scipy.stats
import torch

from captum_attnflow.evaluate import compare


def scipy_spearman(x, y, keep):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on constant input before returning NaN
        return np.array(
            [scipy.stats.spearmanr(a[m], b[m]).statistic if m.sum() >= 2 else math.nan for a, b, m in zip(x, y, keep)]
        )


def inputs(seed=0, layers=3, batch=5, n=7):
    generator = np.random.default_rng(seed)
    per_layer = generator.random((layers, batch, n))
    one_map = torch.from_numpy(generator.random((batch, n))).float()
    reference = generator.integers(0, 3, (batch, n)).astype(float)  # ties on purpose
    mask = np.ones((batch, n), dtype=int)
    mask[1, 4:] = 0
    mask[3, 2:] = 0
    special = np.zeros((batch, n), dtype=bool)
    special[:, 0] = True
    return per_layer, one_map, reference, mask, special


def test_compare_equals_scipy_per_layer_and_example():
    per_layer, one_map, reference, mask, special = inputs()
    result = compare({"rollout": per_layer, "saliency": one_map}, {"blank-out": reference}, mask=mask, exclude=special)
    keep = mask.astype(bool) & ~special
    assert list(result.scores) == [("rollout", "blank-out", 1), ("rollout", "blank-out", 2),
                                   ("rollout", "blank-out", 3), ("saliency", "blank-out", None)]
    for layer in range(3):
        np.testing.assert_allclose(
            result.scores[("rollout", "blank-out", layer + 1)],
            scipy_spearman(per_layer[layer], reference, keep),
            atol=1e-12, rtol=0, equal_nan=True,
        )
    np.testing.assert_allclose(
        result.scores[("saliency", "blank-out", None)],
        scipy_spearman(one_map.double().numpy(), reference, keep),
        atol=1e-12, rtol=0, equal_nan=True,
    )
    np.testing.assert_array_equal(result.example_ids, np.arange(5))


def test_padding_and_exclude_change_the_compared_tokens():
    x = torch.tensor([[9.0, 1.0, 2.0, 3.0, -7.0]])
    y = torch.tensor([[-9.0, 1.0, 2.0, 3.0, 8.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    cls = torch.tensor([[1, 0, 0, 0, 0]])
    # ranks x (5 2 3 4 1) vs y (1 2 3 4 5): 1 - 6 * 32 / 120; masked (4 1 2 3) vs (1 2 3 4): 1 - 6 * 12 / 60
    assert compare({"m": x}, {"r": y}).scores[("m", "r", None)][0] == pytest.approx(-0.6)
    assert compare({"m": x}, {"r": y}, mask=mask).scores[("m", "r", None)][0] == pytest.approx(-0.2)
    assert compare({"m": x}, {"r": y}, mask=mask, exclude=cls).scores[("m", "r", None)][0] == pytest.approx(1.0)


def test_every_reference_is_a_method_too_but_not_against_itself():
    _, one_map, reference, _, _ = inputs(seed=1)
    result = compare({"a": one_map, "blank-out": reference}, {"blank-out": reference, "grad": one_map * 2})
    assert set(result.scores) == {("a", "blank-out", None), ("a", "grad", None), ("blank-out", "grad", None)}
    assert np.allclose(result.scores[("a", "grad", None)], 1.0)


def test_constant_all_padding_and_nan_rows_are_counted_not_zero():
    scores = torch.rand(4, 5, generator=torch.Generator().manual_seed(0))
    method = scores.clone()
    method[0] = 0.5  # constant
    method[2, 1] = math.nan
    mask = torch.ones(4, 5)
    mask[1] = 0  # all padding
    result = compare({"m": method}, {"r": scores}, mask=mask)
    values = result.scores[("m", "r", None)]
    assert np.isnan(values[:3]).tolist() == [True, True, True] and values[3] == pytest.approx(1.0)
    (row,) = result.summary()
    assert (row["count"], row["nan_count"], row["mean"]) == (1, 3, pytest.approx(1.0))
    assert "m: 3" in result.to_markdown()


def test_example_ids_make_batches_mergeable():
    per_layer, _, reference, mask, _ = inputs()
    full = compare({"m": per_layer}, {"r": reference}, mask=mask)
    first = compare({"m": per_layer[:, :2]}, {"r": reference[:2]}, mask=mask[:2])
    second = compare({"m": per_layer[:, 2:]}, {"r": reference[2:]}, mask=mask[2:], example_ids=[2, 3, 4])
    merged = type(full).merge([second, first])
    np.testing.assert_array_equal(merged.example_ids, full.example_ids)
    for key in full.scores:
        np.testing.assert_array_equal(merged.scores[key], full.scores[key])


def test_compare_rejects_mismatched_inputs():
    reference = torch.rand(2, 5)
    with pytest.raises(ValueError, match=r"same B, same n"):
        compare({"m": torch.rand(2, 6)}, {"r": reference})
    with pytest.raises(ValueError, match=r"same B, same n"):
        compare({"m": torch.rand(3, 3, 5)}, {"r": reference})
    with pytest.raises(ValueError, match=r"same B, same n"):
        compare({"m": torch.rand(2, 5)}, {"r": reference, "r2": torch.rand(2, 4)})
    with pytest.raises(ValueError, match=r"reference 'r' must be \(B, n\)"):
        compare({"m": torch.rand(2, 5)}, {"r": torch.rand(3, 2, 5)})
    with pytest.raises(ValueError, match=r"mask must have shape"):
        compare({"m": torch.rand(2, 5)}, {"r": reference}, mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"example_ids must have shape"):
        compare({"m": torch.rand(2, 5)}, {"r": reference}, example_ids=[0, 1, 2])
    with pytest.raises(TypeError, match="mappings"):
        compare([torch.rand(2, 5)], {"r": reference})
    with pytest.raises(ValueError, match="at least one"):
        compare({}, {"r": reference})
    with pytest.raises(TypeError, match=r"attributions\['m'\] must be a torch tensor"):
        compare({"m": "scores"}, {"r": reference})
    with pytest.raises(ValueError, match="nothing to compare"):
        compare({"r": reference}, {"r": reference})
