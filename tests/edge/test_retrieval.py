"""Tests of the retrieval prompts' generator and tokenizer."""

from __future__ import annotations

import re

import pytest
import torch
from captum.attr import TextTemplateInput
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerFast

from captum_attnflow.data import RetrievalExample, ask, build_retrieval_tokenizer, retrieval_examples
from captum_attnflow.data.retrieval import ATTRIBUTES, MAX_SOURCES, NAMES

# The fact a source states, read independently of the generator's own parsing.
FACT = re.compile(r"(?P<name>[A-Z][a-z]+): (?P<value>[A-Za-z ]+) \((?P<attribute>[a-z]+ [a-z]+)\)\.")
ASKED = re.compile(r"What is (?P<name>[A-Z][a-z]+)'s (?P<attribute>[a-z]+ [a-z]+)\?")


@pytest.fixture(scope="module")
def tokenizer():
    return build_retrieval_tokenizer()


def facts(example: RetrievalExample) -> list[tuple[str, str, str]]:
    matches = [FACT.fullmatch(source) for source in example.sources]
    assert all(matches), example.sources
    return [(m["name"], m["attribute"], m["value"]) for m in matches]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), count=st.integers(1, MAX_SOURCES))
def test_only_the_gold_source_answers_the_question_and_holds_the_answer(seed, count):
    example = retrieval_examples(1, sources=count, seed=seed)[0]
    stated = facts(example)
    asked = ASKED.fullmatch(example.question)
    assert len(example.sources) == count and 0 <= example.gold < count
    assert stated[example.gold] == (asked["name"], asked["attribute"], example.answer)
    assert example.answer in ATTRIBUTES[asked["attribute"]] and asked["name"] in NAMES
    assert len({(name, attribute) for name, attribute, _ in stated}) == count  # nothing stated twice
    answer_words = set(example.answer.split())
    for index, source in enumerate(example.sources):
        if index != example.gold:
            assert (stated[index][0], stated[index][1]) != (asked["name"], asked["attribute"])
            assert not answer_words & set(re.findall(r"\w+", source)), source


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), count=st.integers(2, MAX_SOURCES))
def test_distractors_share_the_person_or_the_attribute(seed, count):
    example = retrieval_examples(1, sources=count, seed=seed)[0]
    name, attribute, _ = facts(example)[example.gold]
    others = [fact for index, fact in enumerate(facts(example)) if index != example.gold]
    same_name = sum(fact[0] == name for fact in others)
    same_attribute = sum(fact[1] == attribute for fact in others)
    assert same_name + same_attribute >= 1
    if count >= 3:
        assert same_name >= 1 and same_attribute >= 1


def test_every_word_of_the_attributes_is_unique_to_one_value():
    words = [word for values in ATTRIBUTES.values() for value in values for word in value.split()]
    assert len(words) == len(set(words))
    assert not set(words) & set(NAMES) and not set(words) & {w for a in ATTRIBUTES for w in a.split()}
    assert all(len(attribute.split()) == 2 for attribute in ATTRIBUTES)


def test_deterministic_for_a_seed_and_different_across_seeds():
    assert retrieval_examples(20, sources=(4, 64), seed=7) == retrieval_examples(20, sources=(4, 64), seed=7)
    assert retrieval_examples(20, sources=(4, 64), seed=7) != retrieval_examples(20, sources=(4, 64), seed=8)


def test_source_counts_fixed_and_in_a_range():
    assert {len(e.sources) for e in retrieval_examples(10, sources=5)} == {5}
    counts = [len(e.sources) for e in retrieval_examples(300, sources=(4, 64), seed=2)]
    assert min(counts) == 4 and max(counts) == 64
    assert {len(e.sources) for e in retrieval_examples(50, sources=[1, 2], seed=2)} == {1, 2}
    assert retrieval_examples(0) == []


