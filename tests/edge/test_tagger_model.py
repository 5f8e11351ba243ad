"""The bundled chunk tagger and its training command."""

from __future__ import annotations

import json

import pytest

from captum_attnflow.adversarial.tasks import chunking_task
from captum_attnflow.data import CHUNK_TAGS, generate_chunked_examples
from captum_attnflow.models import load_chunk_tagger
from captum_attnflow.models.tagger import TAGGER_DIR
from captum_attnflow.adversarial.train_tagger import main


def test_bundled_tagger_is_small_offline_and_tags_held_out_sentences():
    assert (TAGGER_DIR / "model.safetensors").stat().st_size < 2**20
    model, tokenizer = load_chunk_tagger()
    assert not model.training and model.config._attn_implementation == "sdpa"
    assert model.config.num_hidden_layers == 4
    # Held-out sentences of another seed than the training command measured on.
    assert chunking_task(train_examples=1, test_examples=256, seed=7).score(model) > 0.95
    for example in generate_chunked_examples(4, seed=3, split="test"):
        batch = tokenizer([list(example.words)], is_split_into_words=True, return_tensors="pt")
        assert tuple(CHUNK_TAGS[i] for i in model(**batch).logits[0, 1:].argmax(-1)) == example.tags


def test_training_command_writes_a_loadable_checkpoint(tmp_path, capsys):
    main(["--out", str(tmp_path), "--steps", "3", "--train-examples", "64", "--eval-examples", "32"])
    assert "held-out chunk F1" in capsys.readouterr().out
    results = json.loads((tmp_path / "eval_results.json").read_text())
    assert results["n"] == 32 and results["settings"]["steps"] == 3 and 0 <= results["chunk_f1"] <= 1
    model, tokenizer = load_chunk_tagger(tmp_path)
    assert model(**tokenizer(["the key"], return_tensors="pt")).logits.shape == (1, 3, len(CHUNK_TAGS))


def test_a_directory_without_a_model_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="train_tagger --out DIR"):
        load_chunk_tagger(tmp_path)
