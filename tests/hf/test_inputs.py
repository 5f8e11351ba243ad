"""What comes in with the inputs: tokenizer output, ids, masks, padding on either side, clear errors."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers

from captum_attnflow import AttentionFlow, AttentionRollout, RawAttention, load_agreement_model
from captum_attnflow.baselines import BlankOut, TokenIntegratedGradients, TokenSaliency
from captum_attnflow.evaluate import compare
from helpers import CAUSAL, make_classifier, make_tiny_model, model_state

METHODS = [RawAttention, AttentionRollout, AttentionFlow]


@pytest.fixture(scope="module")
def agreement():
    return load_agreement_model()


@pytest.mark.parametrize("method", METHODS)
def test_tokenizer_output_is_taken_as_inputs(agreement, method):
    model, tokenizer = agreement
    batch = tokenizer(["the keys to the cabinet", "the key"], padding=True, return_tensors="pt")
    explainer = method(model)
    expected = explainer.attribute(batch["input_ids"], attention_mask=batch["attention_mask"])
    torch.testing.assert_close(explainer.attribute(batch), expected)
    torch.testing.assert_close(explainer.attribute(dict(batch)), expected)
    with pytest.raises(ValueError, match="given twice"):
        explainer.attribute(batch, attention_mask=batch["attention_mask"])
    with pytest.raises(ValueError, match="no 'input_ids'"):
        explainer.attribute({"ids": batch["input_ids"]})


def test_baselines_take_tokenizer_output(agreement):
    model, tokenizer = agreement
    batch = tokenizer(["the keys to the cabinet", "the key"], padding=True, return_tensors="pt")
    saliency = TokenSaliency(model)
    torch.testing.assert_close(
        saliency.attribute(batch, target=1), saliency.attribute(batch["input_ids"], target=1, attention_mask=batch["attention_mask"])
    )


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("bad", [2, 0.5])
def test_attention_mask_values_other_than_zero_and_one_are_refused(method, bad):
    model = make_tiny_model("bert")
    ids = torch.tensor([[5, 6, 7, 8]])
    with pytest.raises(ValueError, match=r"only 0 \(padding\) and 1"):
        method(model).attribute(ids, attention_mask=torch.tensor([[1, 1, bad, 0]]))
    with pytest.raises(ValueError, match=r"only 0 \(padding\) and 1"):
        TokenSaliency(make_classifier()).attribute(ids, target=0, attention_mask=torch.tensor([[1, 1, bad, 0]]))


def test_padding_without_a_mask_warns(agreement):
    model, tokenizer = agreement
    batch = tokenizer(["the keys to the cabinet", "the key"], padding=True, return_tensors="pt")
    with pytest.warns(UserWarning, match=r"pad token \(id 0\) at the sequence ends of examples \[1\]"):
        AttentionRollout(model).attribute(batch["input_ids"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        AttentionRollout(model).attribute(batch)  # the mask is there: no warning
        AttentionRollout(model).attribute(batch["input_ids"][:1])  # no padding: no warning


@pytest.mark.parametrize("arch", ["t5", "bart"])
@pytest.mark.parametrize("method", METHODS)
def test_encoder_decoder_left_padding_equals_the_sentence_alone(arch, method):
    torch.manual_seed(0)
    if arch == "t5":
        config = transformers.T5Config(vocab_size=60, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                       decoder_start_token_id=0, pad_token_id=0)
        model = transformers.T5ForConditionalGeneration(config).eval()
    else:
        config = transformers.BartConfig(vocab_size=60, d_model=32, encoder_layers=2, decoder_layers=2,
                                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                         decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=1)
        model = transformers.BartForConditionalGeneration(config).eval()
    pad = config.pad_token_id
    sentence = torch.tensor([[5, 17, 42, 8, 9]])
    left = torch.tensor([[pad, pad, 5, 17, 42, 8, 9]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1]])
    explainer = method(model)
    alone = explainer.attribute(sentence, layer=None, position=2)
    padded = explainer.attribute(left, attention_mask=mask, layer=None, position=4)
    torch.testing.assert_close(padded[..., 2:], alone, atol=1e-5, rtol=1e-5)
    assert (padded[..., :2] == 0).all()


@pytest.mark.parametrize("arch", sorted(CAUSAL))
@pytest.mark.parametrize("method", METHODS)
def test_causal_models_explain_the_last_real_token_by_default(arch, method):
    model = make_tiny_model(arch)
    ids = torch.tensor([[5, 17, 42, 8], [9, 23, 31, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    explainer = method(model)
    default = explainer.attribute(ids, attention_mask=mask)
    torch.testing.assert_close(default, explainer.attribute(ids, attention_mask=mask, position=mask.sum(1) - 1))
    assert (default[:, 1:3] > 0).all()  # never the trivial [1, 0, 0, ...] of the first token
    encoder = make_tiny_model("bert")
    torch.testing.assert_close(method(encoder).attribute(ids, attention_mask=mask),
                               method(encoder).attribute(ids, attention_mask=mask, position=0))


@pytest.mark.parametrize("method", METHODS)
def test_position_has_one_meaning_in_every_class(method):
    model = make_tiny_model("bert")
    ids = torch.tensor([[5, 17, 42, 8], [9, 23, 31, 12]])
    explainer = method(model)
    every = explainer.attribute(ids, position=torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3]]))  # (B, S, n)
    assert every.shape == (2, 4, 4)
    torch.testing.assert_close(explainer.attribute(ids, position=[0, 2]), every[:, [0, 2]])  # same S positions
    torch.testing.assert_close(explainer.attribute(ids, position=2), every[:, 2])  # int: no position axis
    torch.testing.assert_close(explainer.attribute(ids, position=torch.tensor([1, 3])), every[[0, 1], [1, 3]])
    with pytest.raises(TypeError, match="integer token indices"):
        explainer.attribute(ids, position=torch.tensor([0.0, 1.0]))


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda e, ids: e.attribute(torch.tensor([[5, 600]])), ValueError, "outside the model's vocabulary of 60"),
        (lambda e, ids: e.attribute(torch.tensor([[5, -1]])), ValueError, "token ids must be >= 0"),
        (lambda e, ids: e.attribute(ids.bool()), TypeError, "integer token ids"),
        (lambda e, ids: e.attribute(ids[:0]), ValueError, "empty batch"),
        (lambda e, ids: e.attribute(ids, residual_alpha=None), TypeError, "residual_alpha must be a number"),
        (lambda e, ids: e.attribute(torch.randn(2, 4, 32)), TypeError, "input_ids rather than embeddings"),
    ],
)
@pytest.mark.parametrize("method", METHODS)
def test_bad_inputs_get_errors_that_name_the_fix(method, call, error, match):
    model = make_tiny_model("bert")
    before = model_state(model)
    with pytest.raises(error, match=match):
        call(method(model), torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]]))
    assert model_state(model) == before


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda m, ids: TokenSaliency(m).attribute(ids, target=3), ValueError, r"out of range: the model scores C = 3"),
        (lambda m, ids: TokenSaliency(m).attribute(ids, target=-1), ValueError, "out of range"),
        (lambda m, ids: TokenSaliency(m).attribute(ids, target="positive"), TypeError, "label2id"),
        (lambda m, ids: BlankOut(m, token=3).attribute(ids, target=[0, 1, 2]), ValueError, "target has 3 entries for B = 2"),
        (lambda m, ids: TokenSaliency(m).attribute(torch.tensor([[5, 600]]), target=0), ValueError, "vocabulary"),
        (lambda m, ids: TokenSaliency(m).attribute(ids[:0], target=0), ValueError, "empty batch"),
        (
            lambda m, ids: TokenSaliency(m).attribute(ids, target=0, additional_forward_args=(torch.ones_like(ids),),
                                                      attention_mask=torch.ones_like(ids)),
            ValueError,
            "pass the mask only as attention_mask=",
        ),
        (lambda m, ids: TokenIntegratedGradients(m).attribute(ids, baselines="mask"), ValueError,
         r"baselines=tokenizer.convert_tokens_to_ids\('\[MASK\]'\)"),
    ],
)
def test_baseline_errors_name_the_fix(call, error, match):
    model = make_classifier()
    before = model_state(model)
    with pytest.raises(error, match=match):
        call(model, torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]]))
    assert model_state(model) == before


def test_compare_refuses_per_dimension_scores_and_delta_tuples():
    reference = {"ref": torch.rand(2, 5)}
    with pytest.raises(ValueError, match=r"scores.sum\(-1\).*scores.norm\(dim=-1\)"):
        compare({"ig": torch.rand(2, 5, 16)}, reference)
    with pytest.raises(ValueError, match=r"scores.sum\(-1\)"):
        compare({"m": torch.rand(2, 5)}, {"ref": torch.rand(2, 5, 16)})
    with pytest.raises(TypeError, match=r"\(attributions, delta\)"):
        compare({"ig": (torch.rand(2, 5), torch.rand(2))}, reference)
