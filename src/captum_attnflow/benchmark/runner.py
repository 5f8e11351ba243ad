"""The benchmark's runner: every method of a task through the :class:`~captum_attnflow.evaluate.Evaluator`,
timed, and the :class:`BenchmarkResult` its entries make, shared by the bundled tasks
(:mod:`captum_attnflow.benchmark.tasks`) and the user's own model and data
(:mod:`captum_attnflow.benchmark.user`).
"""

from __future__ import annotations

import hashlib
import html
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import Tensor, nn

from captum_attnflow.benchmark.tasks import Task
from captum_attnflow.evaluate import Evaluator, Leaderboard
from captum_attnflow.evaluate.friedman import CriticalDifference
from captum_attnflow.evaluate.metrics import higher_is_better
from captum_attnflow.methods import METHODS, method_entry

FLOOR = "random"
# The names _entries gives a per-layer method: "rollout L6" (its last layer), "rollout, best L3".
_LAYERED = re.compile(r"(?P<method>.+?)(?P<best>, best)? L\d+")


@dataclass
class BenchmarkResult:
    """A benchmark run: the leaderboard and each method's seconds per example, per task.

    Attributes:
        leaderboard: metrics named ``"<task>: <metric>"``; entries ``method`` (no layers),
            ``method L<k>`` (a per-layer method at its last layer) and ``method, best L<k>``.
        seconds: ``{task: {method: seconds per example}}``.
        examples: ``{task: count}``.
        notes: what the reader should know about the data (e.g. texts truncated to the
            model's positions), printed under the tables.
        shown: ``{task: [ExplanationResult]}``, the first examples of each task as every method
            scored them (per-layer methods at their last layer), for the report.
    """

    leaderboard: Leaderboard
    seconds: dict[str, dict[str, float]]
    examples: dict[str, int]
    notes: list[str] = field(default_factory=list)
    shown: dict = field(default_factory=dict)

    def critical_difference(self) -> CriticalDifference:
        """The methods across every task and metric: each (task, metric) a block, each method
        ranked there by its mean, the average ranks tested by Friedman's test and Nemenyi's
        (:meth:`Leaderboard.critical_difference`). A per-layer method appears as
        ``method (last layer)`` and ``method (best layer)``, whatever its layer count in each
        task's model (see :func:`method_name`). Only methods scored in every task are compared,
        the others are listed as left out: with the context task, whose rows score sources,
        the gradient baselines, blank-out and the best layers.

        Returns:
            CriticalDifference: its ``plot()`` is the critical-difference diagram.

        Raises:
            ValueError: fewer than 2 metrics or 3 methods scored in all of them.
        """
        return self.leaderboard.critical_difference(names=method_name)

    def to_markdown(self) -> str:
        """The leaderboard's tables (best mean first, with groups), the methods' average ranks
        across the tasks (the critical-difference diagram's numbers), then the time per example
        of every method and task."""
        lines = ["| method | " + " | ".join(f"{task} (s / example)" for task in self.seconds) + " |",
                 "|---|" + "---|" * len(self.seconds)]
        methods = dict.fromkeys(name for times in self.seconds.values() for name in times)
        for name in methods:
            cells = [f"{self.seconds[task][name]:.4f}" if name in self.seconds[task] else "" for task in self.seconds]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        counts = ", ".join(f"{task} {count}" for task, count in self.examples.items())
        notes = "".join(f"\n\nNote: {note}" for note in self.notes)
        return (f"{self.leaderboard.to_markdown()}\n\n{self._across()[1]}\n\nTime per example ({counts} examples):\n\n"
                + "\n".join(lines) + notes)

    def _across(self) -> tuple[Any, str]:
        """The comparison across the tasks (None where there are too few metrics or methods)
        and its section of the report, or why there is none."""
        title = "Across the tasks (each (task, metric) a block, methods ranked there by mean, 1 = best)"
        try:
            result = self.critical_difference()
        except ValueError as error:
            return None, f"{title}: no diagram, {error}"
        return result, f"{title}\n\n{result.to_markdown()}"

    def save(self, directory: str | Path) -> list[Path]:
        """Write into ``directory``: ``leaderboard.md`` (tables best mean first, the average
        ranks across the tasks), ``leaderboard.csv``, ``leaderboard.json`` with
        ``leaderboard.safetensors`` (:meth:`Leaderboard.load` reads them), ``leaderboard.png``
        (forest plots of every metric, 4 a row), ``leaderboard_<task>.png`` (one figure per
        task), ``critical_difference.png`` (the diagram across the tasks, when there are at
        least 2 metrics and 3 methods) and ``report.html`` (the figures and the example
        explanations in one self-contained page)."""
        from captum_attnflow.visualize.html import figure_png, page_html, png_html

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        paths = [directory / name for name in ("leaderboard.md", "leaderboard.csv", "leaderboard.png")]
        paths[0].write_text(self.to_markdown() + "\n")
        self.leaderboard.to_csv(paths[1])
        self.leaderboard.plot(kind="forest", columns=4, floor=FLOOR).savefig(paths[2], dpi=100)
        paths += self.leaderboard.save(directory / "leaderboard.json")
        blocks = []
        across = self._across()[0]
        if across is not None:
            png = figure_png(across.plot(floor=FLOOR))  # drawn once, for the file and the page
            paths.append(directory / "critical_difference.png")
            paths[-1].write_bytes(png)
            blocks.append("<h2>Across the tasks</h2>" + png_html(png, "average ranks across the tasks, best on the left"))
        for task, count in self.examples.items():
            metrics = [metric for metric in self.leaderboard.metrics if metric.startswith(f"{task}: ")]
            if not metrics:
                continue
            png = figure_png(self.leaderboard.plot(kind="forest", metrics=metrics, floor=FLOOR, title=f"{task} ({count} examples)"))
            paths.append(directory / f"leaderboard_{task}.png")
            paths[-1].write_bytes(png)
            blocks.append(f"<h2>{task}</h2>" + png_html(png, f"{task}: methods by mean, best on top"))
            blocks += [example.to_html() for example in self.shown.get(task, [])]
        table = html.escape(self.to_markdown())
        paths.append(directory / "report.html")
        paths[-1].write_text(
            page_html("captum_attnflow benchmark", blocks + [f"<h2>Tables</h2><pre>{table}</pre>"]), encoding="utf-8"
        )
        return paths


