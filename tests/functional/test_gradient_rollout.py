"""Gradient-weighted rollout's maths against explicit products (Chefer et al. 2021, eqs. 5-6)."""

from __future__ import annotations

import pytest
import torch

from captum_attnflow.functional import gradient_weighted_rollout
from captum_attnflow.functional.gradient_rollout import relevance_maps


def test_relevance_is_the_explicit_product_of_identity_plus_weighted_attention():
    generator = torch.Generator().manual_seed(0)
    attentions = torch.softmax(torch.randn(3, 2, 4, 5, 5, generator=generator), -1)
    gradients = torch.randn(3, 2, 4, 5, 5, generator=generator)
    expected = torch.eye(5).expand(2, 5, 5)
    for layer in range(3):
        weighted = torch.zeros(2, 5, 5)
        for h in range(4):
            weighted += torch.clamp(gradients[layer, :, h] * attentions[layer, :, h], min=0) / 4
        expected = expected + weighted @ expected
        assert torch.allclose(relevance_maps(attentions, gradients)[layer], expected, atol=1e-6)
    rows = gradient_weighted_rollout(attentions, gradients, position=[1, 3], layer=None)
    assert rows.shape == (3, 2, 2, 5)
    assert torch.allclose(rows[-1, :, 1], expected[:, 3], atol=1e-6)


def test_padding_gets_nothing_and_default_positions():
    attentions = torch.softmax(torch.randn(2, 2, 2, 4, 4), -1)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    scores = gradient_weighted_rollout(attentions, torch.ones_like(attentions), attention_mask=mask)
    assert bool((scores[1, 2:] == 0).all())
    causal = torch.softmax(torch.randn(2, 2, 2, 4, 4).masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1), -1e9), -1)
    last = gradient_weighted_rollout(causal, torch.ones_like(causal))  # a decoder: its last token
    assert torch.allclose(last, relevance_maps(causal, torch.ones_like(causal))[-1, :, 3])


def test_gradients_must_match_the_attentions():
    attentions = torch.softmax(torch.randn(2, 1, 2, 4, 4), -1)
    with pytest.raises(ValueError, match="gradients must match"):
        gradient_weighted_rollout(attentions, torch.ones(1, 1, 2, 4, 4))
