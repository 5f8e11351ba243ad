"""The user's data for :mod:`captum_attnflow.benchmark.user`: read, checked and encoded into batches.

Everything here runs before the model does, so that a wrong column, an empty file or a label
the classifier does not have is reported at once, not after minutes of explaining.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# File suffix -> the datasets builder reading it, and its options.
_BUILDERS = {
    ".csv": ("csv", {}), ".tsv": ("csv", {"delimiter": "\t"}), ".jsonl": ("json", {}), ".json": ("json", {}),
    ".parquet": ("parquet", {}),
}


@dataclass(frozen=True)
class Columns:
    """The data's column names.

    Attributes:
        text: a classifier's input text (default ``"text"``).
        pair: the second text of a sentence pair (None: single texts).
        label: the gold class to explain (an index or a name of ``config.label2id``); None:
            the predicted class. Classifiers only.
        prompt: a language model's prompt (default ``"prompt"``).
        target: the continuation whose first token is explained; None: the greedy next token.
        contrast: a contrastive explanation's alternative (a class for a classifier, a text
            for a language model); None: not contrastive.
        context: a language model's context of sources (None: not the context task); with it
            the rows are the context task's (:func:`~captum_attnflow.benchmark.context.context_examples`):
            the context split into sources ``by`` sentence, paragraph or line, the ``question``
            after it, the ``answer`` explained and optionally the ``gold`` source (its index or
            a piece of its text).
    """

    text: str = "text"
    pair: str | None = None
    label: str | None = None
    prompt: str = "prompt"
    target: str | None = None
    contrast: str | None = None
    context: str | None = None
    question: str = "question"
    answer: str = "answer"
    gold: str | None = None
    by: str = "sentence"


def load_data(path: str | Path) -> Any:
    """A CSV (``.csv``, ``.tsv``), JSON Lines (``.jsonl``, ``.json``) or Parquet file as a
    ``datasets.Dataset``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: another suffix, an unreadable file, or one without rows.
    """
    import datasets

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--data {path} is not a file.")
    if path.suffix.lower() not in _BUILDERS:
        raise ValueError(f"--data {path}: read are {', '.join(_BUILDERS)} files; convert it to one of them.")
    builder, options = _BUILDERS[path.suffix.lower()]
    if path.stat().st_size == 0:
        raise ValueError(f"--data {path} is empty: it has no rows to explain.")
    if builder == "csv" and sum(1 for line in path.open(encoding="utf-8", errors="replace") if line.strip()) < 2:
        raise ValueError(f"--data {path} has a header but no rows to explain.")
    quiet = not datasets.utils.logging.is_progress_bar_enabled()
    datasets.utils.logging.disable_progress_bar()
    try:
        dataset = datasets.load_dataset(builder, data_files=str(path), split="train", **options)
    except Exception as error:  # the builders raise pandas', pyarrow's and their own errors
        raise ValueError(f"--data {path} cannot be read as {builder}: {type(error).__name__}: {error}") from error
    finally:
        if not quiet:
            datasets.utils.logging.enable_progress_bar()
    if len(dataset) == 0:
        raise ValueError(f"--data {path} has a header but no rows to explain.")
    return dataset


def select_rows(dataset: Any, columns: Columns, kind: str, examples: int | None, seed: int, model: Any, tokenizer: Any) -> dict:
    """The rows to explain, checked: ``{"input": texts or prompts, "pair": texts or None,
    "labels": class or token ids or None, "contrast": ids or None}``; ``examples`` of them
    drawn with ``seed`` (all, in file order, for None or more than there are)."""
    if not hasattr(dataset, "column_names") or not hasattr(dataset, "select"):
        raise TypeError(
            f"dataset must be a datasets.Dataset (one split: dataset['train'] of a DatasetDict), got {type(dataset).__name__}."
        )
    if examples is not None and (isinstance(examples, bool) or not isinstance(examples, int) or examples < 1):
        raise ValueError(f"examples must be a positive int or None (all rows), got {examples!r}.")
    if kind == "lm" and (columns.label or columns.pair):
        raise ValueError(
            "--label-column and --pair-column are for classifiers; a language model reads --prompt-column "
            "and explains --target-column's first token (or the greedy next token)."
        )
    if kind == "classifier" and columns.target:
        raise ValueError("--target-column is for language models; a classifier's gold class is --label-column.")
    needed = {"text": columns.text, "pair": columns.pair, "label": columns.label, "contrast": columns.contrast}
    if kind == "lm":
        needed = {"prompt": columns.prompt, "target": columns.target, "contrast": columns.contrast}
    missing = {role: name for role, name in needed.items() if name is not None and name not in dataset.column_names}
    if missing:
        raise ValueError(
            "the data has no column " + ", ".join(f"{name!r} (the {role})" for role, name in missing.items())
            + f"; its columns are {dataset.column_names}: name yours with --{next(iter(missing))}-column."
        )
    if len(dataset) == 0:
        raise ValueError("the data has no rows to explain.")
    if examples is not None and examples < len(dataset):
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed))[:examples].tolist()
        dataset = dataset.select(order)
    data = dataset.to_dict()
    first = needed["text" if kind == "classifier" else "prompt"]
    rows = {"input": _texts(data[first], first), "pair": None, "labels": None, "contrast": None}
    if columns.pair:
        rows["pair"] = _texts(data[columns.pair], columns.pair)
    if kind == "classifier":
        for role, name in (("labels", columns.label), ("contrast", columns.contrast)):
            if name:
                rows[role] = _classes(data[name], name, model.config)
    else:
        for role, name in (("labels", columns.target), ("contrast", columns.contrast)):
            if name:
                texts = _texts(data[name], name)
                rows[role] = [_first_token(tokenizer, prompt, text) for prompt, text in zip(rows["input"], texts)]
    return rows


def encode_rows(rows: dict, kind: str, tokenizer: Any, batch_size: int, pad: int, limit: int | None) -> tuple[list[dict], int, int | None]:
    """``(batches, how many texts were truncated, the limit)``: right-padded batches of rows of
    similar length with ``input_ids``, ``attention_mask``, ``special_tokens_mask`` and, where
    given, ``labels`` and ``contrast``. A classifier's texts are truncated by the tokenizer; a
    language model's prompts keep their last ``limit`` tokens (the ones next to the explained one)."""
    texts, pairs = rows["input"], rows["pair"]
    args = (texts,) if pairs is None else (texts, pairs)
    encoded = tokenizer(*args, return_special_tokens_mask=True)
    ids, special = encoded["input_ids"], encoded["special_tokens_mask"]
    truncated = sum(len(row) > limit for row in ids) if limit is not None else 0
    if truncated and kind == "classifier":
        encoded = tokenizer(*args, return_special_tokens_mask=True, truncation=True, max_length=limit)
        ids, special = encoded["input_ids"], encoded["special_tokens_mask"]
    elif truncated:
        ids, special = [row[-limit:] for row in ids], [row[-limit:] for row in special]
    if any(len(row) == 0 for row in ids):
        raise ValueError("a text has no tokens: every row needs some text to explain.")
    order = sorted(range(len(ids)), key=lambda index: len(ids[index]))
    batches = []
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        n = max(len(ids[index]) for index in chunk)
        batch = {
            "input_ids": torch.tensor([ids[i] + [pad] * (n - len(ids[i])) for i in chunk]),
            "attention_mask": torch.tensor([[1] * len(ids[i]) + [0] * (n - len(ids[i])) for i in chunk]),
            "special_tokens_mask": torch.tensor([list(special[i]) + [1] * (n - len(ids[i])) for i in chunk]),
        }
        for key in ("labels", "contrast"):
            if rows[key] is not None:
                batch[key] = torch.tensor([rows[key][i] for i in chunk])
        batches.append(batch)
    return batches, truncated, limit


