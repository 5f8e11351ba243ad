"""Train the paper's agreement model on generated data: ``python -m captum_attnflow.models.train --out DIR``.

Trains :class:`~captum_attnflow.models.AgreementModel` on ``generate_examples(split="train",
seed=--seed)`` with AdamW, linear warm-up and linear decay, on CPU by default, then reports
held-out accuracy on ``generate_examples(split="test", seed=--eval-seed)`` overall, for the
examples with attractors and per attractor count. ``DIR`` receives the model (safetensors),
the tokenizer and ``eval_results.json``. The bundled checkpoint was made with the defaults.

``--end-token`` trains a model that reads an end token in the verb's slot, as the authors'
model did (``[CLS] the keys to the cabinet [MASK]``): the saved tokenizer appends
:data:`END_TOKEN` to every input, so everything that tokenizes with it (the command line,
:func:`captum_attnflow.reproduce.reproduce`) gives the model the token it was trained with.
``--short`` trains on inputs shaped like the paper's
(:data:`captum_attnflow.data.agreement.SHORT_SENTENCES`: median 7 words, mostly without
attractors; the held-out accuracy is still measured on the default mix).

Options: ``--steps`` (3000), ``--batch-size`` (64), ``--lr`` (1e-3), ``--warmup`` (300),
``--weight-decay`` (0.01), ``--train-examples`` (192000, generated once; ``steps *
batch-size`` by default), ``--eval-examples`` (2000), ``--seed`` (0), ``--eval-seed`` (1),
``--threads`` (2), ``--device`` (cpu), ``--end-token``, ``--short``.
"""

from __future__ import annotations

import argparse
import time
from typing import Sequence

import torch
from tqdm.auto import tqdm
from tokenizers import processors
from transformers import PreTrainedTokenizerFast

from captum_attnflow.data import AgreementExample, build_tokenizer, encode_examples, generate_examples
from captum_attnflow.data.agreement import SHORT_SENTENCES, accuracy_by_attractors
from captum_attnflow.models.agreement import AgreementConfig, AgreementModel
from captum_attnflow.models.training import (
    adamw_with_schedule,
    add_optimizer_options,
    add_run_options,
    optimizer_step,
    save_run,
)

# The token in the verb's slot of a model trained with --end-token: one of the tokenizer's
# special tokens already, so the vocabulary and the model's size stay the same.
END_TOKEN = "[MASK]"


def with_end_token(tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """Make ``tokenizer`` append :data:`END_TOKEN` after the words (``[CLS] words [MASK]``), in place.

    Args:
        tokenizer: the word-level tokenizer of :func:`captum_attnflow.data.build_tokenizer`.

    Returns:
        PreTrainedTokenizerFast: the same tokenizer; ``save_pretrained`` keeps the template.

    Example::

        >>> tokenizer = with_end_token(build_tokenizer())
        >>> tokenizer.convert_ids_to_tokens(tokenizer("the keys to the cabinet")["input_ids"])
        ['[CLS]', 'the', 'keys', 'to', 'the', 'cabinet', '[MASK]']
    """
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in ("[CLS]", END_TOKEN)}
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"[CLS] $A {END_TOKEN}", pair=f"[CLS] $A $B {END_TOKEN}", special_tokens=list(ids.items())
    )
    return tokenizer


def evaluate(
    model: AgreementModel,
    tokenizer: PreTrainedTokenizerFast,
    examples: Sequence[AgreementExample],
    batch_size: int = 256,
) -> dict[str, float | int]:
    """Accuracy of ``model`` on ``examples``: overall, with attractors, and per attractor count.

    Args:
        model: an agreement model in eval mode (any model returning (B, 2) ``logits`` for
            ``input_ids`` and ``attention_mask``).
        tokenizer: its tokenizer.
        examples: non-empty sequence of :class:`~captum_attnflow.data.AgreementExample`.
        batch_size: examples per forward pass.

    Returns:
        ``{"accuracy", "accuracy_with_attractors", "accuracy_<k>_attractors", "n", "n_<k>_attractors"}``.

    Example:
        >>> from captum_attnflow import load_agreement_model
        >>> model, tokenizer = load_agreement_model()
        >>> evaluate(model, tokenizer, generate_examples(64, seed=1, split="test"))["accuracy"] > 0.9
        True
    """
    device = next(model.parameters()).device
    correct = []
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            batch = encode_examples(examples[start : start + batch_size], tokenizer)
            logits = model(batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device)).logits
            correct += (logits.argmax(-1).cpu() == batch["labels"]).tolist()
    return accuracy_by_attractors(correct, examples)


