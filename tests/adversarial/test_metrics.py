"""jsd, tvd and kl against hand-computed values, scipy, and their invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import jensenshannon
from scipy.stats import entropy

from captum_attnflow.adversarial import jsd, kl, tvd


def test_hand_values():
    p, q = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.0, 0.5, 0.5])
    # m = (0.25, 0.5, 0.25): KL(p||m) = 0.5 ln 2 + 0.5 ln 1 = KL(q||m), so JSD = 0.5 ln 2.
    assert jsd(p, q).item() == pytest.approx(0.5 * math.log(2), abs=1e-6)
    assert tvd(p, q).item() == pytest.approx(0.5, abs=1e-7)
    assert kl(q, torch.tensor([0.25, 0.25, 0.5])).item() == pytest.approx(0.5 * math.log(2), abs=1e-6)
    assert kl(p, q).item() == math.inf
    disjoint = torch.eye(3)
    assert torch.allclose(jsd(disjoint, disjoint.roll(1, 0)), torch.full((3,), math.log(2)))
    assert torch.allclose(tvd(disjoint, disjoint.roll(1, 0)), torch.ones(3))


distributions = st.integers(2, 6).flatmap(
    lambda k: st.tuples(
        # subnormal weights are left out: scipy's reference overflows to inf on them
        *[st.lists(st.floats(0.0, 1.0, allow_subnormal=False), min_size=k, max_size=k).filter(lambda xs: sum(xs) > 1e-3) for _ in range(2)]
    )
)


@settings(max_examples=60, deadline=None)
@given(distributions)
def test_against_scipy_and_bounds(pair):
    p, q = (np.asarray(x, dtype=np.float64) / sum(x) for x in pair)
    tp, tq = torch.from_numpy(p), torch.from_numpy(q)
    # scipy's jensenshannon takes a square root that turns rounding below 0 into nan (weights
    # ~1e-16); its definition from scipy's entropy has no root.
    m = (p + q) / 2
    assert jsd(tp, tq).item() == pytest.approx(0.5 * entropy(p, m) + 0.5 * entropy(q, m), abs=1e-9)
    if np.isfinite(jensenshannon(p, q)):
        assert jsd(tp, tq).item() == pytest.approx(jensenshannon(p, q) ** 2, abs=1e-9)
    assert tvd(tp, tq).item() == pytest.approx(0.5 * np.abs(p - q).sum(), abs=1e-12)
    if (q > 0).all():
        assert kl(tp, tq).item() == pytest.approx(entropy(p, q), abs=1e-9)
    assert 0 <= jsd(tp, tq).item() <= math.log(2) + 1e-12
    assert jsd(tp, tq).item() == pytest.approx(jsd(tq, tp).item(), abs=1e-12)
    # Pinsker-type bound between the two: JSD <= TVD ln 2.
    assert jsd(tp, tq).item() <= tvd(tp, tq).item() * math.log(2) + 1e-12


def test_batched_matches_one_by_one_and_mask_zeroes_padding():
    torch.manual_seed(0)
    p, q = torch.rand(2, 3, 5).softmax(-1), torch.rand(2, 3, 5).softmax(-1)
    p[1, 2] = float("nan")  # a padding row may hold anything
    mask = torch.ones(2, 3, dtype=torch.bool)
    mask[1, 2] = False
    for metric in (jsd, tvd, kl):
        batched = metric(p, q, mask)
        assert batched[1, 2] == 0
        for i, j in [(0, 0), (0, 2), (1, 1)]:
            assert batched[i, j] == pytest.approx(metric(p[i, j], q[i, j]).item(), abs=1e-7)


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="same shape"):
        jsd(torch.ones(3) / 3, torch.ones(4) / 4)
    with pytest.raises(ValueError, match="mask must have shape"):
        tvd(torch.ones(2, 3) / 3, torch.ones(2, 3) / 3, mask=torch.ones(3))
    with pytest.raises(TypeError, match="tensors"):
        kl([0.5, 0.5], torch.tensor([0.5, 0.5]))

def test_jsd_gradient_is_finite_at_zeros():
    p = torch.tensor([0.5, 0.5, 0.0])
    logits = torch.tensor([1.0, 0.0, -float("inf")], requires_grad=True)
    jsd(p, logits.softmax(-1)).backward()
    assert torch.isfinite(logits.grad[:2]).all()
