"""The benchmark on a user's own model and data: ``captum-attnflow benchmark --model DIR --data FILE``.

A Hugging Face sequence classifier (``*ForSequenceClassification``) or causal language model
(``*ForCausalLM``) saved with its tokenizer, and a CSV, JSON Lines or Parquet file read with the
``datasets`` library, become one more task of :mod:`captum_attnflow.benchmark`: every method of
the registry that applies to the model, the gradient baselines and the random floor explain
each row, and the faithfulness metrics rank them, with the same report as the built-in tasks.

* A classifier explains the predicted class of ``text`` (and ``pair``, for sentence pairs), or
  the gold class of ``label`` (an index or a name of ``config.label2id``).
* A language model explains, at the last token of ``prompt`` (the position that writes the
  next token), the logit of ``target``'s first token, or of the greedy next token.
* ``contrast`` makes it contrastive (Yin & Neubig, EMNLP 2022): every method explains
  score(target) - score(contrast) (a class, or a text whose first token is taken), and the
  metrics measure that difference (without softmax).

Tokens are deleted by removal (the model gets them masked out of its attention mask) unless
``deletion`` names a replacement token. Everything is checked before the model runs: columns,
an empty file, labels outside the classifier's classes, a model no method explains, texts
longer than the model's positions (truncated with a warning, and counted in the report).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from captum_attnflow.benchmark.context import context_examples, run_context_task
from captum_attnflow.benchmark.runner import FLOOR, BenchmarkResult, run_task
from captum_attnflow.benchmark.tasks import Task, VerbLogits
from captum_attnflow.benchmark.user_data import Columns, encode_rows, select_rows
from captum_attnflow.evaluate import Leaderboard
from captum_attnflow.hf import load_pretrained, token_id
from captum_attnflow.hf.architectures import ARCHITECTURES
from captum_attnflow.methods import EXTRA_METHODS, METHODS

__all__ = ["ContrastScore", "applicable_methods", "load_model", "model_kind", "run_user_benchmark"]

DELETIONS = ("remove", "mask", "unk", "pad")
_ATTENTION = ("raw", "rollout", "flow", "gradient_rollout")
_INTERNALS = ("value_zeroing", "alti", "norm")
_EMBEDDING = ("saliency", "input_x_gradient", "integrated_gradients")


class ContrastScore(nn.Module):
    """score(target) - score(contrast) of a model returning (B, C) scores, as (B, 1): what a
    contrastive explanation explains, as one score every method and metric can take.

    ``forward(input_ids, target (B,), contrast (B,), attention_mask=None) -> (B, 1)``.

    Example::

        >>> import torch
        >>> scores = ContrastScore(lambda ids, attention_mask=None: ids.float())
        >>> scores(torch.tensor([[1, 4, 2]]), torch.tensor([1]), torch.tensor([2]))
        tensor([[2.]])
    """

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, target: Tensor, contrast: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """(B, 1): the model's score of ``target`` minus its score of ``contrast``, per row."""
        scores = self.model(input_ids, attention_mask=attention_mask)
        scores = getattr(scores, "logits", scores)
        return (scores.gather(-1, target[:, None]) - scores.gather(-1, contrast[:, None])).float()


def model_kind(model: Any) -> str:
    """``"classifier"`` or ``"lm"``; other models are refused, naming what would run on them."""
    name = type(model).__name__
    config = getattr(model, "config", None)
    if name.endswith("ForSequenceClassification") or getattr(config, "model_type", None) == "captum_attnflow_agreement":
        return "classifier"  # the bundled verb-number classifier too
    if (name.endswith("ForCausalLM") or name.endswith("LMHeadModel")) and not getattr(config, "is_encoder_decoder", False):
        return "lm"
    runnable = applicable_methods(model, None)[0] if config is not None else [FLOOR]
    raise ValueError(
        f"the benchmark explains a *ForSequenceClassification or *ForCausalLM model; got {name}. "
        f"On its architecture these methods would run: {', '.join(runnable)}; load it with "
        "AutoModelForSequenceClassification or AutoModelForCausalLM (an encoder-decoder: explain it with generate)."
    )