def train(args: argparse.Namespace) -> dict[str, float | int]:
    """Train, evaluate and save as described in the module docstring.

    Args:
        args: the parsed command line (``--out``, ``--steps``, ... as listed in the module
            docstring); :func:`main` builds it from ``argv``.

    Returns:
        dict: the held-out results of :func:`evaluate` plus ``train_minutes`` and the
        ``settings``, as written to ``eval_results.json``.

    Example::

        >>> import tempfile
        >>> threads = str(torch.get_num_threads())  # train() sets the process's thread count
        >>> with tempfile.TemporaryDirectory() as out:  # two steps only: a smoke run, not a model
        ...     results = train(_parser().parse_args(["--out", out, "--steps", "2", "--batch-size", "4",
        ...         "--warmup", "1", "--eval-examples", "8", "--threads", threads]))
        >>> results["n"], 0 <= results["accuracy"] <= 1
        (8, True)
    """
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tokenizer = with_end_token(build_tokenizer()) if args.end_token else build_tokenizer()
    train_examples = generate_examples(
        args.train_examples or args.steps * args.batch_size, seed=args.seed, **(SHORT_SENTENCES if args.short else {})
    )
    held_out = generate_examples(args.eval_examples, seed=args.eval_seed, split="test")
    config = AgreementConfig(vocab_size=len(tokenizer))
    model = AgreementModel(config).to(args.device).train()
    optimizer, schedule = adamw_with_schedule(model, args.lr, args.weight_decay, args.warmup, args.steps)
    # Eager attention is the faster one on CPU for these short, padded sequences.
    model.set_attn_implementation("eager")
    generator = torch.Generator().manual_seed(args.seed)
    batches: list[list[int]] = []
    started = time.perf_counter()
    progress = tqdm(range(args.steps), desc="training", mininterval=5)
    for step in progress:
        if not batches:
            batches = _length_bucketed_batches(train_examples, args.batch_size, generator)
        batch = encode_examples([train_examples[i] for i in batches.pop()], tokenizer)
        output = model(
            batch["input_ids"].to(args.device),
            attention_mask=batch["attention_mask"].to(args.device),
            labels=batch["labels"].to(args.device),
        )
        optimizer_step(output.loss, model, optimizer, schedule)
        if step % 100 == 0:
            progress.set_postfix(loss=f"{output.loss.item():.3f}")
    model.eval()
    model.set_attn_implementation("sdpa")
    results = evaluate(model, tokenizer, held_out)
    return save_run(args, model.cpu(), tokenizer, results, (time.perf_counter() - started) / 60)


def _length_bucketed_batches(
    examples: Sequence[AgreementExample], batch_size: int, generator: torch.Generator
) -> list[list[int]]:
    """One shuffled epoch of index batches, each drawn from similar lengths to save padding compute."""
    order = torch.randperm(len(examples), generator=generator).tolist()
    window = batch_size * 50
    batches = []
    for start in range(0, len(order), window):
        chunk = sorted(order[start : start + window], key=lambda i: len(examples[i].words))
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk) - batch_size + 1, batch_size)]
    shuffled = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in shuffled]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m captum_attnflow.models.train",
        description="Train the paper's verb-number agreement model on generated data and report held-out accuracy.",
    )
    add_optimizer_options(parser, steps=3000, batch_size=64, batch_unit="examples", lr="1e-3", warmup=300)
    parser.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay (default 0.01)")
    parser.add_argument(
        "--train-examples", type=int, default=None, help="training set size (default steps * batch size: one epoch)"
    )
    parser.add_argument("--eval-examples", type=int, default=2000, help="held-out examples (default 2000)")
    add_run_options(parser, "the training data, init and order", threads=2, eval_seeded="the held-out test split")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument(
        "--end-token", action="store_true", help=f"append an end token ({END_TOKEN}) in the verb's slot of every input"
    )
    parser.add_argument("--short", action="store_true", help="train on short inputs, mostly without attractors")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """The training command: parse ``argv``, :func:`train`, print the held-out accuracies.

    Args:
        argv: the options after the program name (``--out DIR`` is required, see ``--help``);
            None (default) reads ``sys.argv[1:]``.

    Example::

        >>> import tempfile
        >>> threads = str(torch.get_num_threads())
        >>> with tempfile.TemporaryDirectory() as out:  # a smoke run; the defaults train the bundled model
        ...     main(["--out", out, "--steps", "2", "--batch-size", "4", "--warmup", "1",
        ...         "--eval-examples", "8", "--threads", threads])  # doctest: +ELLIPSIS
        held-out accuracy: ... (n=8)
        ...
        training time: ... min
    """
    results = train(_parser().parse_args(argv))
    print(f"held-out accuracy: {results['accuracy']:.4f} (n={results['n']})")
    if "accuracy_with_attractors" in results:
        print(f"  with attractors: {results['accuracy_with_attractors']:.4f} (n={results['n_with_attractors']})")
    for k in range(4):
        if f"n_{k}_attractors" in results:
            print(f"  {k} attractors: {results[f'accuracy_{k}_attractors']:.4f} (n={results[f'n_{k}_attractors']})")
    print(f"training time: {results['train_minutes']:.1f} min")


if __name__ == "__main__":
    main()