def _texts(values: list, column: str) -> list[str]:
    bad = [index for index, value in enumerate(values) if not isinstance(value, str) or not value.strip()]
    if bad:
        raise ValueError(f"column {column!r} must hold non-empty texts; rows {bad[:5]} do not (e.g. {values[bad[0]]!r}).")
    return values


def _classes(values: list, column: str, config: Any) -> list[int]:
    """Class indices from indices or names of ``config.label2id``, in the classifier's range."""
    names = {str(name): int(index) for name, index in (getattr(config, "label2id", None) or {}).items()}
    count = config.num_labels
    indices, bad = [], []
    for row, value in enumerate(values):
        if isinstance(value, str) and value.strip() in names:
            index = names[value.strip()]
        elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
            index = int(value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer():
            index = int(value)
        else:
            index = None
        if index is None or not 0 <= index < count:
            bad.append((row, value))
        indices.append(index)
    if bad:
        shown = ", ".join(f"row {row}: {value!r}" for row, value in bad[:5])
        raise ValueError(
            f"column {column!r} has labels outside the classifier's {count} classes ({shown}); labels are "
            f"indices 0..{count - 1} or the names {sorted(names, key=names.get)} of config.label2id."
        )
    return indices


def _first_token(tokenizer: Any, prompt: str, text: str) -> int:
    """The id of ``text``'s first token where it continues ``prompt`` (a space between them
    unless one is there), as the tokenizer splits the two written together."""
    joint = prompt + ("" if prompt[-1:].isspace() or text[:1].isspace() else " ") + text
    before = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    after = tokenizer(joint, add_special_tokens=False)["input_ids"]
    if after[: len(before)] == before and len(after) > len(before):
        return after[len(before)]
    alone = tokenizer(joint[len(prompt) :], add_special_tokens=False)["input_ids"]
    if not alone:
        raise ValueError(f"the target {text!r} has no tokens.")
    return alone[0]
