import math
import warnings

import numpy as np
import pytest
import scipy.stats
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from captum_attnflow.evaluate import spearman


def scipy_rows(x, y, mask):
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns on constant input before returning NaN
        for a, b, m in zip(x, y, mask):
            out.append(scipy.stats.spearmanr(a[m], b[m]).statistic if m.sum() >= 2 else math.nan)
    return np.array(out, dtype=float)


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    batch=st.integers(1, 4),
    n=st.integers(2, 12),
    ties=st.booleans(),
)
def test_spearman_equals_scipy_with_and_without_ties(data, batch, n, ties):
    elements = st.integers(-3, 3).map(float) if ties else st.floats(-1e3, 1e3, allow_nan=False)
    x = data.draw(arrays(np.float64, (batch, n), elements=elements))
    y = data.draw(arrays(np.float64, (batch, n), elements=elements))
    mask = data.draw(arrays(np.bool_, (batch, n)))
    ours = spearman(x, y, mask).numpy()
    reference = scipy_rows(x, y, mask)
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(reference))
    np.testing.assert_allclose(ours[~np.isnan(ours)], reference[~np.isnan(reference)], atol=1e-12, rtol=0)


def test_spearman_random_torch_float32_matches_scipy():
    generator = torch.Generator().manual_seed(0)
    x, y = torch.rand(20, 30, generator=generator), torch.rand(20, 30, generator=generator)
    expected = [scipy.stats.spearmanr(a.numpy(), b.numpy()).statistic for a, b in zip(x, y)]
    np.testing.assert_allclose(spearman(x, y).numpy(), expected, atol=1e-12, rtol=0)


def test_identical_rankings_give_one_and_reversed_minus_one():
    x = torch.tensor([[0.1, 0.5, 0.2, 0.9, 0.3]])
    assert spearman(x, x * 7 + 1).item() == pytest.approx(1.0)
    assert spearman(x, -x).item() == pytest.approx(-1.0)
    assert spearman(x, x.exp()).item() == pytest.approx(1.0)


def test_padding_is_honoured():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0, -5.0]])
    y = torch.tensor([[1.0, 2.0, 3.0, -100.0, 50.0]])
    mask = torch.tensor([[1, 1, 1, 0, 0]])
    assert spearman(x, y, mask).item() == pytest.approx(1.0)
    assert spearman(x, y).item() < 0.5


def test_undefined_correlations_are_nan_never_zero():
    x = torch.tensor([[1.0, 1.0, 1.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, float("nan"), 3.0]])
    y = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 1]])
    assert torch.isnan(spearman(x, y, mask)).all()
    assert spearman(x[1:2], y[1:2]).item() == pytest.approx(1.0)


def test_spearman_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="same shape"):
        spearman(torch.rand(2, 5), torch.rand(2, 6))
    with pytest.raises(ValueError, match="mask must have the shape"):
        spearman(torch.rand(2, 5), torch.rand(2, 5), torch.ones(2, 4))
    with pytest.raises(TypeError, match="tensor or a numpy array"):
        spearman("abc", torch.rand(1, 3))
