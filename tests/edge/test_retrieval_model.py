"""Tests of the bundled retrieval language model, its accuracy measure and its training command."""

from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

from captum_attnflow import load_retrieval_model
from captum_attnflow.data import ask, build_retrieval_tokenizer, retrieval_examples
from captum_attnflow.data.retrieval import MAX_SOURCES
from captum_attnflow.models.retrieval import ASSET_DIR, answer_accuracy, answer_ids, retrieval_config
from captum_attnflow.models.train_retrieval import answer_loss, main, packed_batch, packed_questions


@pytest.fixture(scope="module")
def bundled():
    return load_retrieval_model()


def generated(model, tokenizer, example) -> str:
    inputs = tokenizer(example.text, return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    return tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def test_bundled_model_is_a_small_standard_qwen3_and_loads_offline(bundled):
    model, tokenizer = bundled
    assert isinstance(model, Qwen3ForCausalLM) and not model.training
    assert model.config._attn_implementation == "sdpa"
    assert set(model.config.layer_types) == {"full_attention"} and not model.config.use_sliding_window
    assert model.config.num_attention_heads == 4 and model.config.num_key_value_heads == 2
    longest = max(len(tokenizer(e.text)["input_ids"]) + 4 for e in retrieval_examples(50, sources=MAX_SOURCES, seed=3))
    assert longest <= model.config.max_position_embeddings
    assert sum(f.stat().st_size for f in ASSET_DIR.iterdir()) < 20 * 2**20
    assert AutoModelForCausalLM.from_pretrained(ASSET_DIR, local_files_only=True).config.model_type == "qwen3"


def test_bundled_model_answers_held_out_prompts_by_greedy_generation(bundled):
    model, tokenizer = bundled
    examples = [retrieval_examples(1, sources=count, seed=1000 + count)[0] for count in (4, 9, 23, 40, 64)]
    assert [generated(model, tokenizer, example) for example in examples] == [e.answer for e in examples]


def test_eval_results_meet_the_bar():
    results = json.loads((ASSET_DIR / "eval_results.json").read_text())
    assert results["accuracy"] >= 0.95 and results["n"] >= 1000 and results["sources"] == [4, MAX_SOURCES]
    assert sorted(results["by_sources"], key=int) == ["4", "8", "16", "32", "64"]
    assert all(result["accuracy"] >= 0.9 for result in results["by_sources"].values())


def test_answer_accuracy_agrees_with_greedy_generation(bundled):
    model, tokenizer = bundled
    examples = retrieval_examples(6, sources=(4, 64), seed=11)
    # a model that writes a wrong first word half the time: the answers of every other example swapped
    wrong = [e if i % 2 else type(e)(e.sources, e.question, examples[i + 1].answer, e.gold) for i, e in enumerate(examples)]
    expected = sum(generated(model, tokenizer, e) == e.answer for e in wrong) / len(wrong)
    assert answer_accuracy(model, tokenizer, wrong, batch_size=4) == {"n": 6, "accuracy": expected}


def test_packed_questions_are_computed_as_in_their_own_prompts():
    tokenizer = build_retrieval_tokenizer()
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(retrieval_config(tokenizer, num_hidden_layers=2)).eval()
    examples = retrieval_examples(3, sources=(3, 9), seed=4)
    rows = [packed_questions(example, tokenizer, 4, random.Random(1)) for example in examples]
    batch = packed_batch(rows, tokenizer.pad_token_id)
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


def test_config_is_a_full_attention_qwen3_with_the_tokenizers_ids():
    tokenizer = build_retrieval_tokenizer()
    config = retrieval_config(tokenizer, num_hidden_layers=1)
    assert (config.vocab_size, config.bos_token_id, config.eos_token_id, config.pad_token_id) == (len(tokenizer), 2, 3, 0)
    assert config.num_hidden_layers == 1 and config.sliding_window is None


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
    assert tokenizer("Bob's home city is Lima.")["input_ids"][0] == tokenizer.bos_token_id


def test_loading_from_a_directory_without_a_model_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="train_retrieval --out DIR"):
        load_retrieval_model(tmp_path)
