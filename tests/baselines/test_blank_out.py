import types

import pytest
import torch

from helpers import UNK, FirstTokenClassifier, make_classifier, model_state, padded_batch
from captum_attnflow.baselines import BlankOut


def hand_blank_out(model, ids, mask, target, token):
    """The paper's blank-out written as a plain loop: one forward per example and position."""
    drops = torch.zeros(ids.shape)
    with torch.no_grad():
        for b in range(ids.shape[0]):
            full = torch.softmax(model(ids[b : b + 1], attention_mask=mask[b : b + 1]).logits, -1)[0, target[b]]
            for i in range(int(mask[b].sum())):
                blanked = ids[b : b + 1].clone()
                blanked[0, i] = token
                p = torch.softmax(model(blanked, attention_mask=mask[b : b + 1]).logits, -1)[0, target[b]]
                drops[b, i] = full - p
    return drops


@pytest.mark.parametrize("perturbations_per_eval", [1, 4])
def test_blank_out_equals_hand_written_loop(perturbations_per_eval):
    model = make_classifier()
    ids, mask = padded_batch()
    target = torch.tensor([0, 1, 2, 1])
    ours = BlankOut(model, token=UNK).attribute(
        ids, target=target, attention_mask=mask, perturbations_per_eval=perturbations_per_eval
    )
    torch.testing.assert_close(ours, hand_blank_out(model, ids, mask, target, UNK), atol=2e-6, rtol=1e-4)
    assert (ours[mask == 0] == 0).all()


def test_blank_out_target_none_is_predicted_class_and_int_target_broadcasts():
    model = make_classifier(seed=2)
    ids, mask = padded_batch(seed=3)
    predicted = model(ids, attention_mask=mask).logits.argmax(-1)
    blank_out = BlankOut(model, token=UNK)
    torch.testing.assert_close(
        blank_out.attribute(ids, attention_mask=mask), blank_out.attribute(ids, target=predicted, attention_mask=mask)
    )
    torch.testing.assert_close(
        blank_out.attribute(ids, target=1, attention_mask=mask),
        hand_blank_out(model, ids, mask, [1] * 4, UNK),
        atol=2e-6,
        rtol=1e-4,
    )


def test_blank_out_token_by_name():
    model = make_classifier()
    assert BlankOut(model, token="pad").token_id == 0
    assert BlankOut(model, tokenizer=types.SimpleNamespace(unk_token_id=7)).token_id == 7
    with pytest.raises(ValueError, match="unk token id"):
        BlankOut(model)
    with pytest.raises(ValueError, match='"unk", "pad", "mask"'):
        BlankOut(model, token="blank")


def test_blank_out_on_wrapped_base_model(arch):
    model = FirstTokenClassifier(arch)
    ids, mask = padded_batch(n=6)
    scores = BlankOut(model, token=UNK).attribute(ids, additional_forward_args=(mask,), attention_mask=mask)
    assert scores.shape == ids.shape and scores.dtype == torch.float32
    assert (scores[mask == 0] == 0).all()
    with torch.no_grad():
        logits = model(ids, mask)
        blanked = ids.clone()
        blanked[:, 1] = UNK
        expected = torch.softmax(logits, -1) - torch.softmax(model(blanked, mask), -1)
    torch.testing.assert_close(scores[:, 1], expected.gather(1, logits.argmax(-1, keepdim=True))[:, 0], atol=1e-6, rtol=1e-4)


def test_blank_out_leaves_model_unchanged():
    model = make_classifier()
    model.train()
    model.bert.embeddings.requires_grad_(False)
    before = model_state(model)
    ids, mask = padded_batch()
    BlankOut(model, token=UNK).attribute(ids, attention_mask=mask)
    assert model_state(model) == before


def test_blank_out_rejects_models_without_class_scores(tiny_model_factory):
    with pytest.raises(ValueError, match=r"\(B, C\) class scores"):
        BlankOut(tiny_model_factory("bert"), token=UNK).attribute(torch.tensor([[5, 6, 7]]))


def test_blank_out_rejects_bad_inputs():
    blank_out = BlankOut(make_classifier(), token=UNK)
    with pytest.raises(TypeError, match="integer token ids"):
        blank_out.attribute(torch.rand(1, 4))
    with pytest.raises(ValueError, match=r"\(B, n\)"):
        blank_out.attribute(torch.tensor([5, 6, 7]))
    with pytest.raises(ValueError, match="all padding"):
        blank_out.attribute(torch.tensor([[5, 6], [7, 8]]), attention_mask=torch.tensor([[1, 1], [0, 0]]))
