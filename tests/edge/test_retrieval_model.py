"""Tests of the retrieval language model's configuration, its training rows and its training command."""

from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import Qwen3ForCausalLM

from captum_attnflow.models import load_retrieval_model
from captum_attnflow.data import ask, build_retrieval_tokenizer, retrieval_examples
from captum_attnflow.data.retrieval import NAMES
from captum_attnflow.models.retrieval import answer_ids, retrieval_config
from captum_attnflow.models.train_retrieval import answer_loss, main, packed_batch, packed_questions


def test_packed_questions_are_computed_as_in_their_own_prompts():
    tokenizer = build_retrieval_tokenizer()
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(retrieval_config(tokenizer, num_hidden_layers=2)).eval()
    examples = retrieval_examples(3, sources=(3, 9), seed=4)
    rows = [packed_questions(example, tokenizer, 4, random.Random(1)) for example in examples]
    batch = packed_batch(rows, tokenizer.pad_token_id, model.config.sliding_window)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]).logits
    for index, (example, row) in enumerate(zip(examples, rows)):
        # each source's question as a prompt of its own, followed by its answer and </s>
        alone = {}
        for source in range(len(example.sources)):
            asked = ask(example, source)
            alone[tuple(tokenizer(asked.text)["input_ids"] + answer_ids(asked, tokenizer))] = (source, answer_ids(asked, tokenizer))
        blocks = []
        for block in range(1, max(row["blocks"]) + 1):
            kept = [i for i, b in enumerate(row["blocks"]) if b in (0, block)]
            ids = [row["input_ids"][i] for i in kept]
            source, answer = alone[tuple(ids)]
            blocks.append(source)
            torch.testing.assert_close(logits[index, kept], model(torch.tensor([ids])).logits[0], atol=1e-4, rtol=1e-4)
            assert [row["labels"][i] for i in kept if row["labels"][i] != -100] == answer
        assert blocks[0] == example.gold and len(set(blocks)) == len(blocks) == 4
    assert answer_loss(model, batch).item() > 0


def test_config_windows_the_first_layer_only_with_the_tokenizers_ids():
    tokenizer = build_retrieval_tokenizer()
    config = retrieval_config(tokenizer, num_hidden_layers=2)
    assert (config.vocab_size, config.bos_token_id, config.eos_token_id, config.pad_token_id) == (len(tokenizer), 2, 3, 0)
    assert config.layer_types == ["sliding_attention", "full_attention"] and config.sliding_window == 8


def test_the_window_holds_a_facts_person_and_no_other_facts():
    """In the first layer a value token reads its own fact's person, never another fact's."""
    tokenizer = build_retrieval_tokenizer()
    window = retrieval_config(tokenizer).sliding_window
    names = set(tokenizer.convert_tokens_to_ids(list(NAMES)))
    for example in retrieval_examples(20, sources=(4, 16), seed=2):
        ids = tokenizer(example.text)["input_ids"]
        for fact in example.sources:
            value = tokenizer(fact.split(": ", 1)[1].rsplit(" (", 1)[0], add_special_tokens=False)["input_ids"][0]
            for position in [i for i, token in enumerate(ids) if token == value]:
                seen = [ids[i] for i in range(max(0, position - window + 1), position) if ids[i] in names]
                assert seen == tokenizer(fact, add_special_tokens=False)["input_ids"][:1]


def test_training_command_writes_a_loadable_checkpoint(tmp_path, capsys):
    torch.manual_seed(0)
    main(["--out", str(tmp_path), "--steps", "2", "--batch-size", "256", "--layers", "1", "--eval-examples", "4",
          "--count-examples", "2", "--log-every", "1", "--threads", str(torch.get_num_threads())])
    out = capsys.readouterr().out
    assert "step 2:" in out and "held-out answer accuracy over 4-64 sources" in out
    results = json.loads((tmp_path / "eval_results.json").read_text())
    assert results["n"] == 4 and results["settings"]["steps"] == 2 and results["by_sources"]["4"]["n"] == 2
    model, tokenizer = load_retrieval_model(tmp_path)
    assert not model.training and model.config.num_hidden_layers == 1
    assert tokenizer("Bob: Lima (home city).")["input_ids"][0] == tokenizer.bos_token_id


def test_loading_from_a_directory_without_a_model_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="train_retrieval --out DIR"):
        load_retrieval_model(tmp_path)


def test_the_bundled_model_answers_held_out_prompts_as_its_eval_results_say():
    from captum_attnflow.models.retrieval import ASSET_DIR, answer_accuracy

    results = json.loads((ASSET_DIR / "eval_results.json").read_text())
    assert results["n"] >= 1000 and results["accuracy"] >= 0.95
    assert all(results["by_sources"][str(count)]["accuracy"] >= 0.9 for count in (4, 8, 16, 32, 64))
    model, tokenizer = load_retrieval_model()
    assert model.config.layer_types[0] == "sliding_attention" and (ASSET_DIR / "model.safetensors").stat().st_size < 20e6
    assert answer_accuracy(model, tokenizer, retrieval_examples(48, sources=(4, 64), seed=77))["accuracy"] >= 0.9
