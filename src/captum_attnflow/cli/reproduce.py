"""``captum-attnflow reproduce``: Tables 1 and 2 of Abnar & Zuidema (2020) on held-out data (see
:mod:`captum_attnflow.reproduce`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from captum_attnflow.cli import _common as common
from captum_attnflow.methods import attention_methods, paper_methods
from captum_attnflow.reproduce import DATA, PROTOCOLS, RANKINGS, reproduce

DEFAULT_REPRODUCTION_DIR = Path("captum_attnflow_reproduction")


def add_parser(commands: Any) -> None:
    """Add the ``reproduce`` command to ``commands`` (argparse sub-parsers)."""
    repro = commands.add_parser(
        "reproduce",
        help="compute the paper's Tables 1 and 2 on held-out data",
        description="Spearman correlation of raw attention, rollout and flow (CLS token, layers L1-L6) with "
        "blank-out (Table 1) and input gradients (Table 2) on held-out generated examples, beside the "
        "paper's numbers, plus how often each method ranks the subject above every attractor. Writes "
        "markdown, CSV files and a plot to DIR.",
    )
    repro.add_argument("--samples", type=common.positive, default=2000, help="held-out examples (default: 2000, as the paper)")
    repro.add_argument(
        "--out", type=Path, default=DEFAULT_REPRODUCTION_DIR, metavar="DIR",
        help=f"output directory (default: {DEFAULT_REPRODUCTION_DIR})",
    )
    repro.add_argument("--seed", type=int, default=0, help="seed of the generated held-out examples (default: 0)")
    repro.add_argument("--batch-size", type=common.positive, default=200, help="examples per batch (default: 200)")
    repro.add_argument("--include-cls", action="store_true", help="rank [CLS] together with the words")
    repro.add_argument(
        "--protocol", choices=PROTOCOLS, default="ours",
        help="ours (default), or paper: the authors' definitions (absolute blank-out, every token ranked, "
        "the gradient sum in float32 and float64), printed before ours",
    )
    repro.add_argument(
        "--data", choices=tuple(DATA), default="generated",
        help="generated (default: median 11 words, 0-3 attractors uniformly) or short (like the paper's "
        "inputs: median 7 words, mostly without attractors)",
    )
    repro.add_argument(
        "--ranking", choices=RANKINGS, default="average",
        help="with --protocol paper, dense adds the authors' Spearman formula (no-ties formula on dense ranks)",
    )
    repro.add_argument(
        "--model", type=Path, metavar="DIR",
        help="a saved agreement model directory instead of the bundled one (e.g. trained with --end-token)",
    )
    repro.add_argument(
        "--methods", nargs="+", choices=attention_methods(), default=paper_methods(), metavar="NAME",
        help=f"per-layer methods of the tables (default: {' '.join(paper_methods())}; any of {', '.join(attention_methods())})",
    )
    repro.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    repro.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file; reproduce writes several files: give a directory.")
    if args.ranking == "dense" and args.protocol != "paper":
        raise ValueError("--ranking dense is the authors' Spearman formula: add --protocol paper.")
    out = common.writable(args.out, args.out)
    model, tokenizer = common.load(args.model, agreement_only=True)
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
