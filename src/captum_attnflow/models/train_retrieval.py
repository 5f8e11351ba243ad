"""Train the retrieval language model: ``python -m captum_attnflow.models.train_retrieval --out DIR``.

Trains the :func:`~captum_attnflow.models.retrieval.retrieval_config` Qwen3 on generated prompts
(:func:`~captum_attnflow.data.retrieval_examples`), then measures on held-out prompts how often
greedy decoding writes the answer (:func:`~captum_attnflow.models.retrieval.answer_accuracy`):
over 4 to 64 sources, and at 4, 8, 16, 32 and 64. The bundled checkpoint was made with the
defaults.

Each step draws one number of sources, uniformly from 1 to a largest number that grows from
``--start-sources`` to 64 over the first ``--ramp`` of the steps (a curriculum: the lookup is
learnt on short prompts, then carried to long ones), and as many prompts of it as fill
``--batch-size`` tokens. After a prompt's answer and ``</s>``, up to ``--questions - 1`` more
questions on other sources of the same prompt follow, each with its answer (more answers
learnt per prompt read; the first question is the one the model is asked in use). The loss is
the next-token cross-entropy on the answers and ``</s>`` only: nothing else in a prompt can be
predicted.

Options: ``--steps`` (4000), ``--batch-size`` (4096 tokens), ``--lr`` (2e-3), ``--warmup``
(100), ``--start-sources`` (8), ``--ramp`` (0.5), ``--questions`` (16), ``--layers`` (2),
``--eval-examples`` (1000), ``--count-examples`` (400), ``--log-every`` (100), ``--check-every`` (500), ``--seed`` (0),
``--eval-seed`` (1), ``--threads`` (2).
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Sequence

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

from captum_attnflow.data.retrieval import (
    MAX_SOURCES,
    TEMPLATE_TAIL,
    RetrievalExample,
    ask,
    build_retrieval_tokenizer,
    retrieval_examples,
)
from captum_attnflow.models.retrieval import answer_accuracy, answer_ids, retrieval_config
from captum_attnflow.models.training import (
    adamw_with_schedule,
    add_optimizer_options,
    add_run_options,
    optimizer_step,
    save_run,
)

EVAL_COUNTS = (4, 8, 16, 32, 64)
IGNORE = -100


def packed_questions(
    example: RetrievalExample, tokenizer: PreTrainedTokenizerFast, questions: int, rng: random.Random
) -> dict[str, list[int]]:
    """``example``'s sources, then up to ``questions`` questions on them (its own first, then on
    other sources drawn by ``rng``), each followed by its answer and ``</s>``, packed in one row.

    Each question is a block that reads the sources and itself only, at the positions it would
    have right after the sources: every question is computed as in the prompt of its own example
    (:func:`packed_batch` builds the attention mask), so one pass over the sources teaches many
    answers, and no answer can be inferred from the others.

    Returns:
        ``{"input_ids", "labels", "blocks", "positions"}``, one entry a token: the labels are the
        answers' ids and ``</s>`` (``-100`` elsewhere), the blocks 0 for the sources and ``j`` for
        the ``j``-th question, the positions those of the token in its question's own prompt.

    Example::

        >>> tokenizer = build_retrieval_tokenizer()
        >>> example = retrieval_examples(1, sources=2, seed=0)[0]
        >>> row = packed_questions(example, tokenizer, 2, random.Random(0))
        >>> [tokenizer.convert_ids_to_tokens(i) for i, label in zip(row["input_ids"], row["labels"]) if label != -100]
        ['red', '</s>', 'Hong', 'Kong', '</s>']
    """
    ids = tokenizer("\n".join(example.sources))["input_ids"]
    start = len(ids)  # where each question begins, as in its own prompt
    row = {"input_ids": ids, "labels": [IGNORE] * start, "blocks": [0] * start, "positions": list(range(start))}
    others = [i for i in range(len(example.sources)) if i != example.gold]
    asked = [example, *(ask(example, i) for i in rng.sample(others, min(len(others), questions - 1)))]
    for block, question in enumerate(asked, start=1):
        tail = tokenizer(TEMPLATE_TAIL.format(question=question.question), add_special_tokens=False)["input_ids"]
        answer = answer_ids(question, tokenizer)
        row["input_ids"] += tail + answer
        row["labels"] += [IGNORE] * len(tail) + answer
        row["blocks"] += [block] * (len(tail) + len(answer))
        row["positions"] += list(range(start, start + len(tail) + len(answer)))
    return row


def packed_batch(rows: Sequence[dict[str, list[int]]], pad_id: int, window: int | None = None) -> dict[str, Tensor]:
    """Right-padded tensors (B, n) of :func:`packed_questions` rows, and the attention masks
    (B, 1, n, n) that let a token read the earlier tokens of the sources and of its own block:
    ``{"full_attention": mask, "sliding_attention": mask}``, the second also keeping only keys
    less than ``window`` positions back (positions as in each question's own prompt; a custom
    mask replaces the one the model would build, so its sliding window must be in it).

    Example::

        >>> batch = packed_batch([{"input_ids": [2, 5, 6, 7], "labels": [-100, -100, 6, 7],
        ...                        "blocks": [0, 0, 1, 2], "positions": [0, 1, 2, 2]}], pad_id=0, window=2)
        >>> batch["attention_mask"]["full_attention"][0, 0].int()  # the second question does not read the first
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [1, 1, 1, 0],
                [1, 1, 0, 1]], dtype=torch.int32)
        >>> batch["attention_mask"]["sliding_attention"][0, 0].int()  # and each reads 2 positions
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [0, 1, 1, 0],
                [0, 1, 0, 1]], dtype=torch.int32)
    """
    width = max(len(row["input_ids"]) for row in rows)
    filler = {"input_ids": pad_id, "labels": IGNORE, "blocks": -1, "positions": 0}
    batch = {key: torch.tensor([row[key] + [fill] * (width - len(row[key])) for row in rows]) for key, fill in filler.items()}
    blocks = batch.pop("blocks")
    positions = batch.pop("positions")
    readable = (blocks[:, :, None] == blocks[:, None, :]) | (blocks[:, None, :] == 0)
    full = (readable & torch.ones(width, width, dtype=torch.bool).tril())[:, None]
    batch["attention_mask"] = {"full_attention": full}
    if window is not None:
        batch["attention_mask"]["sliding_attention"] = full & (positions[:, :, None] - positions[:, None, :] < window)[:, None]
    batch["position_ids"] = positions
    return batch


def answer_loss(model: Qwen3ForCausalLM, batch: dict[str, Tensor]) -> Tensor:
    """The next-token cross-entropy at the labelled positions of a :func:`packed_batch`; the
    output layer runs at those positions only.

    Example::

        >>> tokenizer = build_retrieval_tokenizer()
        >>> model = Qwen3ForCausalLM(retrieval_config(tokenizer, num_hidden_layers=1))
        >>> batch = packed_batch([{"input_ids": [2, 10, 11, 12], "labels": [-100, -100, 11, -100],
        ...                        "blocks": [0, 0, 0, 0], "positions": [0, 1, 2, 3]}], tokenizer.pad_token_id, window=8)
        >>> full = torch.nn.functional.cross_entropy(model(batch["input_ids"]).logits[0, :-1], batch["labels"][0, 1:])
        >>> torch.allclose(answer_loss(model, batch), full)
        True
    """
    labels = batch["labels"][:, 1:]
    kept = labels != IGNORE
    hidden = model.model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).last_hidden_state[:, :-1]
    return nn.functional.cross_entropy(model.lm_head(hidden[kept]), labels[kept])


def train(args: argparse.Namespace) -> dict:
    """Train with the curriculum of the module docstring, evaluate, save to ``--out``.

    Writes the model (safetensors), the tokenizer and ``eval_results.json``: the answer accuracy
    on ``--eval-examples`` held-out prompts of 4 to 64 sources, and on ``--count-examples`` at
    each of 4, 8, 16, 32 and 64 sources (``by_sources``), training time and settings.

    Example::

        >>> import tempfile
        >>> from captum_attnflow.models.retrieval import load_retrieval_model
        >>> threads = torch.get_num_threads()
        >>> with tempfile.TemporaryDirectory() as out:  # two steps: a smoke run, not a model
        ...     results = train(_parser().parse_args(["--out", out, "--steps", "2", "--batch-size", "256",
        ...         "--layers", "1", "--eval-examples", "4", "--count-examples", "2", "--log-every", "0", "--check-every", "0",
        ...         "--threads", str(threads)]))
        ...     model, _ = load_retrieval_model(out)
        >>> results["n"], results["by_sources"]["64"]["n"], model.config.num_hidden_layers
        (4, 2, 1)
    """
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = build_retrieval_tokenizer()
    model = Qwen3ForCausalLM(retrieval_config(tokenizer, num_hidden_layers=args.layers)).train()
    # No weight decay: nothing here overfits (every prompt is new), and the embeddings the lookup
    # copies keep their norms; a second-moment decay of 0.98 follows the loss's drop when it forms.
    optimizer, schedule = adamw_with_schedule(model, args.lr, 0.0, args.warmup, args.steps, betas=(0.9, 0.98))
    started = time.perf_counter()
    for step in range(args.steps):
        ramp = min(1.0, step / max(1.0, args.ramp * args.steps))
        count = rng.randint(1, round(args.start_sources + (MAX_SOURCES - args.start_sources) * ramp))
        size = max(1, args.batch_size // (7 * count + 12 * min(count, args.questions) + 12))
        rows = [packed_questions(e, tokenizer, args.questions, rng)
                for e in retrieval_examples(size, sources=count, seed=rng.getrandbits(63))]
        loss = answer_loss(model, packed_batch(rows, tokenizer.pad_token_id, model.config.sliding_window))
        optimizer_step(loss, model, optimizer, schedule)
        if args.log_every and (step + 1) % args.log_every == 0:
            print(f"step {step + 1}: {count} sources x {size}, loss {loss.item():.4f}, "
                  f"{(time.perf_counter() - started) / 60:.1f} min", flush=True)
        if args.check_every and (step + 1) % args.check_every == 0:
            model.eval()
            checked = answer_accuracy(model, tokenizer, retrieval_examples(100, sources=MAX_SOURCES, seed=args.eval_seed + 1))
            print(f"step {step + 1}: answer accuracy at {MAX_SOURCES} sources {checked['accuracy']:.2f}", flush=True)
            model.train()
    model.eval()
    results: dict = answer_accuracy(model, tokenizer, retrieval_examples(args.eval_examples, seed=args.eval_seed))
    results["sources"] = [4, MAX_SOURCES]
    results["by_sources"] = {
        str(count): answer_accuracy(model, tokenizer, retrieval_examples(args.count_examples, sources=count, seed=args.eval_seed))
        for count in EVAL_COUNTS
    }
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return save_run(args, model, tokenizer, results, (time.perf_counter() - started) / 60)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m captum_attnflow.models.train_retrieval",
        description="Train the retrieval language model on generated prompts of facts and a question, and report "
        "the held-out answer accuracy by number of sources.",
    )
    add_optimizer_options(parser, steps=4000, batch_size=4096, batch_unit="prompt tokens", lr="2e-3", warmup=100)
    parser.add_argument("--start-sources", type=int, default=8,
                        help="largest number of sources at the first step (default 8); it grows to 64")
    parser.add_argument("--ramp", type=float, default=0.5,
                        help="fraction of the steps over which the largest number of sources grows to 64 (default 0.5)")
    parser.add_argument("--questions", type=int, default=16, help="questions asked of each training prompt (default 16)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers, the first windowed (default 2)")
    parser.add_argument("--eval-examples", type=int, default=1000, help="held-out prompts of 4 to 64 sources (default 1000)")
    parser.add_argument("--count-examples", type=int, default=400,
                        help="held-out prompts at each of 4, 8, 16, 32 and 64 sources (default 400)")
    parser.add_argument("--log-every", type=int, default=100, help="print the loss every this many steps; 0: never (default 100)")
    parser.add_argument("--check-every", type=int, default=500,
                        help=f"print the answer accuracy on 100 held-out prompts of {MAX_SOURCES} sources every this many "
                        "steps; 0: never (default 500)")
    add_run_options(parser, "the training data and init", threads=2, eval_seeded="the held-out prompts")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """The training command: parse ``argv``, :func:`train`, print the held-out accuracy."""
    results = train(_parser().parse_args(argv))
    print(f"held-out answer accuracy over 4-64 sources: {results['accuracy']:.4f} (n={results['n']})")
    for count, result in results["by_sources"].items():
        print(f"  {count} sources: {result['accuracy']:.4f} (n={result['n']})")
    print(f"training time: {results['train_minutes']:.1f} min")


if __name__ == "__main__":
    main()
