"""Train the agreement language model: ``python -m captum_attnflow.models.train_lm --out DIR``.

Trains the :func:`~captum_attnflow.models.language_model.lm_config` GPT-2 on generated training
sentences (``the keys to the cabinet are .``, see :mod:`captum_attnflow.models.language_model`),
then measures on held-out sentences how often it prefers the agreeing copula and how often raw
attention, rollout and flow rank the subject above every attractor when it writes the verb.
The bundled checkpoint was made with the defaults.

Options: ``--steps`` (3000), ``--batch-size`` (64), ``--lr`` (2e-3), ``--warmup`` (200),
``--eval-examples`` (2000), ``--rate-examples`` (1000), ``--seed`` (0), ``--eval-seed`` (1),
``--threads`` (1).
"""

from __future__ import annotations

import argparse
import time
from typing import Sequence

import torch
from transformers import GPT2LMHeadModel

from captum_attnflow.data import generate_examples
from captum_attnflow.models.language_model import (
    build_lm_tokenizer,
    lm_config,
    lm_sentence,
    subject_attractor_rates,
    verb_number_accuracy,
)
from captum_attnflow.models.training import (
    adamw_with_schedule,
    add_optimizer_options,
    add_run_options,
    optimizer_step,
    save_run,
)


def train(args: argparse.Namespace) -> dict:
    """Train on ``steps * batch-size`` generated training sentences, evaluate, save to ``--out``.

    Next-token cross-entropy on every real token (padding ignored), AdamW with linear warm-up
    and decay. Writes the model (safetensors), the tokenizer and ``eval_results.json``
    (:func:`verb_number_accuracy` on held-out examples, :func:`subject_attractor_rates` on the
    first ``--rate-examples`` of them, training time, settings).

    Example::

        >>> import tempfile
        >>> from captum_attnflow.models.language_model import load_agreement_lm
        >>> threads = torch.get_num_threads()
        >>> with tempfile.TemporaryDirectory() as out:  # two steps: a smoke run, not a model
        ...     results = train(_parser().parse_args(["--out", out, "--steps", "2", "--batch-size", "4",
        ...         "--warmup", "1", "--eval-examples", "8", "--threads", str(threads)]))
        ...     model, _ = load_agreement_lm(out)
        >>> results["n"], model.config.n_layer
        (8, 4)
    """
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tokenizer = build_lm_tokenizer()
    model = GPT2LMHeadModel(lm_config(tokenizer)).train()
    model.set_attn_implementation("eager")  # the faster one on CPU for these short sequences
    sentences = [lm_sentence(e) for e in generate_examples(args.steps * args.batch_size, seed=args.seed)]
    held_out = generate_examples(args.eval_examples, seed=args.eval_seed, split="test")
    optimizer, schedule = adamw_with_schedule(model, args.lr, 0.01, args.warmup, args.steps)
    started = time.perf_counter()
    for step in range(args.steps):
        chunk = sentences[step * args.batch_size : (step + 1) * args.batch_size]
        batch = tokenizer(chunk, is_split_into_words=True, padding=True, return_tensors="pt")
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        optimizer_step(model(**batch, labels=labels).loss, model, optimizer, schedule)
    model.eval()
    model.set_attn_implementation("sdpa")
    results: dict = verb_number_accuracy(model, tokenizer, held_out)
    results["subject_above_attractors"] = subject_attractor_rates(model, tokenizer, held_out[: args.rate_examples])
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return save_run(args, model, tokenizer, results, (time.perf_counter() - started) / 60)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m captum_attnflow.models.train_lm",
        description="Train the agreement language model on generated sentences and report the held-out "
        "accuracy of the verb's number.",
    )
    add_optimizer_options(parser, steps=3000, batch_size=64, batch_unit="sentences", lr="2e-3", warmup=200)
    parser.add_argument("--eval-examples", type=int, default=2000, help="held-out examples (default 2000)")
    parser.add_argument(
        "--rate-examples", type=int, default=1000,
        help="held-out examples for the subject-above-attractors rates (default 1000; those with attractors count)",
    )
    add_run_options(parser, "the training data and init", threads=1, eval_seeded="the held-out split")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """The training command: parse ``argv``, :func:`train`, print the held-out accuracy."""
    results = train(_parser().parse_args(argv))
    print(f"held-out verb-number accuracy: {results['accuracy']:.4f} (n={results['n']})")
    for k in range(4):
        if f"n_{k}_attractors" in results:
            print(f"  {k} attractors: {results[f'accuracy_{k}_attractors']:.4f} (n={results[f'n_{k}_attractors']})")
    rates = results["subject_above_attractors"]
    print(f"subject above every attractor when writing the verb (n={rates['n'][0]}), per layer:")
    for name in ("raw", "rollout", "flow"):
        print(f"  {name:8s}" + " ".join(f"{rate:.3f}" for rate in rates[name]))
    print(f"training time: {results['train_minutes']:.1f} min")


if __name__ == "__main__":
    main()
