"""``captum-attnflow reproduce``: Tables 1 and 2 of Abnar & Zuidema (2020) on held-out data (see
:mod:`captum_attnflow.reproduce`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from captum_attnflow.cli import _choices as choices
from captum_attnflow.cli import _common as common
from captum_attnflow.cli import _options as options

DEFAULT_REPRODUCTION_DIR = Path("captum_attnflow_reproduction")
HELP = "compute the paper's Tables 1 and 2 on held-out data"
DESCRIPTION = (
    "Spearman correlation of raw attention, rollout and flow (CLS token, layers L1-L6) with blank-out (Table 1) "
    "and input gradients (Table 2) on held-out generated examples, beside the paper's numbers, plus how often "
    "each method ranks the subject above every attractor. Writes markdown, CSV files and a plot to DIR."
)


def add_arguments(repro: argparse.ArgumentParser) -> None:
    """The arguments of ``reproduce``."""
    repro.add_argument("--samples", type=common.positive, default=2000, help="held-out examples (default: 2000, as the paper)")
    options.add_output_directory(repro, DEFAULT_REPRODUCTION_DIR)
    options.add_seed(repro, "the generated held-out examples")
    repro.add_argument("--batch-size", type=common.positive, default=200, help="examples per batch (default: 200)")
    repro.add_argument("--include-cls", action="store_true", help="rank [CLS] together with the words")
    repro.add_argument(
        "--protocol", choices=choices.PROTOCOLS, default="ours",
        help="ours (default), or paper: the authors' definitions (absolute blank-out, every token ranked, "
        "the gradient sum in float32 and float64), printed before ours",
    )
    repro.add_argument(
        "--data", choices=choices.REPRODUCE_DATA, default="generated",
        help="generated (default: median 11 words, 0-3 attractors uniformly) or short (like the paper's "
        "inputs: median 7 words, mostly without attractors)",
    )
    repro.add_argument(
        "--ranking", choices=choices.RANKINGS, default="average",
        help="with --protocol paper, dense adds the authors' Spearman formula (no-ties formula on dense ranks)",
    )
    options.add_model(repro, "an agreement model instead of the bundled one (e.g. trained with --end-token)")
    options.add_placement(repro)
    options.add_attention_methods(repro, "of the tables")
    options.add_no_progress(repro, "bar")


def run(args: argparse.Namespace) -> int:
    from captum_attnflow.reproduce import reproduce

    if args.ranking == "dense" and args.protocol != "paper":
        raise ValueError("--ranking dense is the authors' Spearman formula: add --protocol paper.")
    out = common.output_directory(args.out, "reproduce writes several files")
    model, tokenizer = common.load(args.model, common.placement(args), agreement_only=True)
    result = reproduce(
        num_samples=args.samples,
        seed=args.seed,
        batch_size=args.batch_size,
        model=model,
        tokenizer=tokenizer,
        include_cls=args.include_cls,
        progress=not args.no_progress,
        protocol=args.protocol,
        data=args.data,
        ranking=args.ranking,
        methods=args.methods,
    )
    print(result.to_markdown())
    paths = result.save(out)
    print("\nwritten: " + ", ".join(str(path) for path in paths))
    return 0