def test_gold_positions_spread_over_the_prompt():
    positions = [e.gold / (len(e.sources) - 1) for e in retrieval_examples(400, sources=16, seed=3)]
    assert sum(p < 0.25 for p in positions) > 50 and sum(p > 0.75 for p in positions) > 50


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(count=-1), ValueError, "count must be an int >= 0"),
        (dict(count=2.0), ValueError, "count must be an int >= 0"),
        (dict(count=1, sources=0), ValueError, r"sources must lie in 1\.\.64"),
        (dict(count=1, sources=65), ValueError, r"sources must lie in 1\.\.64"),
        (dict(count=1, sources=(8, 4)), ValueError, "low <= high"),
        (dict(count=1, sources=(0, 4)), ValueError, r"1\.\.64"),
        (dict(count=1, sources="8"), TypeError, "an int or a pair of ints"),
        (dict(count=1, sources=(1, 2, 3)), TypeError, "an int or a pair of ints"),
        (dict(count=1, sources=True), TypeError, "an int or a pair of ints"),
    ],
)
def test_bad_arguments_raise(kwargs, error, message):
    with pytest.raises(error, match=message):
        retrieval_examples(**kwargs)


def test_the_prompt_is_a_template_over_the_sources():
    example = retrieval_examples(1, sources=6, seed=4)[0]
    prompt = example.prompt
    assert isinstance(prompt, TextTemplateInput) and prompt.values == list(example.sources)
    assert prompt.to_model_input() == example.text == "\n".join([*example.sources, f"Question: {example.question}", "Answer:"])
    removed = torch.ones(1, 6, dtype=torch.long)
    removed[0, example.gold] = 0
    assert example.sources[example.gold] not in prompt.to_model_input(removed)


def test_ask_poses_the_question_of_any_source():
    example = retrieval_examples(1, sources=12, seed=5)[0]
    assert ask(example, example.gold) == example
    for index, (name, attribute, value) in enumerate(facts(example)):
        asked = ask(example, index)
        assert (asked.question, asked.answer, asked.gold, asked.sources) == (
            f"What is {name}'s {attribute}?", value, index, example.sources)
    with pytest.raises(ValueError, match="outside the example's 12 sources"):
        ask(example, 12)
    with pytest.raises(ValueError, match="not of the form"):
        ask(RetrievalExample(("Bob likes tea.",), "What is Bob's favourite drink?", "tea", 0), 0)


def test_tokenizer_special_tokens_no_unknown_words_and_left_padding(tokenizer):
    assert tokenizer.convert_ids_to_tokens(list(range(4))) == ["<pad>", "<unk>", "<s>", "</s>"]
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 2, 3)
    for example in retrieval_examples(50, sources=(1, 64), seed=6):
        ids = tokenizer(example.text)["input_ids"]
        assert ids[0] == tokenizer.bos_token_id and tokenizer.unk_token_id not in ids
        assert tokenizer.decode(tokenizer(example.answer, add_special_tokens=False)["input_ids"]) == example.answer
    batch = tokenizer(["Bob: Lima (home city).", "Lima."], padding=True)
    assert batch["input_ids"][1][:6] == [0] * 6 and batch["attention_mask"][1] == [0] * 6 + [1] * 3


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10**6), count=st.integers(1, MAX_SOURCES))
def test_offsets_map_every_token_to_its_characters_and_sources_to_their_tokens(seed, count):
    tokenizer = build_retrieval_tokenizer()
    example = retrieval_examples(1, sources=count, seed=seed)[0]
    encoded = tokenizer(example.text, return_offsets_mapping=True)
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    assert encoded["offset_mapping"][0] == (0, 0)  # <s> covers no character
    assert [example.text[start:end] for start, end in encoded["offset_mapping"][1:]] == tokens[1:]
    start = 0
    for source in example.sources:  # each source's span holds exactly its own words
        inside = [t for t, (s, e) in zip(tokens, encoded["offset_mapping"]) if start <= s and e <= start + len(source) and e > s]
        assert inside == tokenizer.tokenize(source)
        start += len(source) + 1


def test_tokenizer_survives_save_and_load(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    text = retrieval_examples(1, sources=8, seed=9)[0].text
    assert loaded(text, return_offsets_mapping=True) == tokenizer(text, return_offsets_mapping=True)
    assert (loaded.eos_token, loaded.bos_token, loaded.padding_side) == ("</s>", "<s>", "left")
