"""The baselines follow Captum's contracts: base classes, multiplies_by_inputs, argument order,
convergence delta, and the model in eval mode for the call."""

from __future__ import annotations

import inspect

import pytest
import torch
from captum.attr import GradientAttribution, LayerIntegratedGradients, PerturbationAttribution

from captum_attnflow.baselines import BlankOut, TokenInputXGradient, TokenIntegratedGradients, TokenSaliency
from captum_attnflow.evaluate import aopc_comprehensiveness
from helpers import UNK, make_classifier, model_state, padded_batch


@pytest.mark.parametrize(
    "cls, base, multiplies",
    [
        (TokenSaliency, GradientAttribution, False),
        (TokenInputXGradient, GradientAttribution, True),
        (TokenIntegratedGradients, GradientAttribution, True),
        (BlankOut, PerturbationAttribution, False),
    ],
)
def test_base_class_and_multiplies_by_inputs(cls, base, multiplies):
    explainer = cls(make_classifier(), token=UNK) if cls is BlankOut else cls(make_classifier())
    assert isinstance(explainer, base)
    assert explainer.multiplies_by_inputs is multiplies


def test_integrated_gradients_takes_captums_argument_order_and_returns_the_delta():
    ours = list(inspect.signature(TokenIntegratedGradients.attribute).parameters)[1:9]
    captum = list(inspect.signature(LayerIntegratedGradients.attribute).parameters)[1:9]
    assert ours == captum == [
        "inputs", "baselines", "target", "additional_forward_args", "n_steps", "method",
        "internal_batch_size", "return_convergence_delta",
    ]
    model = make_classifier()
    ids, mask = padded_batch(batch=2, n=6)
    explainer = TokenIntegratedGradients(model, reduce="sum")
    assert explainer.has_convergence_delta()
    scores, delta = explainer.attribute(ids, 0, 1, None, 64, attention_mask=mask, return_convergence_delta=True)
    positional = explainer.attribute(ids, 0, 1, None, 64, attention_mask=mask)
    torch.testing.assert_close(scores, positional)
    # Completeness by hand: the scores add up to f(x) - f(x'), the baseline id 0 at every real token.
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits[:, 1]
        empty = model(torch.where(mask.bool(), 0, ids), attention_mask=mask).logits[:, 1]
    torch.testing.assert_close(delta.float(), scores.sum(-1) - (full - empty), atol=1e-4, rtol=0)
    assert delta.abs().max() < 1e-2


@pytest.mark.parametrize("cls", [TokenSaliency, TokenInputXGradient, TokenIntegratedGradients, BlankOut])
def test_a_model_in_train_mode_gives_the_same_scores_twice_and_stays_in_train_mode(cls):
    model = make_classifier()
    ids, mask = padded_batch(batch=3, n=7)
    explainer = cls(model, token=UNK) if cls is BlankOut else cls(model)
    expected = explainer.attribute(ids, target=1, attention_mask=mask)  # eval mode
    model.train()
    before = model_state(model)
    first = explainer.attribute(ids, target=1, attention_mask=mask)
    second = explainer.attribute(ids, target=1, attention_mask=mask)
    torch.testing.assert_close(first, second)
    torch.testing.assert_close(first, expected)
    assert model_state(model) == before and model.training


def test_aopc_runs_the_model_in_eval_mode():
    model = make_classifier()
    ids, mask = padded_batch(batch=3, n=7)
    scores = torch.rand(3, 7)
    expected = aopc_comprehensiveness(model, ids, scores, target=1, attention_mask=mask)
    model.train()
    torch.testing.assert_close(aopc_comprehensiveness(model, ids, scores, target=1, attention_mask=mask), expected)
    assert model.training
