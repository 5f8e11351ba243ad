"""Tests of the agreement data generator and the word-level tokenizer."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from captum_attnflow.data import (
    AgreementExample,
    build_tokenizer,
    encode_examples,
    generate_examples,
    is_held_out,
    vocabulary,
)
from captum_attnflow.data.agreement import NOUNS, PLURAL, SINGULAR

NUMBER_OF_NOUN = {noun: number for pair in NOUNS for number, noun in enumerate(pair)}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_deterministic_for_a_seed_and_different_across_seeds():
    assert generate_examples(50, seed=7) == generate_examples(50, seed=7)
    assert generate_examples(50, seed=7) != generate_examples(50, seed=8)
    assert generate_examples(10, seed=7) == generate_examples(50, seed=7)[:10]


def check_example(example: AgreementExample, max_attractors: int = 3) -> None:
    words = example.words
    assert example.label in (SINGULAR, PLURAL)
    assert NUMBER_OF_NOUN[words[example.subject_index]] == example.label
    assert len(example.attractor_indices) <= max_attractors
    assert list(example.attractor_indices) == sorted(set(example.attractor_indices))
    for i, word in enumerate(words):
        if i == example.subject_index or word not in NUMBER_OF_NOUN:
            continue
        is_attractor = NUMBER_OF_NOUN[word] != example.label
        assert (i in example.attractor_indices) == is_attractor, (example.sentence, i)
    assert set(words) <= set(vocabulary())


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), max_attractors=st.integers(0, 3), split=st.sampled_from(["train", "test"]))
def test_labels_subjects_and_attractors_are_consistent(seed, max_attractors, split):
    examples = generate_examples(20, seed=seed, max_attractors=max_attractors, split=split)
    assert len(examples) == 20
    for example in examples:
        check_example(example, max_attractors)
        assert is_held_out(example.words) == (split == "test")


def test_the_subject_is_not_always_the_first_noun_and_attractor_counts_are_spread():
    examples = generate_examples(2000, seed=0)
    first_noun = [min(i for i, w in enumerate(e.words) if w in NUMBER_OF_NOUN) for e in examples]
    assert sum(f != e.subject_index for f, e in zip(first_noun, examples)) > 100
    counts = [e.num_attractors for e in examples]
    assert all(350 < counts.count(k) < 650 for k in range(4))
    assert 900 < sum(e.label for e in examples) < 1100


def test_train_and_test_splits_are_disjoint():
    train = {e.sentence for e in generate_examples(3000, seed=0)}
    test = {e.sentence for e in generate_examples(1000, seed=0, split="test")}
    assert train and test and not train & test


def test_a_hand_written_example_round_trips():
    example = AgreementExample("the key to the cabinets".split(), SINGULAR, 1, (4,))
    check_example(example)
    assert example.sentence == "the key to the cabinets" and example.num_attractors == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_examples=-1), "num_examples"),
        (dict(num_examples=2, max_attractors=4), "max_attractors"),
        (dict(num_examples=2, split="dev"), "split"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate_examples(**kwargs)


def test_tokenizer_special_tokens_and_round_trip(tokenizer):
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == ["[PAD]", "[UNK]", "[CLS]", "[MASK]"]
    assert (tokenizer.pad_token, tokenizer.unk_token, tokenizer.cls_token, tokenizer.mask_token) == (
        "[PAD]", "[UNK]", "[CLS]", "[MASK]"
    )
    assert len(tokenizer) == 4 + len(vocabulary())
    ids = tokenizer("The key to the Cabinets , here")["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == ["[CLS]", "the", "key", "to", "the", "cabinets", ",", "here"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "the key to the cabinets , here"
    assert tokenizer.convert_ids_to_tokens(tokenizer("the zebra")["input_ids"]) == ["[CLS]", "the", "[UNK]"]
    for example in generate_examples(30, seed=3):
        assert tokenizer.decode(tokenizer(example.sentence)["input_ids"], skip_special_tokens=True) == example.sentence


def test_tokenizer_survives_save_and_load(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "several keys that the man near the cabinet likes"
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert loaded.padding_side == "right"


def test_encode_examples_positions_padding_and_labels(tokenizer):
    examples = generate_examples(40, seed=5)
    batch = encode_examples(examples, tokenizer)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    n = max(len(e.words) for e in examples) + 1
    assert ids.shape == mask.shape == (40, n)
    assert batch["labels"].tolist() == [e.label for e in examples]
    assert (ids[:, 0] == tokenizer.cls_token_id).all()
    for row, example in enumerate(examples):
        length = len(example.words) + 1
        assert mask[row].tolist() == [1] * length + [0] * (n - length)
        assert (ids[row, length:] == tokenizer.pad_token_id).all()
        tokens = tokenizer.convert_ids_to_tokens(ids[row, :length].tolist())
        assert tokens[1:] == example.words
        assert tokens[batch["subject_positions"][row]] == example.words[example.subject_index]
        positions = batch["attractor_positions"][row].tolist()
        assert positions == [i + 1 for i in example.attractor_indices] + [-1] * (len(positions) - example.num_attractors)
    assert batch["attractor_positions"].shape[1] == max(e.num_attractors for e in examples)


def test_encode_examples_without_attractors_and_empty(tokenizer):
    batch = encode_examples(generate_examples(3, seed=1, max_attractors=0), tokenizer)
    assert batch["attractor_positions"].tolist() == [[-1]] * 3
    assert batch["input_ids"].dtype == torch.long
    with pytest.raises(ValueError, match="at least one"):
        encode_examples([], tokenizer)

@given(st.integers(0, 2**16), st.integers(4, 12))
@settings(max_examples=20, deadline=None)
def test_max_words_and_attractor_weights_shape_the_examples(seed, max_words):
    examples = generate_examples(30, seed=seed, max_words=max_words, attractor_weights=(1, 0, 0, 0))
    assert all(len(example.words) <= max_words for example in examples)
    assert all(example.num_attractors == 0 for example in examples)
    with_one = generate_examples(30, seed=seed, max_attractors=1, attractor_weights=(0, 1))
    assert all(example.num_attractors == 1 for example in with_one)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(attractor_weights=(1, 1)), "attractor_weights must give 4 non-negative weights"),
        (dict(attractor_weights=(0, 0, 0, 0)), "not all 0"),
        (dict(max_words=1), "max_words must be an int >= 2"),
    ],
)
def test_bad_distribution_arguments_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate_examples(3, **kwargs)
