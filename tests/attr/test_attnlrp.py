"""AttnLRP against a slow float64 reference written from the paper's rules as explicit relevance
propagation (tests/lrp_reference.py), on tiny BERT, GPT-2, Llama (grouped-query heads, rotary, with
and without biases) and ViT, padded on either side; how much of the logit reaches the tokens; the
model left as it was; the registry, the language-model wrapper and the command line."""

from __future__ import annotations

import pytest
import torch
import transformers
from helpers import model_state, padded_batch
from lrp_reference import attnlrp_reference

from captum_attnflow import AttnLRP, load_agreement_model
from captum_attnflow.attr.llm import LLMAttentionAttribution
from captum_attnflow.cli import main
from captum_attnflow.methods import METHODS
from captum_attnflow.models.language_model import load_agreement_lm

TINY = dict(vocab_size=60, hidden_size=32, num_attention_heads=4, intermediate_size=64, initializer_range=0.2)


def _random_biases(model: torch.nn.Module) -> torch.nn.Module:
    """Nonzero biases everywhere (transformers initialises them to 0), so their share is exercised."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def _model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "bert":
        config = transformers.BertConfig(num_hidden_layers=2, max_position_embeddings=16, num_labels=3, **TINY)
        return _random_biases(transformers.BertForSequenceClassification(config))
    if kind == "roberta":  # its classification head calls torch.tanh
        config = transformers.RobertaConfig(num_hidden_layers=2, max_position_embeddings=20, num_labels=3, pad_token_id=1,
                                            **TINY)
        return _random_biases(transformers.RobertaForSequenceClassification(config))
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=60, n_embd=32, n_head=4, n_layer=2, n_positions=16, initializer_range=0.2)
        return _random_biases(transformers.GPT2LMHeadModel(config))
    if kind == "vit":
        config = transformers.ViTConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=16,
            patch_size=8, num_labels=3, initializer_range=0.2,
        )
        return _random_biases(transformers.ViTForImageClassification(config))
    bias = kind == "llama_bias"
    config = transformers.LlamaConfig(
        num_hidden_layers=2, num_key_value_heads=2, max_position_embeddings=16, attention_bias=bias, mlp_bias=bias, **TINY
    )
    return _random_biases(transformers.LlamaForCausalLM(config))


def _left(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    shift = (mask == 0).sum(1, keepdim=True)
    where = (torch.arange(ids.shape[1])[None] + shift) % ids.shape[1]
    return ids.new_zeros(ids.shape).scatter(1, where, ids), mask.new_zeros(mask.shape).scatter(1, where, mask)


CASES = [("bert", "right"), ("roberta", "right"), ("gpt2", "right"), ("gpt2", "left"), ("llama", "left"), ("llama_bias", "right"), ("vit", None)]


@pytest.mark.parametrize("kind, side", CASES)
def test_matches_explicit_relevance_propagation(kind, side):
    model = _model(kind)
    target = torch.tensor([0, 2, 1])
    if kind == "vit":
        inputs, mask, position = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(0)), None, None
    else:
        inputs, mask = padded_batch(batch=3, n=7)
        if kind == "roberta":  # RoBERTa's pad id is 1
            inputs = torch.where(mask.bool(), inputs, 1)
        if side == "left":
            inputs, mask = _left(inputs, mask)
        encoder = kind in ("bert", "roberta")
        position = None if encoder else torch.where(mask.bool(), torch.arange(7), -1).amax(1)
        target = target if encoder else torch.tensor([5, 17, 42])
    expected, ledgers = attnlrp_reference(model, inputs, target, mask, position)
    inputs = inputs.double() if kind == "vit" else inputs
    ours = AttnLRP(model.double()).attribute(inputs, target=target, attention_mask=mask)
    assert ours.shape == expected.shape  # ViT: [CLS] and the 4 patches
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    shares = AttnLRP(model).shares(inputs, target=target, attention_mask=mask)
    for b, ledger in enumerate(ledgers):
        # The tokens, the position and token-type embeddings, the biases and the softmax
        # linearisation share the logit exactly; each share is booked by its own rule.
        parts = ledger["token"] + ledger["other"] + ledger["bias"] + ledger["softmax"]
        assert parts == pytest.approx(ledger["logit"], abs=1e-9)
        assert abs(ledger["softmax"]) > 1e-3
        assert (abs(ledger["bias"]) > 1e-3) == (kind != "llama")
        assert (abs(ledger["other"]) > 1e-3) == (kind in ("bert", "roberta", "gpt2", "vit"))
        # the shares read from the rules' gradients are the reference's books
        ours_ledger = [float(shares[name][b]) for name in ("score", "tokens", "other_embeddings", "biases", "softmax")]
        books = [ledger[name] for name in ("logit", "token", "other", "bias", "softmax")]
        assert ours_ledger == pytest.approx(books, abs=1e-5)


def test_shares_per_position_and_padding_side():
    """Each explained position's tokens share is the sum of its relevance row; a left-padded batch
    books what the right-padded one books; a bias the shares cannot book is named."""
    model = _model("gpt2").double()
    ids, mask = padded_batch(batch=3, n=7)
    left_ids, left_mask = _left(ids, mask)
    shares = AttnLRP(model).shares(ids, target=[[5, 9], [17, 3], [42, 8]], attention_mask=mask, position=[0, 1])
    rows = AttnLRP(model).attribute(ids, target=[[5, 9], [17, 3], [42, 8]], attention_mask=mask, position=[0, 1])
    assert shares["tokens"].shape == (3, 2)
    torch.testing.assert_close(shares["tokens"], rows.sum(-1), atol=1e-12, rtol=0)
    right = AttnLRP(model).shares(ids, target=[5, 17, 42], attention_mask=mask)
    left = AttnLRP(model).shares(left_ids, target=[5, 17, 42], attention_mask=left_mask)
    for name in right:
        torch.testing.assert_close(left[name], right[name], atol=1e-10, rtol=0)

    class Shift(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bias = torch.nn.Parameter(torch.full((32,), 0.1, dtype=torch.float64))

        def forward(self, x):
            return x + self.bias

    model.transformer.h[0].mlp.dropout = Shift()
    before = model_state(model)
    with pytest.raises(ValueError, match="Shift has a bias"):
        AttnLRP(model).shares(ids, target=[5, 17, 42], attention_mask=mask)
    assert model_state(model) == before


@pytest.mark.parametrize("side", ["right", "left"])
def test_given_positions_compute_their_logits_alone(monkeypatch, side):
    """A language model explained at given positions computes those positions' logits only
    (``logits_to_keep``), and the relevance is what all logits give."""
    from captum_attnflow.capture import lrp

    model = _model("llama").double()
    ids, mask = padded_batch(batch=3, n=7)
    if side == "left":
        ids, mask = _left(ids, mask)
    last = mask.sum(1) - 1 if side == "right" else torch.full((3,), 6)
    position = torch.stack([last - 1, last], 1)
    calls = []
    keep = lrp.kept_logits
    monkeypatch.setattr(lrp, "kept_logits", lambda *args: calls.append(keep(*args)) or calls[-1])
    kept = AttnLRP(model).attribute(ids, target=[[5, 9], [17, 3], [42, 8]], attention_mask=mask, position=position)
    assert calls[-1] is not None and calls[-1].numel() <= 6
    monkeypatch.setattr(lrp, "kept_logits", lambda *args: None)
    every = AttnLRP(model).attribute(ids, target=[[5, 9], [17, 3], [42, 8]], attention_mask=mask, position=position)
    torch.testing.assert_close(kept, every, atol=1e-12, rtol=0)


def test_float32_model_with_its_own_attention_matches_float64():
    model = _model("llama")  # sdpa, float32: the rules run in the model's dtype
    ids, mask = padded_batch(batch=3, n=7)
    target = torch.tensor([5, 17, 42])
    ours = AttnLRP(model).attribute(ids, target=target, attention_mask=mask)
    assert ours.dtype == torch.float32 and model.config._attn_implementation == "sdpa"
    expected = AttnLRP(_model("llama").double()).attribute(ids, target=target, attention_mask=mask)
    torch.testing.assert_close(ours.double(), expected, atol=1e-4, rtol=1e-4)


def test_all_of_the_logit_reaches_the_tokens_when_nothing_else_can_take_it():
    """A bias-free Llama (no position embeddings) whose attention writes nothing (values 0):
    RMSNorm's identity rule, the gated product's uniform rule and the bias-free linear layers
    conserve relevance, so the tokens share the logit exactly. With its values back, the softmax
    linearisation takes a share."""
    model = _model("llama")
    ids = torch.tensor([[3, 9, 27, 4, 11]])
    with_attention = AttnLRP(model).attribute(ids, target=7)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.v_proj.weight.zero_()
    with torch.no_grad():
        logit = model(ids).logits[0, -1, 7]
    relevance = AttnLRP(model).attribute(ids, target=7)
    assert float(relevance.sum()) == pytest.approx(float(logit), rel=1e-5)
    assert float(with_attention.sum()) != pytest.approx(float(logit), abs=1e-2)


def test_model_is_left_unchanged_also_after_an_error():
    model = _model("gpt2")
    model.transformer.h[0].attn.c_attn.weight.requires_grad_(False)
    model.train()
    before = model_state(model)
    ids, mask = padded_batch(batch=2, n=6)
    with torch.no_grad():  # enabled inside for the computation
        relevance = AttnLRP(model).attribute(ids, target=3, attention_mask=mask)
    assert relevance.abs().sum() > 0 and model_state(model) == before

    class Failing(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            self.model(input_ids)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        AttnLRP(Failing()).attribute(ids)
    assert model_state(model) == before


def test_inputs_positions_and_errors():
    model, tokenizer = load_agreement_model()
    batch = tokenizer(["the keys to the cabinet", "the key"], padding=True, return_tensors="pt")
    explainer = AttnLRP(model)
    expected = explainer.attribute(batch["input_ids"], target=1, attention_mask=batch["attention_mask"])
    torch.testing.assert_close(explainer.attribute(batch, target=1), expected)
    assert expected[1, 3:].eq(0).all()  # padding
    # a classifier's score is one for every position
    rows = explainer.attribute(batch, target=1, position=[0, 1])
    torch.testing.assert_close(rows, expected[:, None].expand(2, 2, 6))
    with pytest.raises(ValueError, match="layer=-1 or None"):
        explainer.attribute(batch, layer=2)
    roberta = _model("roberta")
    roberta.classifier.dropout = torch.nn.Dropout(0.1)
    roberta.classifier.dropout.forward = lambda x: 2 * x  # something between dense and tanh the table does not know
    with pytest.raises(ValueError, match="tanh of the previous layer's output"):
        AttnLRP(roberta).attribute(torch.tensor([[0, 5, 6, 2]]), target=0)


def test_language_model_wrapper_explains_each_token_by_its_own_logit():
    model, tokenizer = load_agreement_lm()
    method = AttnLRP(model)
    result = LLMAttentionAttribution(method, tokenizer).attribute("the keys to the cabinet", target="are .")
    ids = tokenizer("the keys to the cabinet are .", return_tensors="pt")["input_ids"]
    n_in = len(result.input_tokens)
    for t in range(2):
        single = method.attribute(ids, target=ids[0, n_in + t], position=n_in - 1 + t)
        torch.testing.assert_close(result.token_attr[t], single[0, :n_in])
        torch.testing.assert_close(result.output_attr[t, :t], single[0, n_in : n_in + t])
    # The modified backward pass is linear in the explained score: a contrast is a difference.
    are, is_ = tokenizer.convert_tokens_to_ids(["are", "is"])
    why = LLMAttentionAttribution(method, tokenizer).attribute("the keys to the cabinet", target="are", contrast_target="is")
    alone = method.attribute(ids, target=is_, position=n_in - 1)[0, :n_in]
    torch.testing.assert_close(why.token_attr[0], result.token_attr[0] - alone)
    assert int(ids[0, n_in]) == are
    batched = LLMAttentionAttribution(method, tokenizer).attribute(
        ["the keys to the cabinet", "the key"], target=["are .", "is"], padding_side="left"
    )
    torch.testing.assert_close(batched[0].token_attr, result.token_attr)


def test_registry_and_command_line(tmp_path, capsys):
    model, tokenizer = load_agreement_model()
    assert isinstance(METHODS["attnlrp"].build(model, tokenizer), AttnLRP)
    assert main(["explain", "the keys to the cabinet", "--method", "attnlrp", "--out", str(tmp_path / "e.png")]) == 0
    assert main(["generate", "the keys to the cabinet", "--method", "attnlrp", "--target", "are",
                 "--out", str(tmp_path / "g.png")]) == 0
    assert "attnlrp" in capsys.readouterr().out


def test_the_backward_pass_keeps_no_attention_map():
    """The model's own sdpa attention runs under the rules: no saved tensor of the backward pass
    has a head axis and two token axes (eager attention would keep every layer's probabilities)."""
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=60, n_embd=32, n_head=4, n_layer=2, n_positions=64, bos_token_id=0, eos_token_id=0
    )).eval()
    n = 24
    ids, mask = padded_batch(seed=2, batch=2, n=n)
    shapes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(t.shape) or t, lambda t: t):
        relevance = AttnLRP(model).attribute(ids, attention_mask=mask)
    assert relevance.shape == (2, n) and model.config._attn_implementation == "sdpa"
    assert not [shape for shape in shapes if len(shape) == 4 and shape[1] > 1 and shape[-2:] == (n, n)]
