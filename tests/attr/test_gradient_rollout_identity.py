"""GradientWeightedRollout(remove_identity=True): the row of R - I, i.e. R with exactly 1 taken
off at each explained position's own entry and nothing else changed."""

import pytest
import torch

from captum_attnflow import GradientWeightedRollout
from tests.helpers import make_classifier, padded_batch


@pytest.mark.parametrize("lean", [True, False])  # both paths: recomputed in blocks, and stored maps
def test_remove_identity_subtracts_one_at_each_explained_position_only(lean):
    model = make_classifier(seed=2, layers=2)
    ids, mask = padded_batch(seed=4, batch=3, n=6)
    method = GradientWeightedRollout(model, lean=lean)
    cases = [dict(layer=-1), dict(layer=None), dict(layer=None, position=[0, 2]), dict(layer=2, position=torch.tensor([[1], [2], [4]]))]
    for kwargs in cases:
        full = method.attribute(ids, target=1, attention_mask=mask, **kwargs)
        shown = method.attribute(ids, target=1, attention_mask=mask, remove_identity=True, **kwargs)
        position = kwargs.get("position", [0])
        position = torch.as_tensor(position).expand(3, -1) if torch.as_tensor(position).dim() < 2 else torch.as_tensor(position)
        expected = full.clone()
        rows = expected if "position" in kwargs else expected.unsqueeze(-2)  # (..., B, S, n)
        for b in range(3):
            for s in range(position.shape[1]):
                rows[..., b, s, int(position[b, s])] -= 1.0  # an explicit loop over (example, row)
        assert shown.shape == full.shape, kwargs
        assert torch.equal(shown, expected), kwargs
    # R's diagonal is at least 1 (identity plus non-negative mixing): R - I stays non-negative
    assert bool((method.attribute(ids, target=1, attention_mask=mask, remove_identity=True) >= 0).all())
