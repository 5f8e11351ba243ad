"""Train the bundled chunk tagger: ``python -m captum_attnflow.adversarial.train_tagger --out DIR``.

Trains a :class:`~captum_attnflow.models.tagger.TaggerModel` (:func:`~captum_attnflow.models.tagger.bundled_tagger_config`:
4 layers, 4 heads, 64 wide) on generated sentences with their gold chunk tags
(:mod:`captum_attnflow.data.chunking`) with the chunking task and training loop of the
adversarial study (:func:`~captum_attnflow.adversarial.chunking_task`,
:func:`~captum_attnflow.adversarial.train`), measures its chunk F1 on the held-out split and
saves it. The bundled checkpoint (``assets/tagger``, loaded by
:func:`~captum_attnflow.models.tagger.load_chunk_tagger`) was made with the defaults.

Options: ``--steps`` (1000), ``--batch-size`` (32), ``--lr`` (3e-3), ``--train-examples``
(8192), ``--eval-examples`` (1024), ``--seed`` (0), ``--threads`` (1).
"""

from __future__ import annotations

import argparse
import time
from typing import Sequence

import torch

from captum_attnflow.adversarial.tasks import chunking_task
from captum_attnflow.adversarial.training import train as train_steps
from captum_attnflow.data import build_tokenizer
from captum_attnflow.models.tagger import TaggerModel, bundled_tagger_config
from captum_attnflow.models.training import add_optimizer_options, add_run_options, save_run


def train(args: argparse.Namespace) -> dict:
    """Train, evaluate (held-out chunk F1) and save the model, tokenizer and ``eval_results.json`` to ``--out``.

    Example::

        >>> import tempfile
        >>> from captum_attnflow.models.tagger import load_chunk_tagger
        >>> threads = torch.get_num_threads()
        >>> with tempfile.TemporaryDirectory() as out:  # two steps: a smoke run, not a model
        ...     results = train(_parser().parse_args(["--out", out, "--steps", "2", "--train-examples", "64",
        ...         "--eval-examples", "32", "--threads", str(threads)]))
        ...     model, _ = load_chunk_tagger(out)
        >>> results["n"], model.config.num_hidden_layers
        (32, 4)
    """
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    task = chunking_task(args.train_examples, args.eval_examples, args.batch_size, args.seed)
    model = TaggerModel(bundled_tagger_config(attn_implementation="eager"))
    started = time.perf_counter()
    train_steps(model, task, args.steps, lr=args.lr, seed=args.seed, progress=False)
    minutes = (time.perf_counter() - started) / 60
    model.set_attn_implementation("sdpa")
    results = {"n": args.eval_examples, "chunk_f1": task.score(model)}
    return save_run(args, model, build_tokenizer(), results, minutes)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m captum_attnflow.adversarial.train_tagger",
        description="Train the chunk tagger on generated sentences and report its held-out chunk F1.",
    )
    add_optimizer_options(parser, steps=1000, batch_size=32, batch_unit="sentences", lr="3e-3")
    parser.add_argument("--train-examples", type=int, default=8192, help="training sentences (default 8192)")
    parser.add_argument("--eval-examples", type=int, default=1024, help="held-out sentences (default 1024)")
    add_run_options(parser, "the data, init and batch order", threads=1)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """The training command: parse ``argv``, :func:`train`, print the held-out chunk F1."""
    results = train(_parser().parse_args(argv))
    print(f"held-out chunk F1: {results['chunk_f1']:.4f} (n={results['n']}), {results['train_minutes']:.1f} min")


if __name__ == "__main__":
    main()
