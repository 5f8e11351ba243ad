
import pytest
import torch

from helpers import FirstTokenClassifier, embedding_gradients, make_classifier, model_state, padded_batch
from captum_attnflow.baselines import TokenSaliency


@pytest.mark.parametrize("probabilities", [False, True])
def test_saliency_equals_autograd_embedding_gradient(probabilities):
    model = make_classifier()
    ids, mask = padded_batch()
    target = torch.tensor([0, 2, 1, 1])
    _, gradients = embedding_gradients(model, ids, mask, target, probabilities)
    saliency = TokenSaliency(model, probabilities=probabilities)
    torch.testing.assert_close(
        saliency.attribute(ids, target=target, attention_mask=mask), gradients.norm(dim=-1) * mask
    )
    summed = TokenSaliency(model, reduce="sum", probabilities=probabilities)
    torch.testing.assert_close(summed.attribute(ids, target=target, attention_mask=mask), gradients.sum(-1) * mask)


def test_saliency_default_target_is_predicted_class():
    model = make_classifier(seed=4)
    ids, mask = padded_batch(seed=1)
    predicted = model(ids, attention_mask=mask).logits.argmax(-1)
    saliency = TokenSaliency(model)
    torch.testing.assert_close(
        saliency.attribute(ids, attention_mask=mask), saliency.attribute(ids, target=predicted, attention_mask=mask)
    )


def test_saliency_padding_is_zero_and_model_unchanged_even_frozen_under_no_grad():
    model = make_classifier()
    model.requires_grad_(False)
    before = model_state(model)
    ids, mask = padded_batch()
    with torch.no_grad():
        scores = TokenSaliency(model).attribute(ids, attention_mask=mask)
    assert model_state(model) == before
    assert (scores[mask == 0] == 0).all() and (scores[mask == 1] > 0).all()
    assert not scores.requires_grad


def test_saliency_on_wrapped_base_model(arch):
    model = FirstTokenClassifier(arch)
    ids, mask = padded_batch(n=6)
    scores = TokenSaliency(model).attribute(ids, target=1, additional_forward_args=(mask,), attention_mask=mask)
    embeddings = model.encoder.get_input_embeddings()
    assert scores.shape == ids.shape
    assert (scores[mask == 0] == 0).all()
    assert model_state(model) == model_state(FirstTokenClassifier(arch))
    assert embeddings is model.encoder.get_input_embeddings()


def test_saliency_rejects_bad_arguments():
    model = make_classifier()
    with pytest.raises(ValueError, match="reduce"):
        TokenSaliency(model, reduce="max")
    with pytest.raises(ValueError, match="embedding layer"):
        TokenSaliency(lambda ids: torch.zeros(len(ids), 2))
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        TokenSaliency(model).attribute(torch.tensor([[5, 6, 7]]), attention_mask=torch.ones(1, 4))
