"""``captum-attnflow explain SENTENCE``: the model's prediction, each token's score per method, and a
layers x tokens heatmap (the paper's Figures 2-3)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from captum_attnflow.cli import _common as common
from captum_attnflow.cli import _options as options
from captum_attnflow.cli import _choices as choices

if TYPE_CHECKING:
    import torch

DEFAULT_HEATMAP = Path("captum_attnflow_explain.png")
HELP = "explain a classifier's prediction for a sentence (the bundled verb-number model unless --model)"
DESCRIPTION = (
    "Predict the number of the verb that would follow SENTENCE (singular or plural), print each token's score "
    "and write a layers x tokens heatmap (the paper's Figures 2-3). Attention methods explain the CLS token "
    "after each layer; saliency (input gradients) and blankout explain the predicted class."
)


def add_arguments(explain: argparse.ArgumentParser) -> None:
    """The arguments of ``explain``."""
    explain.add_argument("sentence", help='the sentence up to the verb, e.g. "the keys to the cabinet"')
    explain.add_argument(
        "--method", choices=(*choices.METHODS, "all"), default="all", help="attribution method (default: all)"
    )
    explain.add_argument(
        "--layer", type=common.layer, default=None, metavar="N|all",
        help="layer of the attention methods, 1..L, or all (default: all; the table then shows the last layer "
        "unless one attention method is chosen)",
    )
    explain.add_argument(
        "--head", type=common.head, default=None, metavar="K|all",
        help="per-head attention methods (the paper's Appendix A.1): head K (0..H-1) of each shown layer on top of "
        "the head-fused layers below, or all heads of the one layer given with --layer (a heads x tokens heatmap)",
    )
    explain.add_argument(
        "--out", type=Path, default=DEFAULT_HEATMAP, metavar="FILE.png|DIR",
        help=f"where to write the heatmap: an image file, or a directory to write {DEFAULT_HEATMAP} into "
        f"(default: {DEFAULT_HEATMAP})",
    )
    options.add_model(
        explain, "a model instead of the bundled one: an agreement model, or any Hugging Face "
        "sequence-classification model with its tokenizer",
    )
    options.add_placement(explain)
    options.add_html(explain, "also write a self-contained HTML view (one row per layer of each method, the score on hover)")
    options.add_words(explain, "one score per word: merge sub-word pieces (sum by default; max or mean on request)")


def run(args: argparse.Namespace) -> int:
    from captum_attnflow.explanation import ExplanationResult
    from captum_attnflow.methods import METHODS
    from captum_attnflow.visualize import plot_methods

    out = common.image_path(args.out, DEFAULT_HEATMAP.name)
    model, tokenizer = common.load(args.model, common.placement(args))
    num_layers = model.config.num_hidden_layers
    if args.layer is not None and args.layer > num_layers:
        raise ValueError(f"--layer {args.layer} is out of range: the model has layers 1..{num_layers} (or all).")
    ids, tokens = common.encode_sentence(args.sentence, tokenizer, model)
    predicted, prediction = common.predict(model, ids)
    print(f"prediction: {prediction}")

    heads = model.config.num_attention_heads
    if args.head == "all" and args.layer is None:
        raise ValueError("--head all shows the heads of one layer: give it with --layer N.")
    if isinstance(args.head, int) and args.head >= heads:
        raise ValueError(f"--head {args.head} is out of range: the model has heads 0..{heads - 1} (or all).")
    methods = tuple(METHODS) if args.method == "all" else (args.method,)
    if args.head is not None:  # per-head results exist for the methods computed from attention weights
        if args.method != "all" and METHODS[args.method].per_layer and not METHODS[args.method].from_attentions:
            raise ValueError(f"--head is for the methods computed from attention weights ({', '.join(choices.PAPER_METHODS)}), not {args.method}.")
        methods = tuple(name for name in methods if METHODS[name].from_attentions or not METHODS[name].per_layer)
    layers = list(range(num_layers)) if args.layer is None else [args.layer - 1]
    scores, labels = {}, {}
    for name in methods:
        method = METHODS[name].build(model, tokenizer)
        target = {"target": predicted} if METHODS[name].class_specific else {}
        target.update(METHODS[name].display)
        if METHODS[name].per_layer and args.head == "all":
            scores[name] = method.attribute(ids, layer=args.layer, head="all")[:, 0].cpu()  # (H, n)
            labels[name] = [f"L{args.layer} h{head}" for head in range(heads)]
        elif METHODS[name].per_layer:
            head = {} if args.head is None else {"head": args.head}
            scores[name] = method.attribute(ids, layer=None, **target, **head)[layers, 0].cpu()
            suffix = "" if args.head is None else f" h{args.head}"
            labels[name] = [f"L{layer + 1}{suffix}" for layer in layers]
        else:
            scores[name] = method.attribute(ids, target=predicted).cpu()
    result = ExplanationResult(
        tokens, scores, labels, prediction, str(args.model or "bundled agreement model"),
        {name: common.VALUE_LABELS[name] for name in scores if name in common.VALUE_LABELS},
    )
    if args.words:
        result = result.aggregate_words(tokenizer(args.sentence), args.words, text=args.sentence)
    print(_score_table(result.tokens, result.scores, labels))
    figure = plot_methods(result.scores, result.tokens, title=f'"{args.sentence}": {prediction}', layer_labels=labels,
                          value_labels=common.VALUE_LABELS, signed=[name for name in result.scores if METHODS[name].signed])
    figure.savefig(out, dpi=120)
    print(f"heatmap written to {out}")
    common.write_html(result, args.html)
    return 0


def _score_table(tokens: list[str], scores: dict[str, torch.Tensor], labels: dict[str, list[str]]) -> str:
    """Tokens as rows; one column per layer for a single attention method over all layers,
    otherwise one column per method at its last shown layer."""
    columns = {}
    if len(scores) == 1 and len(next(iter(labels.values()), [])) > 1:
        method, values = next(iter(scores.items()))
        columns = {f"{method} {label}": values[row] for row, label in enumerate(labels[method])}
    else:
        for method, values in scores.items():
            name = f"{method} {labels[method][-1]}" if method in labels else method
            columns[name] = values[-1]
    width = max(len(token) for token in [*tokens, "token"])
    widths = {name: max(10, len(name)) for name in columns}
    header = f"{'token':<{width}}  " + "  ".join(f"{name:>{widths[name]}}" for name in columns)
    lines = [header, "-" * len(header)]
    for position, token in enumerate(tokens):
        cells = "  ".join(f"{float(values[position]):>{widths[name]}.4f}" for name, values in columns.items())
        lines.append(f"{token:<{width}}  {cells}")
    return "\n".join(lines)

