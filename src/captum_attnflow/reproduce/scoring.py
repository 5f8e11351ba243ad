"""The scores of one batch of held-out examples: the batch encoded for the Evaluator, every attention
method and reference computed once from one forward pass, and whether each scores the verb's
subject above its attractors."""

from __future__ import annotations

import copy
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor

from captum_attnflow.capture import extract_attentions
from captum_attnflow.data import encode_examples
from captum_attnflow.methods import METHODS
from captum_attnflow.reproduce.authors import gradient_sum
from captum_attnflow.reproduce.paper import BLANK_OUT, GRADIENTS, OURS_REFERENCES

# Sequences per blank-out forward pass. Larger passes are slower per sequence on CPU, not
# faster: their activations outgrow the caches (the GELU's temporaries alone are 50 MB at
# 2400 sequences), and blank-out took 2x the CPU time with all positions of a 200-example
# batch in one pass than with one position per pass.
BLANK_OUT_SEQUENCES = 256
# Scores this close count as tied in the ground truth: flow gives many tokens the source's
# whole unit of flow, equal up to float32 rounding of the attention rows (~1e-7).
TIE_ATOL = 1e-6


def _encode(examples: Sequence, indices: np.ndarray, tokenizer: Any, include_cls: bool) -> dict[str, Any]:
    """One batch for the Evaluator: the encoded examples, their ids, and the tokens our protocol
    leaves out of the ranking (``special_tokens_mask``: ``[CLS]`` unless ``include_cls``, the
    end token of a model trained with one)."""
    batch = encode_examples(examples, tokenizer)
    ends = _end_tokens(batch["input_ids"], batch["attention_mask"], tokenizer)
    batch["end_token_mask"] = ends
    batch["special_tokens_mask"] = ends.clone()
    batch["special_tokens_mask"][:, 0] |= not include_cls
    batch["example_ids"] = torch.as_tensor(indices)
    return batch


def _end_tokens(ids: Tensor, mask: Tensor, tokenizer: Any) -> Tensor:
    """(B, n) bool: real tokens after ``[CLS]`` that are special tokens (not ``[UNK]``), i.e. an
    end token a model trained with ``--end-token`` reads in the verb's slot."""
    special = sorted(set(tokenizer.all_special_ids) - {tokenizer.unk_token_id})
    ends = torch.isin(ids, torch.tensor(special)) & mask.bool()
    ends[:, 0] = False
    return ends


class _Scorer:
    """Every score of a batch, computed once when the Evaluator asks for the first of them, and
    what the ground truth needs; the batches' records stay in :attr:`records` (by first example id)."""

    def __init__(self, model: Any, tokenizer: Any, protocol: str, methods: tuple[str, ...]) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.methods = methods
        self.references = {METHODS[name].title: METHODS[name].build(model, tokenizer) for name in ("blankout", "saliency")}
        # A float64 copy for the gradient sum: the user's model keeps its dtype.
        self.model64 = copy.deepcopy(model).double() if protocol == "paper" else None
        self.records: dict[int, dict[str, Any]] = {}

    def method(self, name: str):
        return lambda batch: self.scores(batch)[name]

    def scores(self, batch: dict) -> dict[str, Tensor]:
        key = int(batch["example_ids"][0])
        if key not in self.records:
            self.records[key] = self._record(batch)
        return self.records[key]["scores"]

    def _record(self, batch: dict) -> dict[str, Any]:
        ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
        with torch.no_grad():
            predictions = self.model(ids, attention_mask=mask).logits.argmax(-1)
        # One forward pass serves the three attention methods: they accept any callable that
        # returns the attentions.
        attentions = extract_attentions(self.model, ids, attention_mask=mask)
        scores = {
            name: METHODS[name].build(lambda _: attentions, self.tokenizer).attribute(ids, layer=None, attention_mask=mask)
            if METHODS[name].from_attentions
            else METHODS[name].build(self.model, self.tokenizer).attribute(
                ids, layer=None, attention_mask=mask, **({"target": labels} if METHODS[name].class_specific else {})
            )
            for name in self.methods
        }
        scores[BLANK_OUT] = self.references[BLANK_OUT].attribute(
            ids, target=labels, attention_mask=mask, perturbations_per_eval=max(1, BLANK_OUT_SEQUENCES // len(ids))
        )
        scores[GRADIENTS] = self.references[GRADIENTS].attribute(ids, target=labels, attention_mask=mask)
        if self.model64 is not None:
            scores["|blank-out|"] = scores[BLANK_OUT].abs().masked_fill(batch["end_token_mask"], 0.0)
            scores["gradient sum"] = gradient_sum(self.model, ids, mask)
            scores["gradient sum, float64"] = gradient_sum(self.model64, ids, mask)

        attractors = batch["attractor_positions"]
        with_attractors = (attractors >= 0).any(1)
        subject_first, subject_tied = {}, {}
        for name in (*self.methods, *OURS_REFERENCES):
            values = scores[name] if name in self.methods else scores[name][None]
            above, tied = _subject_versus_attractors(values, batch["subject_positions"], attractors)
            subject_first[name] = above[:, with_attractors].cpu().numpy()
            subject_tied[name] = tied[:, with_attractors].cpu().numpy()
        return dict(
            scores=scores,
            mask=mask.bool(),
            subject_first=subject_first,
            subject_tied=subject_tied,
            num_attractors=(attractors >= 0).sum(1)[with_attractors].cpu().numpy(),
            correct=(predictions == labels).cpu().numpy(),
        )


def _subject_versus_attractors(scores: Tensor, subjects: Tensor, attractors: Tensor) -> tuple[Tensor, Tensor]:
    """(L, B) bool twice: the subject's score is above every attractor's, and it ties with the
    highest of them (within ``TIE_ATOL``); "above" excludes ties.

    Args:
        scores: (L, B, n). subjects: (B,) positions. attractors: (B, K) positions, -1 for none.
    """
    num_layers = scores.shape[0]
    subject = scores.gather(2, subjects[None, :, None].expand(num_layers, -1, 1))[..., 0]
    at_attractors = scores.gather(2, attractors.clamp(min=0)[None].expand(num_layers, -1, -1))
    best_attractor = at_attractors.masked_fill(attractors[None] < 0, float("-inf")).amax(2)
    tied = (subject - best_attractor).abs() <= TIE_ATOL
    return (subject > best_attractor) & ~tied, tied
