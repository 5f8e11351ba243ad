"""The two tasks of the adversarial study as fixed batches: chunking (per-token tags) and agreement (one label).

A :class:`Task` holds tokenized training and test batches and knows how a model's outputs
become prediction distributions and a score: chunk F1 (CoNLL-2000) for chunking, accuracy
for the agreement classifier. Everything downstream (training, adversaries, probing, the
attribution table) takes a task and a model and does not care which task it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from captum_attnflow.capture import inject_attention
from captum_attnflow.data import build_tokenizer, encode_examples, generate_examples
from captum_attnflow.data.chunking import IGNORE_INDEX, chunk_f1, decode_tags, encode_chunked, generate_chunked_examples

Batch = dict[str, Tensor]
# replace(layer, weights) -> weights for one batch, as inject_attention takes it; None keeps the model's own.
AttentionSource = Callable[[Batch], Callable[[int, Tensor], Tensor]]


@dataclass(frozen=True)
class Task:
    """Batches of one task and how its predictions are read.

    Attributes:
        name: ``"chunking"`` or ``"agreement"``.
        train, test: lists of batches, dicts of ``input_ids``, ``attention_mask`` (B, n) and
            ``labels``: (B, n) tag ids with -100 off the words for chunking, (B,) for agreement.
        per_token: True when every word has a label (chunking).
        metric: the name of :meth:`score`'s value, ``"F1"`` or ``"accuracy"``.
    """

    name: str
    train: list[Batch]
    test: list[Batch]
    per_token: bool
    metric: str

    def prediction_mask(self, batch: Batch) -> Tensor:
        """(B, m) bool: which of the m prediction distributions of :meth:`probabilities` are real."""
        if self.per_token:
            return batch["labels"] != IGNORE_INDEX
        return torch.ones(batch["labels"].shape[0], 1, dtype=torch.bool)

    def probabilities(self, logits: Tensor) -> Tensor:
        """(B, m, C) predicted distributions: per token (m = n) or one per example (m = 1)."""
        probabilities = logits.float().softmax(-1)
        return probabilities if self.per_token else probabilities[:, None]

    def score(self, model: nn.Module, attention: AttentionSource | None = None) -> float:
        """Chunk F1 or accuracy of ``model`` on the test batches (``attention`` injected when given)."""
        gold, predicted, correct, total = [], [], 0, 0
        with torch.no_grad():
            for batch in self.test:
                logits = forward(model, batch, attention).logits
                if self.per_token:
                    gold += decode_tags(batch["labels"].clamp_min(0), batch["attention_mask"])
                    predicted += decode_tags(logits.argmax(-1), batch["attention_mask"])
                else:
                    correct += int((logits.argmax(-1) == batch["labels"]).sum())
                    total += len(batch["labels"])
        return chunk_f1(gold, predicted)["f1"] if self.per_token else correct / total


def forward(model: nn.Module, batch: Batch, attention: AttentionSource | None = None, output_attentions: bool = False):
    """``model(input_ids, attention_mask=...)``, with ``attention(batch)`` injected when given."""
    call = lambda: model(batch["input_ids"], attention_mask=batch["attention_mask"], output_attentions=output_attentions)
    if attention is None:
        return call()
    with inject_attention(model, attention(batch)):
        return call()


def chunking_task(train_examples: int = 4096, test_examples: int = 512, batch_size: int = 32, seed: int = 0) -> Task:
    """Chunking on generated sentences (:mod:`captum_attnflow.data.chunking`), test split held out.

    Args:
        train_examples, test_examples: sentences in each split.
        batch_size: sentences per batch.
        seed: seed of the generator; the test split uses ``seed + 1``.

    Returns:
        Task

    Example::

        >>> task = chunking_task(train_examples=64, test_examples=16, batch_size=16)
        >>> len(task.train), task.test[0]["labels"].shape[0], task.metric
        (4, 16, 'F1')
    """
    tokenizer = build_tokenizer()
    make = lambda n, s, split: _batches(generate_chunked_examples(n, seed=s, split=split), batch_size, lambda b: encode_chunked(b, tokenizer))
    return Task("chunking", make(train_examples, seed, "train"), make(test_examples, seed + 1, "test"), True, "F1")


def agreement_task(train_examples: int = 4096, test_examples: int = 512, batch_size: int = 32, seed: int = 0) -> Task:
    """Verb-number agreement (the bundled classifier's task), test split held out; arguments as :func:`chunking_task`.

    Example::

        >>> agreement_task(train_examples=32, test_examples=8, batch_size=8).test[0]["labels"].shape
        torch.Size([8])
    """
    tokenizer = build_tokenizer()

    def encode(examples):
        batch = encode_examples(examples, tokenizer)
        return {key: batch[key] for key in ("input_ids", "attention_mask", "labels")}

    make = lambda n, s, split: _batches(generate_examples(n, seed=s, split=split), batch_size, encode)
    return Task("agreement", make(train_examples, seed, "train"), make(test_examples, seed + 1, "test"), False, "accuracy")


def _batches(examples: list, batch_size: int, encode: Callable[[list], Batch]) -> list[Batch]:
    # Sorted by length so that batches carry little padding; training draws them in random order.
    examples = sorted(examples, key=lambda example: len(example.words))
    return [encode(examples[i : i + batch_size]) for i in range(0, len(examples), batch_size)]
