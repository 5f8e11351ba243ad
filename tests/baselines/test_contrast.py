"""Contrastive targets (``contrast=``): the explained score is score(target) - score(contrast).

Two independent references: where a method is linear in the explained score (gradients, their
products with the inputs, integrated gradients, drops of a score), the contrastive explanation is
the difference of the two single-target ones; for every method it is the explanation of a forward
function that returns the difference itself as its one score.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from captum_attnflow import AttentionRollout, GradientWeightedRollout, LLMAttentionAttribution, load_agreement_lm
from captum_attnflow.baselines import BlankOut, TokenInputXGradient, TokenIntegratedGradients, TokenSaliency
from captum_attnflow.cli import main
from captum_attnflow.hf import target_scores
from helpers import UNK, make_classifier, padded_batch

TARGET = torch.tensor([1, 0, 2, 1])
CONTRAST = torch.tensor([2, 2, 0, 0])

# name -> (build(forward), extra attribute kwargs)
METHODS = {
    "saliency": (lambda f: TokenSaliency(f, reduce="sum"), {}),
    "input_x_gradient": (lambda f: TokenInputXGradient(f, reduce="sum"), {}),
    "integrated_gradients": (lambda f: TokenIntegratedGradients(f, reduce="sum"), {"n_steps": 8, "baselines": 0}),
    "blankout": (lambda f: BlankOut(f, token=UNK, softmax=False), {}),
}


class Difference(nn.Module):
    """The classifier's logit of ``target`` (B,) minus that of ``contrast`` (B,), as (B, 1)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, target, contrast, attention_mask=None):
        logits = self.model(input_ids, attention_mask=attention_mask).logits
        rows = torch.arange(len(logits))
        return (logits[rows, target] - logits[rows, contrast])[:, None]


def test_target_scores_subtracts_the_contrast_in_every_form():
    logits = torch.tensor([[1.0, 4.0, 2.0], [0.5, -1.0, 3.0]])
    one = torch.zeros(2, 1, dtype=torch.long)
    assert target_scores(logits, 1, one, contrast=2).tolist() == [[2.0], [-4.0]]
    assert target_scores(logits, [1, 2], one, contrast=[0, 0]).tolist() == [[3.0], [2.5]]
    tokens = torch.arange(2 * 3 * 4, dtype=torch.float).reshape(2, 3, 4) ** 2  # (B, n, V)
    positions = torch.tensor([[0, 2], [1, 2]])
    contrast = torch.tensor([[3, 0], [1, 2]])
    expected = [[tokens[b, p, 1] - tokens[b, p, c] for p, c in zip(positions[b], contrast[b])] for b in range(2)]
    torch.testing.assert_close(target_scores(tokens, 1, positions, contrast=contrast), torch.tensor(expected))
    with pytest.raises(ValueError, match="contrast .* out of range"):
        target_scores(logits, 1, one, contrast=3)
    with pytest.raises(TypeError, match="contrast must be integer"):
        target_scores(logits, 1, one, contrast="is")
    with pytest.raises(ValueError, match="pass contrast=None"):
        target_scores(logits[:, 0], None, one, contrast=0)


@pytest.mark.parametrize("name", list(METHODS))
def test_contrast_is_the_difference_of_two_explanations_and_of_a_difference_model(name):
    build, options = METHODS[name]
    model = make_classifier()
    ids, mask = padded_batch()
    method = build(model)
    contrastive = method.attribute(ids, target=TARGET, attention_mask=mask, contrast=CONTRAST, **options)
    target = method.attribute(ids, target=TARGET, attention_mask=mask, **options)
    other = method.attribute(ids, target=CONTRAST, attention_mask=mask, **options)
    torch.testing.assert_close(contrastive, target - other, atol=2e-5, rtol=1e-4)
    difference = build(Difference(model)).attribute(
        ids, target=0, additional_forward_args=(TARGET, CONTRAST), attention_mask=mask, **options
    )
    torch.testing.assert_close(contrastive, difference, atol=2e-5, rtol=1e-4)
    assert contrastive.abs().sum() > 0 and not torch.allclose(contrastive, target)


@pytest.mark.parametrize("lean", [None, False])  # recomputed attention gradients, and eager attention's stored ones
def test_gradient_weighted_rollout_contrast_is_the_rollout_of_a_difference_model(lean):
    model = make_classifier()
    ids, mask = padded_batch()
    contrastive = GradientWeightedRollout(model, lean=lean).attribute(ids, target=TARGET, contrast=CONTRAST, attention_mask=mask, layer=None)
    difference = GradientWeightedRollout(Difference(model), lean=lean).attribute(
        ids, target=0, additional_forward_args=(TARGET, CONTRAST), attention_mask=mask, layer=None
    )
    torch.testing.assert_close(contrastive, difference, atol=1e-5, rtol=1e-4)
    plain = GradientWeightedRollout(model).attribute(ids, target=TARGET, attention_mask=mask, layer=None)
    assert not torch.allclose(contrastive, plain)


def test_llm_contrast_target_explains_each_output_token_against_its_contrast():
    model, tokenizer = load_agreement_lm()
    prompt, target, contrast = "the keys to the cabinet", ["are", "."], ["is", "the"]
    explainer = LLMAttentionAttribution(GradientWeightedRollout(model), tokenizer)
    result = explainer.attribute(prompt, target=" ".join(target), contrast_target=" ".join(contrast))
    ids = tokenizer(f"{prompt} {' '.join(target)}", return_tensors="pt")["input_ids"]
    written, other = tokenizer.convert_tokens_to_ids(target), tokenizer.convert_tokens_to_ids(contrast)
    for t in range(2):
        position = 5 + t

        class Written(nn.Module):  # one score: the difference of the two logits at that position
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, input_ids, attention_mask=None):
                logits = self.model(input_ids, attention_mask=attention_mask).logits[:, position]
                return (logits[:, written[t]] - logits[:, other[t]])[:, None]

        expected = GradientWeightedRollout(Written()).attribute(ids, target=0, position=position)
        torch.testing.assert_close(result.token_attr[t], expected[0, :6], atol=1e-5, rtol=1e-4)
    plain = explainer.attribute(prompt, target=" ".join(target))
    assert not torch.allclose(plain.token_attr, result.token_attr)
    generated = explainer.attribute(prompt, contrast_target="is", max_new_tokens=3)
    assert len(generated.output_tokens) == 1  # a generated target is cut to the contrast's length
    with pytest.raises(ValueError, match="same number of tokens"):
        explainer.attribute(prompt, target="are .", contrast_target="is")
    with pytest.raises(TypeError, match="GradientWeightedRollout"):
        LLMAttentionAttribution(AttentionRollout(model), tokenizer).attribute(prompt, target="are", contrast_target="is")


def test_generate_contrast_on_the_bundled_language_model(tmp_path, capsys):
    out = tmp_path / "why.png"
    assert main(["generate", "the keys to the cabinet", "--target", "are", "--contrast", "is", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "continuation: are" in printed and out.exists()
    assert main(["generate", "the keys", "--contrast", "is", "--method", "rollout", "--out", str(out)]) == 1
    assert "--method gradient_rollout" in capsys.readouterr().err
