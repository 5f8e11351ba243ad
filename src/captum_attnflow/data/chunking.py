"""Chunking (shallow parsing) on the agreement generator's sentences: gold BIO tags and chunk F1.

The generator builds every sentence from phrases it knows (:mod:`captum_attnflow.data.agreement`),
so its chunk tags are gold by construction, in the CoNLL-2000 scheme (Tjong Kim Sang &
Buchholz 2000): a noun phrase ``NP`` is determiner, optional adjective and noun; a
preposition is a one-word ``PP`` chunk before its ``NP``; a verb is a ``VP``; the
complementizer ``that`` is an ``SBAR``; the fronted adverbs (``here``, ``of course``) are
``ADVP``; commas are outside any chunk (``O``). ``that`` is also a determiner and ``of`` also a
preposition, so a tagger needs the context for some words. Yang's probing study tags chunks
with a one-layer transformer; :mod:`captum_attnflow.models.tagger` is that tagger.

Example::

    >>> example = generate_chunked_examples(1, seed=5)[0]
    >>> list(zip(example.words, example.tags))[:4]
    [('her', 'B-NP'), ('small', 'I-NP'), ('books', 'I-NP'), ('think', 'B-VP')]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerFast

from captum_attnflow.data.agreement import _generate

# Every tag the generator produces; a tagger's label i is CHUNK_TAGS[i].
CHUNK_TAGS: tuple[str, ...] = ("O", "B-NP", "I-NP", "B-PP", "B-VP", "B-SBAR", "B-ADVP", "I-ADVP")
# Label of the positions a tagger is not scored on ([CLS], padding), as transformers' losses skip.
IGNORE_INDEX = -100


@dataclass(frozen=True)
class ChunkedExample:
    """A generated sentence with one BIO chunk tag per word.

    Attributes:
        words: the words, as :attr:`~captum_attnflow.data.AgreementExample.words`.
        tags: ``len(words)`` tags from :data:`CHUNK_TAGS`.

    Example::

        >>> ChunkedExample(("the", "key"), ("B-NP", "I-NP")).tags
        ('B-NP', 'I-NP')
    """

    words: tuple[str, ...]
    tags: tuple[str, ...]


def generate_chunked_examples(
    num_examples: int, seed: int = 0, max_attractors: int = 3, split: str = "train"
) -> list[ChunkedExample]:
    """The sentences of :func:`~captum_attnflow.data.generate_examples` with their gold chunk tags.

    Same arguments, same sentences in the same order; the held-out split is disjoint from
    the training one as there.

    Args:
        num_examples: how many examples, >= 0.
        seed: seed of the generator.
        max_attractors: largest number of agreement attractors, 0 to 3 (longer sentences for more).
        split: ``"train"`` or ``"test"``.

    Returns:
        a list of :class:`ChunkedExample`.

    Example::

        >>> from captum_attnflow.data import generate_examples
        >>> [e.words for e in generate_chunked_examples(3)] == [tuple(e.words) for e in generate_examples(3)]
        True
    """
    return [ChunkedExample(tuple(example.words), tags) for example, tags in _generate(num_examples, seed, max_attractors, split)]


def chunk_spans(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The chunks of a BIO tag sequence as ``(type, start, end)``, ``end`` exclusive.

    As CoNLL-2000's ``conlleval``: a chunk starts at ``B-X``, or at an ``I-X`` that follows ``O``
    or another type; it ends before ``O``, ``B-*`` or a tag of another type.

    Args:
        tags: BIO tags such as ``"B-NP"``, ``"I-NP"``, ``"O"``.

    Returns:
        list of ``(type, start, end)`` in order.

    Example::

        >>> chunk_spans(["B-NP", "I-NP", "B-PP", "I-NP", "O", "I-VP"])
        [('NP', 0, 2), ('PP', 2, 3), ('NP', 3, 4), ('VP', 5, 6)]
    """
    spans = []
    open_type, start = None, 0
    for i, tag in enumerate(tags):
        prefix, _, kind = tag.partition("-")
        if prefix not in ("B", "I", "O") or (prefix == "O") != (kind == ""):
            raise ValueError(f"tag {i} is {tag!r}; BIO tags are 'O', 'B-TYPE' or 'I-TYPE'.")
        if open_type is not None and (prefix != "I" or kind != open_type):
            spans.append((open_type, start, i))
            open_type = None
        if prefix == "B" or (prefix == "I" and open_type is None):
            open_type, start = kind, i
    if open_type is not None:
        spans.append((open_type, start, len(tags)))
    return spans


