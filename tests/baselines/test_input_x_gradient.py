
import torch

from captum_attnflow.baselines import TokenInputXGradient
from helpers import embedding_gradients, make_classifier, model_state, padded_batch


def test_input_x_gradient_equals_embedding_times_autograd_gradient():
    model = make_classifier(seed=1)
    ids, mask = padded_batch(seed=2)
    target = torch.tensor([1, 0, 2, 2])
    embeddings, gradients = embedding_gradients(model, ids, mask, target)
    products = (embeddings * gradients).detach()
    before = model_state(model)
    norm = TokenInputXGradient(model).attribute(ids, target=target, attention_mask=mask)
    summed = TokenInputXGradient(model, reduce="sum").attribute(ids, target=target, attention_mask=mask)
    assert model_state(model) == before
    torch.testing.assert_close(norm, products.norm(dim=-1) * mask)
    torch.testing.assert_close(summed, products.sum(-1) * mask)
    assert (norm[mask == 0] == 0).all() and not norm.requires_grad
