
import pytest
import torch

from helpers import make_classifier, model_state, padded_batch
from captum_attnflow.baselines import TokenIntegratedGradients


def test_integrated_gradients_completeness_with_pad_baseline():
    """Summed over tokens, IG recovers f(x) - f(baseline) (Sundararajan et al. 2017, axiom of completeness)."""
    model = make_classifier(seed=3)
    ids, mask = padded_batch(seed=4)
    target = torch.tensor([0, 1, 2, 0])
    before = model_state(model)
    scores = TokenIntegratedGradients(model, reduce="sum").attribute(
        ids, target=target, attention_mask=mask, n_steps=64
    )
    assert model_state(model) == before
    baseline = torch.where(mask.bool(), torch.zeros_like(ids), ids)
    with torch.no_grad():
        difference = (model(ids, attention_mask=mask).logits - model(baseline, attention_mask=mask).logits)
    torch.testing.assert_close(scores.sum(-1), difference.gather(1, target[:, None])[:, 0], atol=2e-3, rtol=2e-2)
    assert (scores[mask == 0] == 0).all()


def test_integrated_gradients_baseline_token_and_tensor_agree():
    model = make_classifier()
    ids, mask = padded_batch()
    ig = TokenIntegratedGradients(model)
    by_name = ig.attribute(ids, attention_mask=mask, baselines="pad", n_steps=8)
    by_tensor = ig.attribute(ids, attention_mask=mask, baselines=torch.where(mask.bool(), 0, ids), n_steps=8)
    torch.testing.assert_close(by_name, by_tensor)
    assert (by_name >= 0).all() and (by_name[mask == 1] > 0).all()
    with pytest.raises(ValueError, match="shaped like inputs"):
        ig.attribute(ids, attention_mask=mask, baselines=torch.zeros(1, 3, dtype=torch.long))
