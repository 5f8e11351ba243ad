"""``captum-attnflow benchmark``: the faithfulness leaderboard of the attribution methods, on the
bundled tasks or on the user's own model and data (see :mod:`captum_attnflow.benchmark`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from captum_attnflow.cli import _choices as choices
from captum_attnflow.cli import _common as common
from captum_attnflow.cli import _options as options

DEFAULT_BENCHMARK_DIR = Path("captum_attnflow_benchmark")


HELP = "rank attribution methods by faithfulness: a leaderboard with confidence intervals"
DESCRIPTION = (
    f"Every method explains held-out examples of each task ({', '.join(choices.BENCHMARK_TASKS)}); faithfulness (AOPC "
    "comprehensiveness and sufficiency, log-odds, deletion-curve area, and the agreement data's subject-first "
    "ground truth) per method with bootstrap intervals and Holm-adjusted Wilcoxon tests, the methods' average ranks "
    "across the tasks (Friedman and Nemenyi tests), and each method's time per example. Writes leaderboard.md, "
    "leaderboard.csv, leaderboard.png, critical_difference.png and report.html to DIR."
)


def add_arguments(benchmark: argparse.ArgumentParser) -> None:
    """The arguments of ``benchmark``."""
    names = (*choices.METHODS, *choices.EXTRA_METHODS, choices.FLOOR, *choices.CONTEXT_PEERS)
    tasks = choices.BENCHMARK_TASKS
    benchmark.add_argument("--tasks", nargs="+", choices=tasks, default=tasks, metavar="TASK",
                           help=f"tasks (default: {' '.join(tasks)})")
    benchmark.add_argument("--methods", nargs="+", choices=names, metavar="NAME", help=f"methods (default: all of {', '.join(names)})")
    benchmark.add_argument(
        "--examples", type=common.positive, default=None, help="held-out examples per task (default: 64; with --data all rows)"
    )
    benchmark.add_argument(
        "--quick", action="store_true",
        help=f"{choices.QUICK_EXAMPLES} examples per task and five methods ({', '.join(choices.QUICK_METHODS)}) unless given",
    )
    options.add_output_directory(benchmark, DEFAULT_BENCHMARK_DIR)
    benchmark.add_argument(
        "--checkpoint-dir", type=Path, metavar="DIR",
        help="keep each task's per-example values here as they are computed; run the same command again to resume",
    )
    options.add_no_progress(benchmark)
    options.add_placement(benchmark)
    mine = benchmark.add_argument_group(
        "your own model and data", "a *ForSequenceClassification or *ForCausalLM model with its tokenizer, "
        "explained on the rows of a CSV, JSON Lines or Parquet file (instead of the tasks); also under accelerate launch",
    )
    options.add_model(mine, "your model, with its tokenizer")
    mine.add_argument("--data", type=Path, metavar="FILE", help="a .csv, .tsv, .jsonl or .parquet file")
    for column, default, text, without in (  # without: what is used when the column is not named
        ("text", "text", "a classifier's input text", None), ("pair", None, "the second text of sentence pairs", "none"),
        ("label", None, "the gold class to explain", "the predicted one"), ("prompt", "prompt", "a language model's prompt", None),
        ("target", None, "the continuation whose first token is explained", "the greedy next token"),
        ("contrast", None, "explain target rather than this class / text (contrastive)", "none"),
        ("context", None, "a causal LM's context of sources: the context task (which source the answer came from)", "none"),
        ("question", "question", "the context task's question, asked after the context", None),
        ("answer", "answer", "the context task's answer, explained", None),
        ("gold", None, "the context task's gold source: its index or a piece of its text", "none"),
    ):
        mine.add_argument(f"--{column}-column", default=default, metavar="NAME", help=f"{text} (default: {default or without})")
    mine.add_argument("--by", choices=("sentence", "paragraph", "line"), default="sentence",
                      help="the context task's sources: sentences, paragraphs or lines of the context (default: sentence)")
    mine.add_argument("--deletion", choices=("remove", "mask", "unk", "pad"), default="remove",
                      help="delete tokens from the attention mask (default) or write this token in their place")
    options.add_seed(mine, "the drawn rows and the random floor")
    mine.add_argument("--batch-size", type=common.positive, default=32, help="rows per batch (default: 32)")


def run(args: argparse.Namespace) -> int:
    from captum_attnflow.benchmark import QUICK_EXAMPLES, QUICK_METHODS, run_benchmark

    out = common.output_directory(args.out, "benchmark writes several files")
    methods = args.methods or (QUICK_METHODS if args.quick and args.data is None else None)
    examples = QUICK_EXAMPLES if args.quick and args.examples is None else args.examples
    if (args.model is None) != (args.data is None):
        raise ValueError("--model NAME_OR_DIR and --data FILE go together: your model explained on your rows.")
    if args.data is not None:
        from captum_attnflow.benchmark import Columns, load_data, load_model, run_user_benchmark

        data = load_data(args.data)
        model, tokenizer = load_model(common.model_directory(args.model), **common.placement(args))
        columns = Columns(args.text_column, args.pair_column, args.label_column, args.prompt_column,
                          args.target_column, args.contrast_column, args.context_column, args.question_column,
                          args.answer_column, args.gold_column, args.by)
        result = run_user_benchmark(
            model, tokenizer, data, columns, methods, examples, args.seed, args.batch_size, args.deletion,
            name=args.data.stem, show_progress=not args.no_progress, checkpoint_dir=args.checkpoint_dir,
        )
    else:
        result = run_benchmark(
            args.tasks, methods, examples, seed=args.seed, show_progress=not args.no_progress, checkpoint_dir=args.checkpoint_dir,
            **common.placement(args),
        )
    if int(os.environ.get("RANK", "0")) == 0:  # under accelerate launch every process has the table; one writes it
        print(result.to_markdown())
        print("\nwritten: " + ", ".join(str(path) for path in result.save(out)))
    return 0
