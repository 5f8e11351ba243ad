"""Tests of the paper's agreement model, its training command and the bundled checkpoint."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from captum_attnflow import extract_attentions, load_agreement_model
from captum_attnflow.data import build_tokenizer, encode_examples, generate_examples
from captum_attnflow.models import AgreementConfig, AgreementModel
from captum_attnflow.models.train import END_TOKEN, with_end_token
from captum_attnflow.models.bundled import ASSET_DIR
from captum_attnflow.models.train import evaluate, main


def tiny_model(**overrides) -> AgreementModel:
    torch.manual_seed(0)
    config = AgreementConfig(**{"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4, **overrides})
    return AgreementModel(config).eval()


@pytest.fixture(scope="module")
def batch():
    return encode_examples(generate_examples(6, seed=2), build_tokenizer())


def test_paper_sizes_by_default():
    config = AgreementConfig()
    assert (config.num_hidden_layers, config.num_attention_heads, config.hidden_size) == (6, 8, 128)
    assert config.vocab_size == len(build_tokenizer()) and config.num_labels == 2


def test_forward_shapes_loss_and_embeddings(batch):
    model = tiny_model()
    out = model(batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    assert out.logits.shape == (6, 2)
    assert torch.allclose(out.loss, torch.nn.functional.cross_entropy(out.logits, batch["labels"]))
    assert model.get_input_embeddings() is model.wte
    embedded = model(inputs_embeds=model.wte(batch["input_ids"]), attention_mask=batch["attention_mask"]).logits
    assert torch.allclose(embedded, out.logits, atol=1e-6)


def test_attention_is_not_causal():
    model = tiny_model()
    ids = torch.tensor([[2, 10, 11, 12, 13]])
    changed = ids.clone()
    changed[0, -1] = 20
    assert not torch.allclose(model(ids).logits, model(changed).logits)
    model.set_attn_implementation("eager")
    attentions = model(ids, output_attentions=True).attentions
    assert (attentions[0][0, :, 0, -1] > 0).all()


def test_padding_does_not_change_the_prediction(batch):
    model = tiny_model()
    row = 1
    length = int(batch["attention_mask"][row].sum())
    alone = model(batch["input_ids"][row : row + 1, :length]).logits
    padded = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits[row : row + 1]
    assert length < batch["input_ids"].shape[1]
    assert torch.allclose(alone, padded, atol=1e-5)


def test_sdpa_and_eager_agree_and_eager_returns_attentions(batch):
    model = tiny_model()
    assert model.config._attn_implementation == "sdpa"
    args = (batch["input_ids"],)
    kwargs = dict(attention_mask=batch["attention_mask"], output_attentions=True)
    sdpa = model(*args, **kwargs)
    model.set_attn_implementation("eager")
    eager = model(*args, **kwargs)
    assert torch.allclose(sdpa.logits, eager.logits, atol=1e-5)
    assert len(eager.attentions) == 2 and eager.attentions[0].shape == (6, 4, *args[0].shape[1:] * 2)


def test_extract_attentions_under_sdpa_gives_one_map_per_layer(batch):
    model = AgreementModel(AgreementConfig()).eval()
    ids, mask = batch["input_ids"], batch["attention_mask"]
    attentions = extract_attentions(model, ids, attention_mask=mask)
    n = ids.shape[1]
    assert len(attentions) == 6 and all(a.shape == (6, 8, n, n) for a in attentions)
    real = mask.bool()
    for a in attentions:
        assert torch.allclose(a.sum(-1)[real[:, None, :].expand(-1, 8, -1)], torch.ones(()), atol=1e-5)
        assert (a.masked_select(~real[:, None, None, :]) == 0).all()
    assert model.config._attn_implementation == "sdpa" and not model.training


def test_save_and_load_round_trip(tmp_path, batch):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    loaded = AgreementModel.from_pretrained(tmp_path).eval()
    assert loaded.config._attn_implementation == "sdpa"
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert torch.equal(loaded(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits)


def test_bad_inputs_raise():
    model = tiny_model(max_position_embeddings=8)
    with pytest.raises(ValueError, match="exactly one"):
        model()
    with pytest.raises(ValueError, match=r"\(B, n\)"):
        model(torch.tensor([2, 10]))
    with pytest.raises(ValueError, match="positions"):
        model(torch.full((1, 9), 5))


def test_evaluate_counts_against_a_constant_classifier():
    examples = generate_examples(50, seed=4)

    class Singular(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, attention_mask=None):
            return SimpleNamespace(logits=torch.tensor([[1.0, 0.0]]).expand(len(input_ids), 2))

    results = evaluate(Singular(), build_tokenizer(), examples, batch_size=16)
    singular = [e.label == 0 for e in examples]
    assert results["accuracy"] == sum(singular) / 50 and results["n"] == 50
    with_attractors = [s for s, e in zip(singular, examples) if e.num_attractors]
    assert results["accuracy_with_attractors"] == sum(with_attractors) / len(with_attractors)
    for k in range(4):
        group = [s for s, e in zip(singular, examples) if e.num_attractors == k]
        assert results[f"n_{k}_attractors"] == len(group)
        assert results[f"accuracy_{k}_attractors"] == sum(group) / len(group)


def test_training_command_writes_a_loadable_checkpoint(tmp_path, capsys):
    main(["--out", str(tmp_path), "--steps", "3", "--batch-size", "8", "--warmup", "1", "--eval-examples", "16"])
    assert "held-out accuracy" in capsys.readouterr().out
    results = json.loads((tmp_path / "eval_results.json").read_text())
    assert results["n"] == 16 and results["settings"]["steps"] == 3
    model = AgreementModel.from_pretrained(tmp_path)
    assert model.config.num_hidden_layers == 6
    loaded, tokenizer = load_agreement_model(tmp_path)
    assert not loaded.training and tokenizer("the key")["input_ids"][0] == tokenizer.cls_token_id
    for name, value in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value)


def test_loading_shows_no_progress_bar_and_leaves_transformers_setting(capsys):
    from transformers.utils import logging as transformers_logging

    assert transformers_logging.is_progress_bar_enabled()
    load_agreement_model()
    assert transformers_logging.is_progress_bar_enabled()
    assert "Loading weights" not in capsys.readouterr().err


def test_loading_from_a_directory_without_a_model_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="no saved model.*models.train --out DIR"):
        load_agreement_model(tmp_path)


def test_bundled_model_is_small_offline_and_accurate():
    assert (ASSET_DIR / "model.safetensors").stat().st_size < 10 * 2**20
    model, tokenizer = load_agreement_model()
    assert not model.training and model.config._attn_implementation == "sdpa"
    examples = generate_examples(300, seed=123, split="test")
    assert evaluate(model, tokenizer, examples)["accuracy"] > 0.9
    batch = tokenizer(["the keys to the cabinet", "the key to the cabinets"], return_tensors="pt")
    assert model(**batch).logits.argmax(-1).tolist() == [1, 0]

def test_end_token_tokenizer_survives_saving(tmp_path):
    with_end_token(build_tokenizer()).save_pretrained(tmp_path)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    batch = tokenizer([["the", "keys"], ["a", "dog", "near", "the", "cabinets"]], is_split_into_words=True, padding=True)
    tokens = [tokenizer.convert_ids_to_tokens(ids) for ids in batch["input_ids"]]
    assert tokens == [["[CLS]", "the", "keys", END_TOKEN, "[PAD]", "[PAD]", "[PAD]"],
                      ["[CLS]", "a", "dog", "near", "the", "cabinets", END_TOKEN]]
