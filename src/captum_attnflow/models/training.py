"""What the training of the bundled models shares: AdamW with a linear schedule and its step, the
options of the training commands (``python -m captum_attnflow.models.train``, ``models.train_lm``,
``adversarial.train_tagger``) and the checkpoint they save.

Each command keeps its own defaults and help text; the options' names, types and wording are
defined here once, so ``--help`` reads the same way in every command.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import get_linear_schedule_with_warmup


def adamw_with_schedule(
    model: nn.Module, lr: float, weight_decay: float, warmup: int, steps: int, betas: tuple[float, float] = (0.9, 0.999)
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``model``'s parameters (moment decays ``betas``) and its learning-rate schedule:
    linear warm-up from 0 to ``lr`` over ``warmup`` steps, then linear decay to 0 at ``steps``.

    Example::

        >>> optimizer, schedule = adamw_with_schedule(nn.Linear(2, 1), lr=1e-3, weight_decay=0.01, warmup=1, steps=4)
        >>> schedule.get_last_lr()  # warm-up starts from 0
        [0.0]
    """
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=betas)
    return optimizer, get_linear_schedule_with_warmup(optimizer, warmup, steps)


def optimizer_step(loss: Tensor, model: nn.Module, optimizer: torch.optim.Optimizer, schedule: Any) -> None:
    """One training step on the scalar ``loss``: back-propagate, clip ``model``'s gradient norm at 1,
    step the optimizer and its schedule, clear the gradients.

    Example::

        >>> model = nn.Linear(2, 1)
        >>> optimizer, schedule = adamw_with_schedule(model, lr=0.1, weight_decay=0.0, warmup=0, steps=2)
        >>> before = model.weight.detach().clone()
        >>> optimizer_step(model(torch.ones(1, 2)).sum(), model, optimizer, schedule)
        >>> bool((model.weight != before).all()), model.weight.grad
        (True, None)
    """
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad()


def add_optimizer_options(
    parser: argparse.ArgumentParser, steps: int, batch_size: int, batch_unit: str, lr: str, warmup: int | None = None
) -> None:
    """Add ``--out`` (required), ``--steps``, ``--batch-size``, ``--lr`` and, given a ``warmup``
    default, ``--warmup``.

    Args:
        parser: the command's parser.
        steps, batch_size, warmup: the defaults of those options.
        batch_unit: what a batch holds, for the help (``"examples"``, ``"sentences"``).
        lr: the default peak learning rate as the help writes it, e.g. ``"1e-3"``.

    Example::

        >>> parser = argparse.ArgumentParser()
        >>> add_optimizer_options(parser, steps=10, batch_size=4, batch_unit="sentences", lr="1e-3")
        >>> parser.parse_args(["--out", "DIR"])
        Namespace(out='DIR', steps=10, batch_size=4, lr=0.001)
    """
    parser.add_argument("--out", required=True, help="directory for the model, tokenizer and eval_results.json")
    parser.add_argument("--steps", type=int, default=steps, help=f"optimizer steps (default {steps})")
    parser.add_argument("--batch-size", type=int, default=batch_size, help=f"{batch_unit} per step (default {batch_size})")
    parser.add_argument("--lr", type=float, default=float(lr), help=f"peak learning rate of AdamW (default {lr})")
    if warmup is not None:
        parser.add_argument("--warmup", type=int, default=warmup, help=f"linear warm-up steps (default {warmup})")


def add_run_options(parser: argparse.ArgumentParser, seeded: str, threads: int, eval_seeded: str | None = None) -> None:
    """Add ``--seed`` (default 0), given ``eval_seeded`` ``--eval-seed`` (default 1), and ``--threads``.

    Args:
        parser: the command's parser.
        seeded: what ``--seed`` seeds, for the help.
        threads: the default number of torch CPU threads.
        eval_seeded: what ``--eval-seed`` seeds; None adds no ``--eval-seed``.

    Example::

        >>> parser = argparse.ArgumentParser()
        >>> add_run_options(parser, "the data", threads=1, eval_seeded="the held-out split")
        >>> parser.parse_args([])
        Namespace(seed=0, eval_seed=1, threads=1)
    """
    parser.add_argument("--seed", type=int, default=0, help=f"seed of {seeded} (default 0)")
    if eval_seeded is not None:
        parser.add_argument("--eval-seed", type=int, default=1, help=f"seed of {eval_seeded} (default 1)")
    parser.add_argument("--threads", type=int, default=threads, help=f"torch CPU threads (default {threads})")


def save_run(args: argparse.Namespace, model: Any, tokenizer: Any, results: dict, minutes: float) -> dict:
    """Save a trained model and its tokenizer to ``args.out`` (``save_pretrained``), with
    ``eval_results.json``: ``results``, the training time and the settings (``args`` but ``out``).

    Returns:
        dict: what ``eval_results.json`` holds.

    Example::

        >>> import tempfile
        >>> from captum_attnflow.data import build_tokenizer
        >>> from captum_attnflow.models import AgreementConfig, AgreementModel
        >>> model = AgreementModel(AgreementConfig(num_hidden_layers=1))
        >>> with tempfile.TemporaryDirectory() as out:
        ...     saved = save_run(argparse.Namespace(out=out, steps=2), model, build_tokenizer(), {"n": 8}, 0.5)
        >>> saved
        {'n': 8, 'train_minutes': 0.5, 'settings': {'steps': 2}}
    """
    results = {**results, "train_minutes": minutes, "settings": {key: value for key, value in vars(args).items() if key != "out"}}
    out = Path(args.out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "eval_results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results
