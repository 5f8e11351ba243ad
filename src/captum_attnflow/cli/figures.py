"""``captum-attnflow figures SENTENCE``: the paper's Figure 1 (every position at every layer) and
Figures 2-3 (the CLS token over layers)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from captum_attnflow.cli import _common as common
from captum_attnflow.hf import extract_attentions
from captum_attnflow.methods import METHODS, attention_methods, paper_methods
from captum_attnflow.visualize import plot_methods, plot_position_maps

DEFAULT_FIGURES_DIR = Path("captum_attnflow_figures")


def add_parser(commands: Any) -> None:
    """Add the ``figures`` command to ``commands`` (argparse sub-parsers)."""
    figures = commands.add_parser(
        "figures",
        help="draw the paper's Figures 1-3 for a sentence",
        description="Figure 1: raw attention, rollout and flow of every position (rows of a panel) over the "
        "input tokens, at every layer. Figures 2-3: the CLS token's scores over layers for the three "
        "methods. Writes figure1.png and figures2_3.png into DIR.",
    )
    figures.add_argument("sentence", help='the sentence up to the verb, e.g. "the keys to the cabinet"')
    figures.add_argument(
        "--out", type=Path, default=DEFAULT_FIGURES_DIR, metavar="DIR",
        help=f"output directory (default: {DEFAULT_FIGURES_DIR})",
    )
    figures.add_argument("--model", type=Path, metavar="DIR", help="a saved model directory (as for explain)")
    figures.add_argument(
        "--methods", nargs="+", choices=attention_methods(), default=paper_methods(), metavar="NAME",
        help=f"per-layer methods to draw (default: the paper's, {' '.join(paper_methods())}; any of {', '.join(attention_methods())})",
    )
    figures.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file; figures writes two images: give a directory.")
    out = common.writable(args.out, args.out)
    model, tokenizer = common.load(args.model)
    ids, tokens = common.encode_sentence(args.sentence, tokenizer)
    predicted, prediction = common.predict(model, ids)
    # One forward pass serves every method computed from attention weights, and every position.
    attentions = extract_attentions(model, ids)
    maps = {}
    for name in args.methods:
        entry = METHODS[name]
        method = entry.build(lambda _: attentions, tokenizer) if entry.from_attentions else entry.build(model, tokenizer)
        target = {"target": predicted, **dict(entry.display)} if entry.class_specific else dict(entry.display)
        maps[name] = method.attribute(ids, position=list(range(len(tokens))), layer=None, **target)[:, 0]  # (L, n, n)
    quoted = f'"{args.sentence}": {prediction}'
    first = out / "figure1.png"
    plot_position_maps(maps, tokens, title=f"Figure 1: every position at every layer, {quoted}",
                       value_labels=common.VALUE_LABELS).savefig(first, dpi=120)
    second = out / "figures2_3.png"
    plot_methods({name: values[:, 0] for name, values in maps.items()}, tokens,
                 title=f"Figures 2-3: {tokens[0]} over layers, {quoted}", value_labels=common.VALUE_LABELS).savefig(second, dpi=120)
    print(f"prediction: {prediction}")
    print(f"written: {first}, {second}")
    return 0
