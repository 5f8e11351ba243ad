import math
from fractions import Fraction

import pytest
import torch

from helpers import FirstTokenClassifier, make_classifier, model_state, padded_batch
from captum_attnflow.baselines import BlankOut
from captum_attnflow.evaluate import aopc_comprehensiveness, aopc_sufficiency

FRACTIONS = (0.1, 0.3, 0.5, 1.0)


def probability(model, ids, target):
    with torch.no_grad():
        return torch.softmax(model(ids[None]).logits, -1)[0, target].item()


def hand_aopc(model, ids, mask, scores, target, exclude, fractions, keep_top):
    """ERASER's AOPC written out: one unpadded forward per example and k, exact rational k."""
    out = []
    for b in range(ids.shape[0]):
        real = [i for i in range(ids.shape[1]) if mask[b, i]]
        candidates = [i for i in real if not exclude[b, i]]
        ranked = sorted(candidates, key=lambda i: -scores[b, i].item())
        full = probability(model, ids[b, real], target[b])
        drops = []
        for fraction in fractions:
            top = set(ranked[: math.ceil(Fraction(str(fraction)) * len(candidates))])
            kept = [i for i in real if (i in top or i not in candidates)] if keep_top else [i for i in real if i not in top]
            drops.append(full - probability(model, ids[b, kept], target[b]))
        out.append(sum(drops) / len(drops))
    return torch.tensor(out)


@pytest.mark.parametrize("keep_top", [False, True])
def test_aopc_equals_hand_written_eraser_loop(keep_top):
    model = make_classifier(seed=5)
    ids, mask = padded_batch(seed=2, batch=4, n=11)
    scores = torch.rand(ids.shape, generator=torch.Generator().manual_seed(3))
    exclude = torch.zeros_like(mask, dtype=torch.bool)
    exclude[:, 0] = True  # CLS stays
    target = torch.tensor([0, 1, 2, 0])
    function = aopc_sufficiency if keep_top else aopc_comprehensiveness
    ours = function(model, ids, scores, target=target, attention_mask=mask, exclude=exclude, fractions=FRACTIONS)
    expected = hand_aopc(model, ids, mask, scores, target, exclude, FRACTIONS, keep_top)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)


def test_k_is_exact_where_floating_point_overshoots():
    model = make_classifier(seed=5)
    ids, mask = padded_batch(seed=0, batch=1, n=26)
    scores = torch.rand(ids.shape, generator=torch.Generator().manual_seed(1))
    exclude = torch.zeros_like(mask, dtype=torch.bool)
    exclude[:, 0] = True
    assert math.ceil(0.28 * 25) == 8  # 7.000000000000001, but 28% of 25 tokens is 7
    for keep_top, function in ((False, aopc_comprehensiveness), (True, aopc_sufficiency)):
        ours = function(model, ids, scores, attention_mask=mask, exclude=exclude, fractions=(0.28,), target=0)
        expected = hand_aopc(model, ids, mask, scores, [0], exclude, (0.28,), keep_top)
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)


def test_deleting_the_most_important_tokens_drops_more_than_the_least():
    model = make_classifier(seed=5)
    ids, mask = padded_batch(seed=4, batch=6, n=10)
    # Blank-out drops as attributions put the tokens whose removal hurts most first.
    drops = BlankOut(model, token="pad").attribute(ids, attention_mask=mask)
    good = aopc_comprehensiveness(model, ids, drops, attention_mask=mask, fractions=(0.2,))
    bad = aopc_comprehensiveness(model, ids, -drops, attention_mask=mask, fractions=(0.2,))
    assert good.mean() > bad.mean()


def test_target_none_is_the_predicted_class_and_int_target_broadcasts():
    model = make_classifier(seed=1)
    ids, mask = padded_batch(seed=1)
    scores = torch.rand(ids.shape, generator=torch.Generator().manual_seed(0))
    predicted = model(ids, attention_mask=mask).logits.argmax(-1)
    torch.testing.assert_close(
        aopc_comprehensiveness(model, ids, scores, attention_mask=mask),
        aopc_comprehensiveness(model, ids, scores, target=predicted, attention_mask=mask),
    )
    torch.testing.assert_close(
        aopc_sufficiency(model, ids, scores, target=2, attention_mask=mask),
        aopc_sufficiency(model, ids, scores, target=[2, 2, 2, 2], attention_mask=mask),
    )


def test_undefined_rows_are_nan_and_the_model_is_unchanged():
    model = make_classifier()
    model.classifier.requires_grad_(False)
    before = model_state(model)
    ids, mask = padded_batch(batch=3, n=6)
    exclude = torch.zeros(3, 6, dtype=torch.bool)
    exclude[1] = True
    scores = aopc_comprehensiveness(model, ids, torch.rand(3, 6), attention_mask=mask, exclude=exclude)
    assert torch.isnan(scores).tolist() == [False, True, False]
    everything = aopc_comprehensiveness(model, ids, torch.rand(3, 6), attention_mask=mask, exclude=exclude, fractions=(0.5, 1.0))
    assert torch.isnan(everything).all()  # 100% leaves no token (rows 0, 2) or there is no candidate (row 1)
    kept_all = aopc_sufficiency(model, ids, torch.rand(3, 6), attention_mask=mask, fractions=(1.0,))
    torch.testing.assert_close(kept_all, torch.zeros(3))
    assert model_state(model) == before


def test_plain_module_gets_padded_ids_and_per_token_args_are_refused():
    model = FirstTokenClassifier("bert")
    ids, mask = padded_batch(batch=2, n=5)
    scores = aopc_comprehensiveness(model, ids, torch.rand(2, 5), fractions=(0.5,), pad_token_id=0)
    assert scores.shape == (2,) and torch.isfinite(scores).all()
    with pytest.raises(ValueError, match="per-token tensor"):
        aopc_comprehensiveness(model, ids, torch.rand(2, 5), additional_forward_args=(mask,))


def test_aopc_rejects_bad_input():
    model = make_classifier()
    ids, mask = padded_batch(batch=2, n=5)
    with pytest.raises(ValueError, match=r"attributions must be \(B, n\)"):
        aopc_comprehensiveness(model, ids, torch.rand(3, 2, 5), attention_mask=mask)
    nan_scores = torch.rand(2, 5)
    nan_scores[0, 0] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        aopc_sufficiency(model, ids, nan_scores, attention_mask=mask)
    with pytest.raises(ValueError, match=r"fractions must be"):
        aopc_sufficiency(model, ids, torch.rand(2, 5), fractions=(0.0, 0.5))
    with pytest.raises(ValueError, match=r"exclude must have shape"):
        aopc_sufficiency(model, ids, torch.rand(2, 5), exclude=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="give one per example"):
        aopc_sufficiency(model, ids, torch.rand(2, 5), target=torch.tensor([0, 1, 2]))