def _methods(
    model: nn.Module, tokenizer: Any, task: Task, names: Sequence[str], timing: dict[str, list[float]], seed: int,
    first: dict | None = None,
) -> dict:
    """``{name: callable(batch)}`` for the Evaluator, each adding its seconds and examples to
    ``timing[name]`` (``[seconds, examples]``, over the batches it runs) and keeping its scores
    of the first batch in ``first[name]`` (the last layer of a per-layer method)."""
    methods = {}
    for name in names:
        entry = None if name == FLOOR else method_entry(name)
        method = None if entry is None else entry.build(model, tokenizer, **({} if task.logits else dict(entry.on_scores)))

        def call(batch: dict, method: Any = method, entry: Any = entry, name: str = name) -> Tensor:
            start = time.perf_counter()
            if entry is None:
                scores = _random_scores(batch, seed)
            else:
                scores = _attribute(method, entry, task, batch)
            spent = timing.setdefault(name, [0.0, 0])
            spent[0] += time.perf_counter() - start
            spent[1] += batch["input_ids"].shape[0]
            if first is not None and name not in first:
                first[name] = (scores[-1] if scores.dim() == 3 else scores).detach().float().cpu()
                first.setdefault("", batch)
            return scores

        methods[name] = call
    return methods


def _random_scores(batch: dict, seed: int) -> Tensor:
    """The floor: uniform scores drawn from ``seed`` and the batch's tokens, so that a batch gets
    the same ones whichever process of ``accelerate launch`` runs it, and in whatever order."""
    ids = batch["input_ids"]
    digest = hashlib.sha256(ids.detach().cpu().numpy().tobytes()).digest()
    generator = torch.Generator().manual_seed(seed ^ int.from_bytes(digest[:7], "little"))
    return torch.rand(ids.shape, generator=generator).to(ids.device) * batch["attention_mask"]


