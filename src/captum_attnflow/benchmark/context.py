"""The benchmark's ``context`` task: which source of a prompt did the answer come from.

A causal language model reads a prompt of sources (documents, sentences) and a question, and its
answer is explained by one score per source. Every row scores the same examples and the same
response, and is measured by the same metrics on the same ablations
(:func:`~captum_attnflow.evaluate.context_metrics`): ContextCite's top-k log-probability drop and
LDS, and where the gold source is known precision@1 and recall@k. The rows are this package's
attention methods through :class:`~captum_attnflow.LLMAttentionAttribution` (a source's score
the sum of its tokens'), Captum's leave-one-out, AttnTrace, ContextCite where its package is
installed, and the random floor (:mod:`captum_attnflow.benchmark.context_methods`).

The bundled task runs the bundled retrieval language model on held-out prompts of 32 facts and a
question, each fact a source and the one fact that states the answer the gold source
(:func:`load_context_task`);
:func:`context_examples` turns rows of the user's own file (context, question, answer, optional
gold) into examples of the same form.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from captum.attr import TextTemplateInput
from torch import Tensor, nn
from tqdm.auto import tqdm

from captum_attnflow.attr import LLMAttentionAttribution
from captum_attnflow.benchmark.context_methods import available_peers, random_scores
from captum_attnflow.evaluate import ResponseLogProb, context_metrics
from captum_attnflow.evaluate.context import CONTEXTCITE_KS
from captum_attnflow.methods import METHODS, generated_text_methods

CONTEXT = "context"
# Random ablations per example of LDS, shared by every row.
ABLATIONS = 32
FLOOR = "random"
# Facts a prompt of the bundled task holds (the retrieval model was trained on 4 to 64).
BUNDLED_SOURCES = 32
# The rows that are not this package's methods (available_peers: ContextCite's where installed).
CONTEXT_PEERS = ("leave-one-out", "attntrace", "contextcite-64", "contextcite-256")


@dataclass(frozen=True)
class ContextExample:
    """One row of the context task.

    Attributes:
        prompt: the prompt, its values the sources.
        answer: the response every row explains (teacher-forced).
        gold: the index of the feature that holds the answer, or None where unknown.
    """

    prompt: TextTemplateInput
    answer: str
    gold: int | None = None


def context_rows(names: Sequence[str] | None) -> dict[str, Callable[..., Tensor]]:
    """``{row: scores(model, tokenizer, prompt, response, seed) -> (F,)}`` for ``names`` (None:
    every attention method of the registry that explains generated text, the peers that run
    here and the floor); names that apply to no source score (saliency, blank-out) are left out."""
    ours = generated_text_methods()
    peers = available_peers()
    rows: dict[str, Callable[..., Tensor]] = {}
    for name in (*ours, *peers, FLOOR) if names is None else names:
        if name in ours:
            rows[name] = _through_wrapper(name)
        elif name in peers:
            rows[name] = peers[name]
        elif name == FLOOR:
            rows[name] = random_scores
    return rows


def _through_wrapper(name: str) -> Callable[..., Tensor]:
    def scores(model: nn.Module, tokenizer: Any, prompt: TextTemplateInput, response: str, seed: int) -> Tensor:
        wrapper = LLMAttentionAttribution(METHODS[name].build(model, tokenizer), tokenizer)
        # The task's own bar counts the examples; a method's bar per call would only flicker.
        result = wrapper.attribute(prompt, target=response, show_progress=False)
        return torch.as_tensor(result.seq_attr).detach().float().cpu()

    return scores


def run_context_task(
    model: nn.Module,
    tokenizer: Any,
    examples: Sequence[ContextExample],
    names: Sequence[str] | None,
    seed: int,
    show_progress: bool,
    into: tuple[dict, dict, dict, dict],
    name: str = CONTEXT,
    ablations: int = ABLATIONS,
    ks: Sequence[int] = CONTEXTCITE_KS,
) -> list[str]:
    """Score every row on ``examples`` and add the task's leaderboard entries
    (``(row, "<name>: <metric>", None)``), seconds per example, example count and metric
    directions (all higher is better) to ``into``; returns notes for the report (rows that do
    not run here)."""
    values, times, counts, directions = into
    rows = context_rows(names)
    notes = [] if "contextcite-64" in rows or (names is not None and "contextcite-64" not in names) else [
        "ContextCite's rows need its package (pip install context-cite, in an environment of its own); "
        "it is not installed here."
    ]
    measured: list[dict[str, dict[str, float]]] = []
    spent = dict.fromkeys(rows, 0.0)
    for index, example in enumerate(tqdm(examples, desc=name, unit="example", disable=not show_progress)):
        scores = {}
        for row, score in rows.items():
            start = time.perf_counter()
            scores[row] = score(model, tokenizer, example.prompt, example.answer, seed + index)
            spent[row] += time.perf_counter() - start
        log_prob = ResponseLogProb(model, tokenizer, example.prompt, example.answer)
        ks_here = [k for k in ks if k <= example.prompt.n_itp_features]
        measured.append(context_metrics(log_prob, scores, gold=example.gold, ks=ks_here, ablations=ablations, seed=seed + index))
    metrics = list(dict.fromkeys(metric for example in measured for metric in example))
    for metric in metrics:
        for row in rows:
            array = np.array([example.get(metric, {}).get(row, math.nan) for example in measured], dtype=np.float64)
            values[(row, f"{name}: {metric}", None)] = array
        directions[f"{name}: {metric}"] = True
    times[name] = {row: seconds / len(examples) for row, seconds in spent.items()}
    counts[name] = len(examples)
    return notes


def load_context_task(examples: int, seed: int, **placement: Any) -> tuple[nn.Module, Any, list[ContextExample]]:
    """The bundled task: the retrieval language model (:func:`~captum_attnflow.load_retrieval_model`,
    where ``placement`` says) on ``examples`` prompts of :data:`BUNDLED_SOURCES` facts
    (:func:`~captum_attnflow.data.retrieval_examples`, drawn with ``seed``), each fact a source,
    the answer it was trained to copy explained, its gold source the one fact that states it,
    among distractors that share the question's person or attribute."""
    from captum_attnflow.data.retrieval import retrieval_examples
    from captum_attnflow.models.retrieval import load_retrieval_model

    model, tokenizer = load_retrieval_model(**placement)
    drawn = retrieval_examples(examples, sources=BUNDLED_SOURCES, seed=seed)
    return model, tokenizer, [ContextExample(example.prompt, example.answer, example.gold) for example in drawn]