def applicable_methods(model: Any, tokenizer: Any) -> tuple[list[str], dict[str, str]]:
    """``(names that apply, {name: why not})`` for ``model``: attention-weight methods need
    attention heads, the decomposition methods a model type of the architecture table, the
    gradient baselines an embedding layer, blank-out an unknown token, integrated gradients a
    padding token for its baseline; the random floor always applies.

    Example::

        >>> from captum_attnflow import load_agreement_model
        >>> model, tokenizer = load_agreement_model()
        >>> applicable_methods(model, tokenizer)[0][:4]
        ['raw', 'rollout', 'flow', 'gradient_rollout']
    """
    config = model.config
    why: dict[str, str] = {}
    if getattr(config, "num_attention_heads", None) is None or getattr(config, "is_encoder_decoder", False):
        why.update(dict.fromkeys(_ATTENTION, "needs a self-attention transformer (no attention heads found)"))
    if config.model_type not in ARCHITECTURES:
        why.update(dict.fromkeys(_INTERNALS, f"knows the model types {sorted(ARCHITECTURES)}, not {config.model_type!r}"))
    getter = getattr(model, "get_input_embeddings", None)
    if getter is None or getter() is None:
        why.update(dict.fromkeys(_EMBEDDING, "needs the token embedding layer"))
    if tokenizer is not None and getattr(tokenizer, "unk_token_id", None) is None:
        why["blankout"] = "needs the tokenizer's unknown token (the blank)"
    if tokenizer is not None and all(getattr(source, "pad_token_id", None) is None for source in (tokenizer, config)):
        why.setdefault("integrated_gradients", "needs a padding token (its baseline)")
    names = [name for name in (*METHODS, *EXTRA_METHODS, FLOOR) if name not in why]
    return names, why


