"""``run_benchmark``: the leaderboard on the bundled tasks, or on the user's own model and data."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
from torch import nn

from captum_attnflow.benchmark.context import CONTEXT, CONTEXT_PEERS, load_context_task, run_context_task
from captum_attnflow.benchmark.runner import FLOOR, BenchmarkResult, run_task
from captum_attnflow.benchmark.tasks import TASKS
from captum_attnflow.benchmark.user import run_user_benchmark
from captum_attnflow.benchmark.user_data import Columns
from captum_attnflow.evaluate import Leaderboard
from captum_attnflow.methods import EXTRA_METHODS, METHODS

# What --quick runs: one method of each kind and the floor, on fewer examples.
QUICK_METHODS = ("rollout", "alti", "gradient_rollout", "saliency", FLOOR)
QUICK_EXAMPLES = 16


def run_benchmark(
    tasks: Sequence[str] = (*TASKS, CONTEXT),
    methods: Sequence[str] | None = None,
    examples: int | None = None,
    seed: int = 0,
    n_resamples: int = 2000,
    show_progress: bool = True,
    checkpoint_dir: str | Path | None = None,
    *,
    model: nn.Module | None = None,
    tokenizer: Any = None,
    dataset: Any = None,
    columns: Columns | None = None,
    batch_size: int = 32,
    deletion: str = "remove",
    name: str = "data",
    device: str | None = None,
    dtype: str | None = None,
    device_map: str | dict | None = None,
) -> BenchmarkResult:
    """Run every method on every task and rank them by faithfulness (see :mod:`captum_attnflow.benchmark`),
    or on your own model and data (``model``, ``tokenizer``, ``dataset``; see
    :mod:`captum_attnflow.benchmark.user`).

    Args:
        tasks: names of :data:`~captum_attnflow.benchmark.tasks.TASKS`, and ``"context"``
            (:mod:`captum_attnflow.benchmark.context`: which source of a prompt a language
            model's answer came from).
        methods: names of :data:`~captum_attnflow.methods.METHODS` and
            :data:`~captum_attnflow.methods.EXTRA_METHODS`, ``"random"``, and the context task's
            other rows (:data:`~captum_attnflow.benchmark.context.CONTEXT_PEERS`); default all of
            them (those that apply to ``model`` and to each task).
        examples: held-out examples per task, default 64 (the similarity task has 64 pairs, the
            chunking task counts words); rows of ``dataset`` drawn with ``seed``, default all.
        seed: seed of the examples and of the random scores.
        n_resamples: bootstrap resamples of each interval.
        show_progress: tqdm bars over the batches.
        checkpoint_dir: a folder for one Evaluator checkpoint per task
            (``<task>.npz``): an interrupted run started again with the same arguments
            resumes where it stopped, also under ``accelerate launch`` (each process re-runs
            only its unfinished batches); the times then cover the examples run since.
        model: a Hugging Face ``*ForSequenceClassification`` or ``*ForCausalLM`` model to
            benchmark on ``dataset`` instead of the tasks.
        tokenizer: its tokenizer.
        dataset: a ``datasets.Dataset`` (e.g. :func:`~captum_attnflow.benchmark.user_data.load_data`).
        columns: a :class:`~captum_attnflow.benchmark.user_data.Columns` naming the text
            (``"text"``), pair, label, prompt (``"prompt"``), target and contrast columns.
        batch_size: rows per batch of ``dataset``.
        deletion: how the faithfulness metrics delete tokens of ``dataset``: ``"remove"``
            (default, out of the attention mask) or a replacement token, ``"mask"``,
            ``"unk"``, ``"pad"``.
        name: the task name of ``dataset`` in the tables (and its checkpoint, ``<name>.npz``).
        device: where the bundled tasks' models run (``"cpu"``, ``"cuda"``, ``"cuda:N"``,
            ``"mps"``, ``"auto"`` for the first CUDA device when there is one); None: the CPU.
            Your ``model`` runs where you put it.
        dtype: the dtype of the bundled tasks' models (``"float32"``, ``"bfloat16"``,
            ``"float16"``); None: the saved float32.
        device_map: accelerate's device map for the bundled tasks' models instead of ``device``.

    Returns:
        BenchmarkResult: the leaderboard and the timings.

    Raises:
        ValueError: before the model runs: unknown names, a missing column, an empty dataset,
            labels outside the classifier's classes, a model no method explains (the message
            lists what would run), an unknown device or dtype or one this torch cannot use.

    Example::

        >>> from captum_attnflow.benchmark import run_benchmark
        >>> result = run_benchmark(tasks=["agreement"], methods=["rollout", "random"], examples=4,
        ...                        n_resamples=99, show_progress=False)
        >>> sorted(result.seconds["agreement"])
        ['random', 'rollout']
        >>> "agreement: subject-first" in result.leaderboard.metrics
        True

        Your own classifier and rows:

        >>> import datasets
        >>> from captum_attnflow import load_agreement_model
        >>> model, tokenizer = load_agreement_model()
        >>> rows = datasets.Dataset.from_dict({"text": ["the keys to the cabinet", "the key near the cabinets"]})
        >>> mine = run_benchmark(model=model, tokenizer=tokenizer, dataset=rows, methods=["rollout", "random"],
        ...                      n_resamples=99, show_progress=False)
        >>> mine.examples, "data: sufficiency" in mine.leaderboard.metrics
        ({'data': 2}, True)
    """
    if dataset is not None or model is not None:
        if model is None or tokenizer is None or dataset is None:
            raise ValueError("benchmarking your own model needs model=, tokenizer= and dataset= (a datasets.Dataset).")
        return run_user_benchmark(
            model, tokenizer, dataset, columns, methods, examples, seed, batch_size, deletion, name,
            n_resamples=n_resamples, show_progress=show_progress, checkpoint_dir=checkpoint_dir,
        )
    examples = 64 if examples is None else examples
    known = (*METHODS, *EXTRA_METHODS, FLOOR, *CONTEXT_PEERS)
    names = known if methods is None else tuple(methods)
    unknown = [name for name in names if name not in known] + [task for task in tasks if task not in (*TASKS, CONTEXT)]
    if unknown or not names or not tasks:
        raise ValueError(
            f"unknown or missing names {unknown}: methods are {', '.join(known)}; tasks are {', '.join((*TASKS, CONTEXT))}."
        )
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
        raise ValueError(f"examples must be a positive int, got {examples!r}.")
    values: dict[tuple, np.ndarray] = {}
    times: dict[str, dict[str, float]] = {}
    counts: dict[str, int] = {}
    directions: dict[str, bool] = {}
    shown: dict[str, list] = {}
    notes: list[str] = []
    for name in tasks:
        if name == CONTEXT:
            model, tokenizer, drawn = load_context_task(examples, seed, device=device, dtype=dtype, device_map=device_map)
            rows = None if methods is None else names
            notes += run_context_task(model, tokenizer, drawn, rows, seed, show_progress, (values, times, counts, directions))
            continue
        task = TASKS[name]
        loaded = task.load(examples, seed, device=device, dtype=dtype, device_map=device_map)
        evaluated = [name for name in names if name not in CONTEXT_PEERS]
        run_task(task, loaded, evaluated, seed, show_progress, checkpoint_dir, (values, times, counts, directions), shown)
    board = Leaderboard(values, higher_is_better=directions, n_resamples=n_resamples)
    return BenchmarkResult(board, times, counts, notes=notes, shown=shown)
