"""``captum-attnflow figures SENTENCE``: the paper's Figure 1 (every position at every layer) and
Figures 2-3 (the CLS token over layers)."""

from __future__ import annotations

import argparse
from pathlib import Path

from captum_attnflow.cli import _common as common
from captum_attnflow.cli import _options as options

DEFAULT_FIGURES_DIR = Path("captum_attnflow_figures")
HELP = "draw the paper's Figures 1-3 for a sentence"
DESCRIPTION = (
    "Figure 1: raw attention, rollout and flow of every position (rows of a panel) over the input tokens, at "
    "every layer. Figures 2-3: the CLS token's scores over layers for the three methods. Writes figure1.png "
    "and figures2_3.png into DIR."
)


def add_arguments(figures: argparse.ArgumentParser) -> None:
    """The arguments of ``figures``."""
    figures.add_argument("sentence", help='the sentence up to the verb, e.g. "the keys to the cabinet"')
    options.add_output_directory(figures, DEFAULT_FIGURES_DIR)
    options.add_model(figures, "a model instead of the bundled one (as for explain)")
    options.add_placement(figures)
    options.add_attention_methods(figures, "to draw", default_note="the paper's, ")


def run(args: argparse.Namespace) -> int:
    from captum_attnflow.capture import extract_attentions
    from captum_attnflow.methods import METHODS
    from captum_attnflow.visualize import plot_methods, plot_position_maps

    out = common.output_directory(args.out, "figures writes two images")
    model, tokenizer = common.load(args.model, common.placement(args))
    ids, tokens = common.encode_sentence(args.sentence, tokenizer, model)
    predicted, prediction = common.predict(model, ids)
    # One forward pass serves every method computed from attention weights, and every position.
    attentions = extract_attentions(model, ids)
    maps = {}
    for name in args.methods:
        entry = METHODS[name]
        method = entry.build(lambda _: attentions, tokenizer) if entry.from_attentions else entry.build(model, tokenizer)
        target = {"target": predicted, **dict(entry.display)} if entry.class_specific else dict(entry.display)
        maps[name] = method.attribute(ids, position=list(range(len(tokens))), layer=None, **target)[:, 0].cpu()  # (L, n, n)
    quoted = f'"{args.sentence}": {prediction}'
    first = out / "figure1.png"
    plot_position_maps(maps, tokens, title=f"Figure 1: every position at every layer, {quoted}",
                       value_labels=common.VALUE_LABELS).savefig(first, dpi=120)
    second = out / "figures2_3.png"
    plot_methods({name: values[:, 0] for name, values in maps.items()}, tokens,
                 title=f"Figures 2-3: {tokens[0]} over layers, {quoted}", value_labels=common.VALUE_LABELS,
                 signed=[name for name in maps if METHODS[name].signed]).savefig(second, dpi=120)
    print(f"prediction: {prediction}")
    print(f"written: {first}, {second}")
    return 0