def load_model(
    directory: str | Path,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    device_map: str | dict | None = None,
) -> tuple[nn.Module, Any]:
    """A classifier or causal LM and its tokenizer from a ``save_pretrained`` directory, offline,
    placed by ``device``, ``dtype`` and ``device_map`` as
    :func:`~captum_attnflow.hf.placement.load_pretrained` places it (default: the CPU, the saved dtype)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"--model {directory} holds no config.json: pass a directory saved with save_pretrained.")
    if '"captum_attnflow_agreement"' in (directory / "config.json").read_text():
        from captum_attnflow.models import load_agreement_model

        return load_agreement_model(directory, device, dtype, device_map)
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    heads = " ".join(config.architectures or [])
    loader = AutoModelForCausalLM if "CausalLM" in heads or "LMHeadModel" in heads else AutoModelForSequenceClassification
    try:
        model = load_pretrained(loader, directory, device, dtype, device_map, local_files_only=True)
    except ValueError as error:
        raise ValueError(f"--model {directory}: {error}") from error
    return model, AutoTokenizer.from_pretrained(directory, local_files_only=True)


def run_user_benchmark(
    model: nn.Module,
    tokenizer: Any,
    dataset: Any,
    columns: Columns | None = None,
    methods: Sequence[str] | None = None,
    examples: int | None = None,
    seed: int = 0,
    batch_size: int = 32,
    deletion: str = "remove",
    name: str = "data",
    n_resamples: int = 2000,
    show_progress: bool = True,
    checkpoint_dir: str | Path | None = None,
) -> BenchmarkResult:
    """The leaderboard of the methods that apply to ``model`` on ``dataset`` (module docstring).

    Called by :func:`~captum_attnflow.benchmark.run_benchmark` with ``model=``, ``tokenizer=``,
    ``dataset=``; the arguments are documented there.
    """
    if deletion not in DELETIONS:
        raise ValueError(f"deletion must be one of {', '.join(DELETIONS)}, got {deletion!r}.")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
    columns = columns or Columns()
    if columns.context is not None:
        return _context_benchmark(model, tokenizer, dataset, columns, methods, examples, seed, name, n_resamples, show_progress)
    kind = model_kind(model)
    runnable, why = applicable_methods(model, tokenizer)
    names = runnable if methods is None else list(methods)
    refused = {n: why.get(n, "unknown method") for n in names if n not in runnable}
    if refused:
        raise ValueError(
            "methods that do not apply to this model: "
            + "; ".join(f"{n} ({reason})" for n, reason in refused.items())
            + f". These would run: {', '.join(runnable)}."
        )
    if deletion != "remove":
        token_id(model, deletion, tokenizer, argument="deletion")  # refused now if the token is missing
    pad = _pad_id(tokenizer, model)
    rows = select_rows(dataset, columns, kind, examples, seed, model, tokenizer)
    batches, truncated, limit = encode_rows(rows, kind, tokenizer, batch_size, pad if pad is not None else 0, _limit(model, tokenizer))
    notes = []
    if truncated:
        note = f"{truncated} of {len(rows['input'])} texts were longer than the model's {limit} positions and were truncated."
        warnings.warn(note, stacklevel=2)
        notes.append(note)
    explained = VerbLogits(model).eval() if kind == "lm" else model
    contrastive = rows.get("contrast") is not None
    if contrastive:
        explained = ContrastScore(explained).eval()
        for batch in batches:
            if "labels" not in batch:  # the predicted class / greedy next token, against the contrast
                with torch.no_grad():
                    batch["labels"] = explained.model(batch["input_ids"], attention_mask=batch["attention_mask"])
                    batch["labels"] = getattr(batch["labels"], "logits", batch["labels"]).argmax(-1)
            batch["additional_forward_args"] = (batch.pop("labels"), batch.pop("contrast"))
            batch["labels"] = torch.zeros(len(batch["input_ids"]), dtype=torch.long)
    logits = not contrastive and (kind == "lm" or model.config.num_labels > 1)
    options = {} if deletion == "remove" else {"deletion": deletion}
    if logits:
        metrics = {metric: dict(options) for metric in ("comprehensiveness", "sufficiency", "log-odds", "deletion-area")}
    else:  # one score (a difference, a regression output): measured as it is
        metrics = {metric: {**options, "softmax": False} for metric in ("comprehensiveness", "sufficiency", "deletion-area")}
    task = Task(name, f"{type(model).__name__} on the user's data", lambda *_: (explained, tokenizer, batches), metrics, logits=logits)
    into: tuple[dict, dict, dict, dict] = ({}, {}, {}, {})
    shown: dict[str, list] = {}
    run_task(task, (explained, tokenizer, batches), names, seed, show_progress, checkpoint_dir, into, shown)
    values, times, counts, directions = into
    return BenchmarkResult(Leaderboard(values, higher_is_better=directions, n_resamples=n_resamples), times, counts, notes, shown)


def _pad_id(tokenizer: Any, model: Any) -> int | None:
    for source in (tokenizer, model.config):
        for key in ("pad_token_id", "eos_token_id"):
            value = getattr(source, key, None)
            if isinstance(value, int):
                return value
    return None


def _limit(model: Any, tokenizer: Any) -> int | None:
    """The longest input the model takes: its position embeddings, or the tokenizer's maximum."""
    limits = [getattr(model.config, key, None) for key in ("max_position_embeddings", "n_positions")]
    limits.append(getattr(tokenizer, "model_max_length", None))
    limits = [value for value in limits if isinstance(value, int) and 0 < value < 1_000_000]
    return min(limits) if limits else None


def _context_benchmark(
    model: nn.Module, tokenizer: Any, dataset: Any, columns: Columns, methods: Sequence[str] | None,
    examples: int | None, seed: int, name: str, n_resamples: int, show_progress: bool,
) -> BenchmarkResult:
    """The context task on the user's rows (:mod:`captum_attnflow.benchmark.context`)."""
    if model_kind(model) != "lm":
        raise ValueError(f"the context task explains a causal language model's answer; {type(model).__name__} is not one.")
    if examples is not None and examples < len(dataset):
        dataset = dataset.shuffle(seed=seed).select(range(examples))
    names = [column for column in (columns.context, columns.question, columns.answer, columns.gold) if column]
    missing = [column for column in names if column not in dataset.column_names]
    if missing:
        raise ValueError(f"the data has no column {missing[0]!r}; its columns are {', '.join(dataset.column_names)}.")
    rows = context_examples(dataset.to_dict(), columns.question, columns.context, columns.answer, columns.gold, columns.by)
    into: tuple[dict, dict, dict, dict] = ({}, {}, {}, {})
    notes = run_context_task(model, tokenizer, rows, methods, seed, show_progress, into, name=name)
    values, times, counts, directions = into
    return BenchmarkResult(Leaderboard(values, higher_is_better=directions, n_resamples=n_resamples), times, counts, notes)