def context_examples(
    rows: dict[str, list], question: str = "question", context: str = "context", answer: str = "answer",
    gold: str | None = None, by: str = "sentence",
) -> list[ContextExample]:
    """Examples of the user's rows: ``rows[context]`` split into sources by
    :func:`~captum_attnflow.split_sources` (``by``), the question after them
    (:func:`~captum_attnflow.context_prompt`), the answer explained; ``rows[gold]`` (optional) is
    the index of the gold source or a piece of its text (the first source holding it).

    Raises:
        ValueError: a missing column, an empty context or answer, a gold index out of range or
            a gold text in no source.
    """
    from captum_attnflow.data.sources import context_prompt

    for column in (question, context, answer) + (() if gold is None else (gold,)):
        if column not in rows:
            raise ValueError(f"the data has no column {column!r}; its columns are {sorted(rows)} (see --context-column ...).")
    examples = []
    for row, (text, asked, said) in enumerate(zip(rows[context], rows[question], rows[answer])):
        if not str(text).strip() or not str(said).strip():
            raise ValueError(f"row {row} has an empty {context if not str(text).strip() else answer!r}; every row needs both.")
        prompt = context_prompt(str(text), str(asked), by=by)
        examples.append(ContextExample(prompt, " " + str(said).strip(), _gold(rows[gold][row], prompt, row) if gold else None))
    return examples


def _gold(value: Any, prompt: TextTemplateInput, row: int) -> int | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    sources = list(prompt.values)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if not 0 <= value < len(sources):
            raise ValueError(f"row {row}: gold source {value} is out of range, the context has {len(sources)} sources.")
        return int(value)
    holding = [index for index, source in enumerate(sources) if str(value).strip() in source]
    if not holding:
        raise ValueError(f"row {row}: the gold text {str(value)[:40]!r} is in no source of the context.")
    return holding[0]
