"""Gold chunk tags of the generated sentences, their spans and chunk F1 (CoNLL-2000)."""

from __future__ import annotations


import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from captum_attnflow.data import (
    CHUNK_TAGS,
    build_tokenizer,
    chunk_f1,
    chunk_spans,
    encode_chunked,
    generate_chunked_examples,
    generate_examples,
)
from captum_attnflow.data.agreement import (
    ADJECTIVES,
    ADVERBS,
    AMBIGUOUS_DETERMINERS,
    NOUNS,
    NUMBER_DETERMINERS,
    PREPOSITIONS,
    SAY_VERBS,
    VERBS,
)
from captum_attnflow.data.chunking import decode_tags

NOUN_WORDS = {w for pair in NOUNS for w in pair}
VERB_WORDS = {w for pair in VERBS + SAY_VERBS for w in pair}
DETERMINERS = {*AMBIGUOUS_DETERMINERS, *NUMBER_DETERMINERS[0], *NUMBER_DETERMINERS[1]}
ADVERB_PHRASES = {tuple(w for w in adverb if w != ",") for adverb in ADVERBS}


def check_tags(words, tags, subject_index):
    assert len(tags) == len(words) and set(tags) <= set(CHUNK_TAGS)
    spans = chunk_spans(tags)
    # The chunks and the O words partition the sentence, and no I- tag opens a chunk.
    covered = sorted(i for _, start, end in spans for i in range(start, end))
    assert covered == [i for i, tag in enumerate(tags) if tag != "O"]
    assert all(tags[start].startswith("B-") for _, start, _ in spans)
    for kind, start, end in spans:
        chunk = words[start:end]
        if kind == "NP":  # determiner, optional adjective, noun
            assert chunk[0] in DETERMINERS and chunk[-1] in NOUN_WORDS and len(chunk) in (2, 3)
            assert len(chunk) == 2 or chunk[1] in ADJECTIVES
        elif kind == "PP":  # one preposition, then a noun phrase
            assert len(chunk) == 1 and chunk[0] in PREPOSITIONS and tags[end] == "B-NP"
        elif kind == "VP":
            assert len(chunk) == 1 and chunk[0] in VERB_WORDS
        elif kind == "SBAR":
            assert chunk == ["that"]
        else:
            assert kind == "ADVP" and tuple(chunk) in ADVERB_PHRASES and start == 0
    assert [words[i] for i, tag in enumerate(tags) if tag == "O"] == ["," for tag in tags if tag == "O"]
    # Every noun ends a noun phrase; the subject is one of them.
    noun_ends = {end - 1 for kind, _, end in spans if kind == "NP"}
    assert {i for i, w in enumerate(words) if w in NOUN_WORDS} == noun_ends
    assert subject_index in noun_ends


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31), max_attractors=st.integers(0, 3), split=st.sampled_from(["train", "test"]))
def test_tags_are_consistent_with_the_sentences(seed, max_attractors, split):
    chunked = generate_chunked_examples(30, seed=seed, max_attractors=max_attractors, split=split)
    plain = generate_examples(30, seed=seed, max_attractors=max_attractors, split=split)
    assert [c.words for c in chunked] == [tuple(p.words) for p in plain]
    for c, p in zip(chunked, plain):
        check_tags(list(c.words), c.tags, p.subject_index)


def test_every_tag_occurs():
    tags = {tag for example in generate_chunked_examples(500, seed=1) for tag in example.tags}
    assert tags == set(CHUNK_TAGS)


def test_chunk_spans_follow_conlleval():
    # I- after O or after another type opens a chunk; B- always does.
    assert chunk_spans(["I-NP", "I-NP", "O", "B-VP", "I-NP", "B-NP", "B-NP"]) == [
        ("NP", 0, 2), ("VP", 3, 4), ("NP", 4, 5), ("NP", 5, 6), ("NP", 6, 7)
    ]
    assert chunk_spans([]) == [] and chunk_spans(["O", "O"]) == []
    with pytest.raises(ValueError, match="BIO tags"):
        chunk_spans(["B-NP", "X"])


def test_chunk_f1_hand_values():
    gold = [["B-NP", "I-NP", "B-PP", "B-NP", "I-NP"], ["B-VP", "O"]]
    # 4 gold chunks. Predicted: NP right, PP right, second NP cut short, VP labelled NP: 2 of 5.
    predicted = [["B-NP", "I-NP", "B-PP", "B-NP", "B-NP"], ["B-NP", "O"]]
    scores = chunk_f1(gold, predicted)
    assert scores["precision"] == pytest.approx(2 / 5) and scores["recall"] == pytest.approx(2 / 4)
    assert scores["f1"] == pytest.approx(2 * 0.4 * 0.5 / 0.9)
    assert chunk_f1(gold, gold) == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    assert chunk_f1([["O"]], [["O"]])["f1"] == 0.0
    with pytest.raises(ValueError, match="one tag sequence per sentence"):
        chunk_f1(gold, predicted[:1])
    with pytest.raises(ValueError, match="tag every word once"):
        chunk_f1([["B-NP"]], [["B-NP", "O"]])


def test_encode_and_decode_round_trip():
    examples = generate_chunked_examples(6, seed=2)
    batch = encode_chunked(examples, build_tokenizer())
    assert batch["labels"].shape == batch["input_ids"].shape
    assert (batch["labels"][:, 0] == -100).all()
    assert ((batch["labels"] == -100) == (batch["attention_mask"] == 0)).logical_or(
        torch.arange(batch["labels"].shape[1]) == 0
    ).all()
    assert decode_tags(batch["labels"].clamp_min(0), batch["attention_mask"]) == [list(e.tags) for e in examples]
