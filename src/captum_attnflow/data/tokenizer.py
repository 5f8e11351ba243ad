"""The word-level tokenizer of the agreement model and batch encoding of agreement examples.

The tokenizer is a :class:`transformers.PreTrainedTokenizerFast` over a ``tokenizers``
word-level model: lower-casing, splitting on whitespace and punctuation, one id per word,
and ``[CLS]`` prepended to every sequence (the model classifies from position 0, paper
section 2). Words outside the vocabulary become ``[UNK]``, which blank-out also uses.
"""

from __future__ import annotations

from typing import Sequence

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from torch import Tensor
from transformers import PreTrainedTokenizerFast

from captum_attnflow.data.agreement import AgreementExample, vocabulary

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[MASK]")


def build_tokenizer(words: Sequence[str] | None = None) -> PreTrainedTokenizerFast:
    """A word-level fast tokenizer over ``words`` (default: the generator's vocabulary).

    Ids 0-3 are ``[PAD]``, ``[UNK]``, ``[CLS]``, ``[MASK]``; the words follow in order.

    Args:
        words: the vocabulary; duplicates are dropped, first occurrence kept. None (default)
            uses :func:`~captum_attnflow.data.vocabulary`, the bundled model's.

    Returns:
        PreTrainedTokenizerFast: lower-casing, whitespace and punctuation splitting, ``[CLS]``
        prepended, right padding; unknown words become ``[UNK]``.

    Example:
        >>> tokenizer = build_tokenizer()
        >>> tokenizer.convert_ids_to_tokens(tokenizer("The key to the cabinets")["input_ids"])
        ['[CLS]', 'the', 'key', 'to', 'the', 'cabinets']
    """
    words = vocabulary() if words is None else list(words)
    vocab = {token: i for i, token in enumerate(dict.fromkeys([*SPECIAL_TOKENS, *words]))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A", pair="[CLS] $A $B", special_tokens=[("[CLS]", vocab["[CLS]"])]
    )
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        mask_token="[MASK]",
        padding_side="right",
        model_input_names=["input_ids", "attention_mask"],
    )


def encode_examples(examples: Sequence[AgreementExample], tokenizer: PreTrainedTokenizerFast) -> dict[str, Tensor]:
    """Tokenize a batch of examples as ``[CLS] + words``, right-padded to the longest.

    Args:
        examples: a non-empty sequence of :class:`~captum_attnflow.data.AgreementExample`.
        tokenizer: the word-level tokenizer, e.g. :func:`build_tokenizer` or the one of
            :func:`~captum_attnflow.load_agreement_model`.

    Returns:
        a dict of tensors: ``input_ids`` and ``attention_mask`` (B, n), ``labels`` (B,),
        ``subject_positions`` (B,) and ``attractor_positions`` (B, max_attractors in the
        batch, at least 1), padded with -1. Positions are token positions (word index + 1).

    Example:
        >>> from captum_attnflow.data import generate_examples
        >>> batch = encode_examples(generate_examples(4), build_tokenizer())
        >>> batch["input_ids"].shape[0], batch["labels"].shape
        (4, torch.Size([4]))
    """
    if not examples:
        raise ValueError("encode_examples needs at least one example.")
    encoded = tokenizer(
        [list(example.words) for example in examples],
        is_split_into_words=True,
        padding="longest",
        return_tensors="pt",
    )
    width = max(1, max(example.num_attractors for example in examples))
    attractors = torch.full((len(examples), width), -1, dtype=torch.long)
    for row, example in enumerate(examples):
        if example.attractor_indices:
            attractors[row, : example.num_attractors] = torch.tensor(example.attractor_indices) + 1
    return {
        "input_ids": encoded["input_ids"],
        "attention_mask": encoded["attention_mask"],
        "labels": torch.tensor([example.label for example in examples], dtype=torch.long),
        "subject_positions": torch.tensor([example.subject_index + 1 for example in examples], dtype=torch.long),
        "attractor_positions": attractors,
    }