def chunk_f1(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, float]:
    """Chunk-level precision, recall and F1 (CoNLL-2000): a chunk counts when its type and both boundaries match.

    .. math:: P = \\frac{|G \\cap S|}{|S|}, \\quad R = \\frac{|G \\cap S|}{|G|}, \\quad F_1 = \\frac{2PR}{P + R}

    over the chunks :math:`G` of the gold and :math:`S` of the predicted sequences (0 when a
    denominator is 0).

    Args:
        gold: tag sequences, one per sentence.
        predicted: tag sequences, the same number and lengths.

    Returns:
        ``{"precision", "recall", "f1"}``.

    Example::

        >>> gold = [["B-NP", "I-NP", "B-VP"]]
        >>> chunk_f1(gold, [["B-NP", "B-NP", "B-VP"]])  # NP split in two: 1 of 3 right, 1 of 2 found
        {'precision': 0.3333333333333333, 'recall': 0.5, 'f1': 0.4}
    """
    if len(gold) != len(predicted):
        raise ValueError(f"gold has {len(gold)} sentences but predicted has {len(predicted)}; pass one tag sequence per sentence.")
    correct = found = expected = 0
    for i, (g, p) in enumerate(zip(gold, predicted)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted; tag every word once.")
        gold_spans, predicted_spans = set(chunk_spans(g)), set(chunk_spans(p))
        correct += len(gold_spans & predicted_spans)
        found += len(predicted_spans)
        expected += len(gold_spans)
    precision = correct / found if found else 0.0
    recall = correct / expected if expected else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def encode_chunked(examples: Sequence[ChunkedExample], tokenizer: PreTrainedTokenizerFast) -> dict[str, Tensor]:
    """Tokenize ``[CLS] + words`` right-padded, with the tag ids as per-token labels.

    Args:
        examples: a non-empty sequence of :class:`ChunkedExample`.
        tokenizer: the word-level tokenizer, :func:`~captum_attnflow.data.build_tokenizer`.

    Returns:
        ``input_ids`` and ``attention_mask`` (B, n) and ``labels`` (B, n): the index in
        :data:`CHUNK_TAGS` of the tag of the word at each position, :data:`IGNORE_INDEX` at
        ``[CLS]`` (position 0) and padding.

    Example::

        >>> from captum_attnflow.data import build_tokenizer
        >>> batch = encode_chunked([ChunkedExample(("the", "key"), ("B-NP", "I-NP"))], build_tokenizer())
        >>> batch["labels"]
        tensor([[-100,    1,    2]])
    """
    if not examples:
        raise ValueError("encode_chunked needs at least one example.")
    encoded = tokenizer([list(e.words) for e in examples], is_split_into_words=True, padding="longest", return_tensors="pt")
    labels = torch.full_like(encoded["input_ids"], IGNORE_INDEX)
    for row, example in enumerate(examples):
        labels[row, 1 : len(example.tags) + 1] = torch.tensor([CHUNK_TAGS.index(tag) for tag in example.tags])
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"], "labels": labels}


def decode_tags(label_ids: Tensor, attention_mask: Tensor) -> list[list[str]]:
    """Tag sequences from per-token label ids, dropping ``[CLS]`` and padding (the inverse of :func:`encode_chunked`).

    Args:
        label_ids: (B, n) indices into :data:`CHUNK_TAGS`, e.g. a tagger's ``logits.argmax(-1)``.
        attention_mask: (B, n), 1 on real tokens.

    Returns:
        B lists of tags, one per word.

    Example::

        >>> decode_tags(torch.tensor([[0, 1, 2, 0]]), torch.tensor([[1, 1, 1, 0]]))
        [['B-NP', 'I-NP']]
    """
    lengths = attention_mask.sum(-1).tolist()
    return [[CHUNK_TAGS[i] for i in row[1:length]] for row, length in zip(label_ids.tolist(), lengths)]