def _attribute(method: Any, entry: Any, task: Task, batch: dict) -> Tensor:
    """One method's scores of a batch: (L, B, n) for a per-layer method, (B, n) otherwise."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    kwargs: dict[str, Any] = {"attention_mask": mask}
    if batch.get("additional_forward_args") is not None:
        kwargs["additional_forward_args"] = batch["additional_forward_args"]
    if not entry.per_layer:
        return method.attribute(ids, target=batch["target"], **kwargs)
    if entry.class_specific:
        kwargs["target"] = batch["target"]
    if not task.pooled:
        if batch.get("position") is not None:
            kwargs["position"] = batch["position"]
        return method.attribute(ids, layer=None, **kwargs)
    # Every position (padding ones clamped to the last real token), then their mean over the real ones.
    n = ids.shape[1]
    last = mask.sum(-1, keepdim=True) - 1
    positions = torch.minimum(torch.arange(n, device=ids.device).expand(len(ids), n), last)
    scores = method.attribute(ids, layer=None, position=positions, **kwargs)  # (L, B, n positions, n)
    weights = mask.to(scores.dtype)
    return torch.einsum("lbpj,bp->lbj", scores, weights) / weights.sum(-1)[None, :, None]


def run_task(
    task: Task, loaded: tuple, names: Sequence[str], seed: int, show_progress: bool,
    checkpoint_dir: str | Path | None, into: tuple[dict, dict, dict, dict], shown: dict | None = None,
) -> None:
    """Run ``names`` on one task's ``(model, tokenizer, batches)`` and add its leaderboard
    entries, seconds per example, example count and metric directions to ``into`` (and the
    first two examples as every method scored them to ``shown[task]``, when given). Under
    ``accelerate launch`` each process runs its share of the batches (the Evaluator shards
    them) and every process gets all the values and the times of all processes."""
    values, times, counts, directions = into
    model, tokenizer, batches = loaded
    timing: dict[str, list[float]] = {}
    first: dict = {}
    evaluator = Evaluator(
        model, _methods(model, tokenizer, task, names, timing, seed, first), {}, exclude_special_tokens=True,
        show_progress=show_progress, faithfulness=task.faithfulness, tokenizer=tokenizer,
    )
    checkpoint = None if checkpoint_dir is None else Path(checkpoint_dir) / f"{task.name}.npz"
    if checkpoint is not None:
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
    measured = evaluator.run(batches, checkpoint=checkpoint)
    counts[task.name] = len(measured)
    times[task.name] = {method: seconds / rows for method, (seconds, rows) in _all_processes(timing).items() if rows}
    values.update(_entries(task.name, measured.metrics))
    if shown is not None:
        shown[task.name] = _shown(first, tokenizer, task.name)
    directions.update({f"{task.name}: {metric}": higher_is_better(metric) for metric in task.faithfulness})


def _shown(first: dict, tokenizer: Any, task: str, count: int = 2) -> list:
    """The first ``count`` examples of the first batch as every method scored them."""
    from captum_attnflow.explanation import ExplanationResult

    batch = first.pop("", None)
    if batch is None or not first:  # resumed from a checkpoint past the first batch
        return []
    results = []
    for row in range(min(count, batch["input_ids"].shape[0])):
        real = batch["attention_mask"][row].bool().cpu()
        tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][row].cpu()[real].tolist())
        scores = {name: values[row][real] for name, values in first.items()}
        results.append(ExplanationResult(tokens, scores, prediction=f"{task}, example {row + 1} (last layer of per-layer methods)"))
    return results


def _all_processes(timing: dict[str, list[float]]) -> dict[str, list[float]]:
    """``{method: [seconds, examples]}`` summed over the processes of ``accelerate launch``."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return timing
    from accelerate.utils import gather_object

    total: dict[str, list[float]] = {}
    for part in gather_object([timing]):
        for name, (seconds, rows) in part.items():
            spent = total.setdefault(name, [0.0, 0])
            spent[0] += seconds
            spent[1] += rows
    return total


def method_name(entry: str) -> str:
    """The method a benchmark entry stands for in every task: ``rollout L6`` (the last layer of a
    6-layer model) is ``rollout (last layer)``, ``rollout, best L3`` is ``rollout (best layer)``;
    a per-layer method named alone (the context task's rows, explained through
    :class:`~captum_attnflow.LLMAttentionAttribution` at its default, the last layer) is its last
    layer too; other names stay.

    Example::

        >>> from captum_attnflow.benchmark.runner import method_name
        >>> method_name("rollout L6"), method_name("flow, best L2"), method_name("rollout"), method_name("saliency")
        ('rollout (last layer)', 'flow (best layer)', 'rollout (last layer)', 'saliency')
    """
    match = _LAYERED.fullmatch(entry)
    if match is not None:
        return f"{match['method']} ({'best' if match['best'] else 'last'} layer)"
    if entry in METHODS and METHODS[entry].per_layer:
        return f"{entry} (last layer)"
    return entry


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
