"""``captum-attnflow benchmark``: which explanation to trust, as a leaderboard of methods x tasks x metrics.

Every method of the registry (:data:`captum_attnflow.methods.METHODS`), Captum's input x
gradient and integrated gradients, and random scores (the floor) explain the same held-out
examples of each task; the :class:`~captum_attnflow.evaluate.Evaluator` measures their
faithfulness to the model (ERASER's AOPC comprehensiveness and sufficiency, log-odds, the area
between the deletion curves, and the agreement data's ground truth: is the subject scored above
every attractor?), and a :class:`~captum_attnflow.evaluate.Leaderboard` gives each mean a
bootstrap interval and ranks the methods with paired Wilcoxon tests (Holm-adjusted), marking the
differences that are not significant. Each method's time per example is measured while it runs.

Tasks (offline, bundled models):

* ``agreement``: the bundled verb-number classifier, explaining its ``[CLS]`` token for the
  correct class;
* ``lm``: the bundled agreement language model at the position that writes the verb, explaining
  the logit of the correct copula (``is``/``are``).

Per-layer methods appear twice: at their last layer, and at their best layer for each metric
(chosen on the same examples, so it is optimistic: an upper bound of what a fixed layer gives).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from captum_attnflow.baselines import TokenInputXGradient, TokenIntegratedGradients
from captum_attnflow.data import encode_examples, generate_examples
from captum_attnflow.evaluate import Evaluator, Leaderboard
from captum_attnflow.evaluate.metrics import higher_is_better
from captum_attnflow.methods import METHODS

TASKS = ("agreement", "lm")
METRICS = ("comprehensiveness", "sufficiency", "log-odds", "deletion-area", "subject-first")
EXTRA_METHODS = ("input_x_gradient", "integrated_gradients", "random")
# What --quick runs: one method of each kind and the floor.
QUICK_METHODS = ("rollout", "alti", "gradient_rollout", "saliency", "random")
_BATCH = 32


@dataclass
class BenchmarkResult:
    """A benchmark run: the leaderboard and each method's seconds per example, per task.

    Attributes:
        leaderboard: metrics named ``"<task>: <metric>"``; entries ``method`` (no layers),
            ``method L<k>`` (a per-layer method at its last layer) and ``method, best L<k>``.
        seconds: ``{task: {method: seconds per example}}``.
        examples: ``{task: count}``.
    """

    leaderboard: Leaderboard
    seconds: dict[str, dict[str, float]]
    examples: dict[str, int]

    def to_markdown(self) -> str:
        """The leaderboard's tables, then the time per example of every method and task."""
        lines = ["| method | " + " | ".join(f"{task} (s / example)" for task in self.seconds) + " |",
                 "|---|" + "---|" * len(self.seconds)]
        methods = dict.fromkeys(name for times in self.seconds.values() for name in times)
        for name in methods:
            cells = [f"{self.seconds[task][name]:.4f}" if name in self.seconds[task] else "" for task in self.seconds]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        counts = ", ".join(f"{task} {count}" for task, count in self.examples.items())
        return f"{self.leaderboard.to_markdown()}\n\nTime per example ({counts} examples):\n\n" + "\n".join(lines)

    def save(self, directory: str | Path) -> list[Path]:
        """Write ``leaderboard.md``, ``leaderboard.csv`` and ``leaderboard.png`` into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        paths = [directory / name for name in ("leaderboard.md", "leaderboard.csv", "leaderboard.png")]
        paths[0].write_text(self.to_markdown() + "\n")
        self.leaderboard.to_csv(paths[1])
        self.leaderboard.plot().savefig(paths[2], dpi=120)
        return paths


class _VerbLogits(nn.Module):
    """The language model's next-token logits at the last real token of each prompt, (B, V): the
    position that writes the verb (also after deleted tokens, right-padded, as the metrics do)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        logits = self.model(input_ids, attention_mask=attention_mask).logits
        if attention_mask is None:
            return logits[:, -1]
        return logits[torch.arange(len(logits), device=logits.device), attention_mask.sum(1) - 1]


def _task(name: str, count: int, seed: int) -> tuple[nn.Module, Any, list[dict]]:
    """``(model to explain, tokenizer, batches)`` of a task, on held-out examples with attractors."""
    from captum_attnflow.models import load_agreement_lm, load_agreement_model
    from captum_attnflow.models.language_model import COPULAS

    examples = [e for e in generate_examples(4 * count, seed=seed, split="test") if e.num_attractors][:count]
    if name == "agreement":
        model, tokenizer = load_agreement_model()
        examples.sort(key=lambda example: len(example.words))
        return model, tokenizer, [_batch(examples[i : i + _BATCH], tokenizer, None) for i in range(0, len(examples), _BATCH)]
    model, tokenizer = load_agreement_lm()
    copulas = tokenizer.convert_tokens_to_ids(list(COPULAS))
    # One length per batch: a causal model's last token is then the verb's position in every row.
    by_length: dict[int, list] = {}
    for example in examples:
        by_length.setdefault(len(example.words), []).append(example)
    batches = [
        _batch(group[i : i + _BATCH], tokenizer, copulas)
        for _, group in sorted(by_length.items()) for i in range(0, len(group), _BATCH)
    ]
    return _VerbLogits(model).eval(), tokenizer, batches


def _batch(examples: Sequence, tokenizer: Any, copulas: list[int] | None) -> dict:
    batch = encode_examples(examples, tokenizer)
    if copulas is not None:  # the language model explains the correct copula's logit
        batch["labels"] = torch.tensor([copulas[int(label)] for label in batch["labels"]])
    mask = batch["attention_mask"]
    batch["special_tokens_mask"] = torch.zeros_like(mask)
    batch["special_tokens_mask"][:, 0] = 1  # [CLS] is never deleted nor ranked
    return batch


def _methods(model: nn.Module, tokenizer: Any, names: Sequence[str], seconds: dict[str, float], seed: int) -> dict:
    """``{name: callable(batch)}``, each timed into ``seconds`` (total over the run)."""
    builders: dict[str, Callable[[], Any]] = {name: (lambda name=name: METHODS[name].build(model, tokenizer)) for name in METHODS}
    builders["input_x_gradient"] = lambda: TokenInputXGradient(model)
    builders["integrated_gradients"] = lambda: TokenIntegratedGradients(model)
    generator = torch.Generator().manual_seed(seed)
    methods = {}
    for name in names:
        entry = METHODS.get(name)
        if name == "random":
            method = None
        else:
            method = builders[name]()

        def call(batch: dict, name: str = name, method: Any = method, entry: Any = entry) -> Tensor:
            start = time.perf_counter()
            ids, mask = batch["input_ids"], batch["attention_mask"]
            if method is None:
                scores = torch.rand(ids.shape, generator=generator) * mask
            elif entry is not None and entry.per_layer:
                target = {"target": batch["target"]} if entry.class_specific else {}
                scores = method.attribute(ids, attention_mask=mask, layer=None, **target)
            else:
                scores = method.attribute(ids, target=batch["target"], attention_mask=mask)
            seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
            return scores

        methods[name] = call
    return methods


def run_benchmark(
    tasks: Sequence[str] = TASKS,
    methods: Sequence[str] | None = None,
    examples: int = 64,
    seed: int = 0,
    n_resamples: int = 2000,
    show_progress: bool = True,
) -> BenchmarkResult:
    """Run every method on every task and rank them by faithfulness (see the module docstring).

    Args:
        tasks: names of :data:`TASKS`.
        methods: registry names, ``"input_x_gradient"``, ``"integrated_gradients"``,
            ``"random"``; default all of them.
        examples: held-out examples with attractors per task.
        seed: seed of the examples and of the random scores.
        n_resamples: bootstrap resamples of each interval.
        show_progress: tqdm bars over the batches.

    Returns:
        BenchmarkResult: the leaderboard and the timings.

    Example::

        >>> from captum_attnflow.benchmark import run_benchmark
        >>> result = run_benchmark(tasks=["agreement"], methods=["rollout", "random"], examples=4,
        ...                        n_resamples=99, show_progress=False)
        >>> sorted(result.seconds["agreement"])
        ['random', 'rollout']
        >>> "agreement: subject-first" in result.leaderboard.metrics
        True
    """
    known = (*METHODS, *EXTRA_METHODS)
    names = tuple(known) if methods is None else tuple(methods)
    unknown = [name for name in names if name not in known] + [task for task in tasks if task not in TASKS]
    if unknown or not names or not tasks:
        raise ValueError(f"unknown or missing names {unknown}: methods are {', '.join(known)}; tasks are {', '.join(TASKS)}.")
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
        raise ValueError(f"examples must be a positive int, got {examples!r}.")
    values: dict[tuple, np.ndarray] = {}
    times: dict[str, dict[str, float]] = {}
    counts: dict[str, int] = {}
    for task in tasks:
        model, tokenizer, batches = _task(task, examples, seed)
        seconds: dict[str, float] = {}
        measured = Evaluator(
            model, _methods(model, tokenizer, names, seconds, seed), {}, exclude_special_tokens=True,
            show_progress=show_progress, faithfulness=list(METRICS),
        ).run(batches)
        counts[task] = sum(len(batch["input_ids"]) for batch in batches)
        times[task] = {name: total / counts[task] for name, total in seconds.items()}
        values.update(_entries(task, measured.metrics))
    directions = {f"{task}: {metric}": higher_is_better(metric) for task in tasks for metric in METRICS}
    return BenchmarkResult(Leaderboard(values, higher_is_better=directions, n_resamples=n_resamples), times, counts)


def _entries(task: str, metrics: dict[tuple, np.ndarray]) -> dict[tuple, np.ndarray]:
    """Leaderboard entries of one task: methods without layers as they are; per-layer ones at
    their last layer and at their best layer for each metric (by mean, in the metric's direction)."""
    entries: dict[tuple, np.ndarray] = {}
    groups: dict[tuple, dict[int, np.ndarray]] = {}
    for (method, metric, layer), array in metrics.items():
        if layer is None:
            entries[(method, f"{task}: {metric}", None)] = np.asarray(array)
        else:
            groups.setdefault((method, metric), {})[layer] = np.asarray(array)
    for (method, metric), layers in groups.items():
        last = max(layers)
        sign = 1.0 if higher_is_better(metric) else -1.0
        best = max(layers, key=lambda layer: sign * np.nanmean(layers[layer]))
        entries[(f"{method} L{last}", f"{task}: {metric}", None)] = layers[last]
        entries[(f"{method}, best L{best}", f"{task}: {metric}", None)] = layers[best]
    return entries
