"""The ``captum-attnflow`` command: explain a sentence, draw the paper's figures, reproduce its tables.

``captum-attnflow explain "the keys to the cabinet"`` prints the model's prediction and
per-token scores and writes a layers x tokens heatmap; ``captum-attnflow figures`` draws the
paper's Figure 1 (raw attention, rollout and flow of every position at every layer) and
Figures 2-3 (the CLS token over layers) for a sentence; ``captum-attnflow reproduce`` computes
Tables 1 and 2 of Abnar & Zuidema (2020) (see :mod:`captum_attnflow.reproduce`). They run on
the verb-number model that ships with the package or on a checkpoint directory saved with
``save_pretrained`` (``--model DIR``): an agreement model, or for ``explain`` and ``figures``
any Hugging Face sequence-classification model saved with its tokenizer. ``captum-attnflow generate``
explains a language model's continuation of a prompt; ``captum-attnflow adversarial`` runs the
adversarial-attention study (see :mod:`captum_attnflow.adversarial.study`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

from captum_attnflow.adversarial.study import DEFAULT_LAMBDAS, MODELS, run_study
from captum_attnflow.data.agreement import PLURAL, SINGULAR
from captum_attnflow.explanation import ExplanationResult
from captum_attnflow.hf import extract_attentions
from captum_attnflow.methods import EXTRA_METHODS, METHODS, attention_methods, paper_methods
from captum_attnflow.models import AgreementConfig, load_agreement_model
from captum_attnflow.reproduce import DATA, PROTOCOLS, RANKINGS, reproduce
from captum_attnflow.visualize import plot_methods, plot_position_maps

NUMBERS = {SINGULAR: "singular", PLURAL: "plural"}
DEFAULT_HEATMAP = Path("captum_attnflow_explain.png")
DEFAULT_REPRODUCTION_DIR = Path("captum_attnflow_reproduction")
DEFAULT_FIGURES_DIR = Path("captum_attnflow_figures")
IMAGE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg")
# What the colour bars of the figures show.
VALUE_LABELS = {
    "raw": "attention weight (head mean)",
    "rollout": "rollout score",
    "flow": "max-flow value",
    "gradient_rollout": "relevance (not normalised)",
    "value_zeroing": "value-zeroing share",
    "alti": "ALTI share",
    "norm": "norm of weighted values",
    "saliency": "gradient norm",
    "blankout": "drop in probability",
    "attnlrp": "relevance (AttnLRP)",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv``, as the ``captum-attnflow`` command does.

    Args:
        argv: the arguments after the program name, e.g. ``["explain", "the keys to the
            cabinet"]``; None (default) reads ``sys.argv[1:]``. ``main(["--help"])`` lists
            the commands and their options.

    Returns:
        int: the exit status, 0 on success, 1 when the command fails with an error it
        reports on stderr (argparse itself exits with 2 on malformed arguments).

    Example::

        >>> import tempfile
        >>> from captum_attnflow.cli import main
        >>> with tempfile.TemporaryDirectory() as tmp:  # the heatmap goes to a throwaway file
        ...     main(["explain", "the keys to the cabinet", "--method", "rollout", "--layer", "6",
        ...           "--out", f"{tmp}/keys.png"])  # doctest: +ELLIPSIS
        prediction: plural (probability 1.000)
        token    rollout L6
        -------------------
        [CLS]        0.1373
        the          0.0889
        keys         0.3435
        to           0.0963
        the          0.0739
        cabinet      0.2602
        heatmap written to .../keys.png
        0
    """
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, TypeError, OSError) as error:
        print(f"captum-attnflow {args.command}: error: {error}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="captum-attnflow",
        description="Attention rollout and attention flow (Abnar & Zuidema, ACL 2020) on the bundled "
        "subject-verb agreement model.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    explain = commands.add_parser(
        "explain",
        help="explain the model's verb-number prediction for a sentence",
        description="Predict the number of the verb that would follow SENTENCE (singular or plural), "
        "print each token's score and write a layers x tokens heatmap (the paper's Figures 2-3). "
        "Attention methods explain the CLS token after each layer; saliency (input gradients) and "
        "blankout explain the predicted class.",
    )
    explain.add_argument("sentence", help='the sentence up to the verb, e.g. "the keys to the cabinet"')
    explain.add_argument(
        "--method", choices=(*METHODS, "all"), default="all", help="attribution method (default: all)"
    )
    explain.add_argument(
        "--layer", type=_layer, default=None, metavar="N|all",
        help="layer of the attention methods, 1..L, or all (default: all; the table then shows the last layer "
        "unless one attention method is chosen)",
    )
    explain.add_argument(
        "--head", type=_head, default=None, metavar="K|all",
        help="per-head attention methods (the paper's Appendix A.1): head K (0..H-1) of each shown layer on top of "
        "the head-fused layers below, or all heads of the one layer given with --layer (a heads x tokens heatmap)",
    )
    explain.add_argument(
        "--out", type=Path, default=DEFAULT_HEATMAP, metavar="FILE.png|DIR",
        help=f"where to write the heatmap: an image file, or a directory to write {DEFAULT_HEATMAP} into "
        f"(default: {DEFAULT_HEATMAP})",
    )
    explain.add_argument(
        "--model", type=Path, metavar="DIR",
        help="a saved model directory instead of the bundled one: an agreement model, or any Hugging Face "
        "sequence-classification model saved with its tokenizer",
    )
    explain.add_argument(
        "--html", type=Path, metavar="FILE.html",
        help="also write a self-contained HTML view (one row per layer of each method, the score on hover)",
    )
    explain.add_argument(
        "--words", choices=("sum", "max", "mean"), nargs="?", const="sum", default=None, metavar="sum|max|mean",
        help="one score per word: merge sub-word pieces (sum by default; max or mean on request)",
    )
    explain.set_defaults(run=_explain)

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
    figures.set_defaults(run=_figures)

    repro = commands.add_parser(
        "reproduce",
        help="compute the paper's Tables 1 and 2 on held-out data",
        description="Spearman correlation of raw attention, rollout and flow (CLS token, layers L1-L6) with "
        "blank-out (Table 1) and input gradients (Table 2) on held-out generated examples, beside the "
        "paper's numbers, plus how often each method ranks the subject above every attractor. Writes "
        "markdown, CSV files and a plot to DIR.",
    )
    repro.add_argument("--samples", type=_positive, default=2000, help="held-out examples (default: 2000, as the paper)")
    repro.add_argument(
        "--out", type=Path, default=DEFAULT_REPRODUCTION_DIR, metavar="DIR",
        help=f"output directory (default: {DEFAULT_REPRODUCTION_DIR})",
    )
    repro.add_argument("--seed", type=int, default=0, help="seed of the generated held-out examples (default: 0)")
    repro.add_argument("--batch-size", type=_positive, default=200, help="examples per batch (default: 200)")
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
    repro.set_defaults(run=_reproduce)
    _add_generate(commands)
    _add_adversarial(commands)
    _add_benchmark(commands)
    return parser


DEFAULT_BENCHMARK_DIR = Path("captum_attnflow_benchmark")


def _add_benchmark(commands: Any) -> None:
    from captum_attnflow.benchmark import FLOOR, QUICK_EXAMPLES, QUICK_METHODS
    from captum_attnflow.benchmark_tasks import TASKS

    names = (*METHODS, *EXTRA_METHODS, FLOOR)
    benchmark = commands.add_parser(
        "benchmark",
        help="rank attribution methods by faithfulness: a leaderboard with confidence intervals",
        description=f"Every method explains held-out examples of each task ({', '.join(TASKS)}); faithfulness "
        "(AOPC comprehensiveness and sufficiency, log-odds, deletion-curve area, and the agreement data's "
        "subject-first ground truth) per method with bootstrap intervals and Holm-adjusted Wilcoxon tests, and "
        "each method's time per example. Writes leaderboard.md, leaderboard.csv and leaderboard.png to DIR.",
    )
    benchmark.add_argument("--tasks", nargs="+", choices=tuple(TASKS), default=tuple(TASKS), metavar="TASK",
                           help=f"tasks (default: {' '.join(TASKS)})")
    benchmark.add_argument("--methods", nargs="+", choices=names, metavar="NAME", help=f"methods (default: all of {', '.join(names)})")
    benchmark.add_argument(
        "--examples", type=_positive, default=None, help="held-out examples per task (default: 64; with --data all rows)"
    )
    benchmark.add_argument(
        "--quick", action="store_true",
        help=f"{QUICK_EXAMPLES} examples per task and five methods ({', '.join(QUICK_METHODS)}) unless given",
    )
    benchmark.add_argument(
        "--out", type=Path, default=DEFAULT_BENCHMARK_DIR, metavar="DIR", help=f"output directory (default: {DEFAULT_BENCHMARK_DIR})"
    )
    benchmark.add_argument(
        "--checkpoint-dir", type=Path, metavar="DIR",
        help="keep each task's per-example values here as they are computed; run the same command again to resume",
    )
    benchmark.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    mine = benchmark.add_argument_group(
        "your own model and data", "a *ForSequenceClassification or *ForCausalLM directory saved with its tokenizer, "
        "explained on the rows of a CSV, JSON Lines or Parquet file (instead of the tasks); also under accelerate launch",
    )
    mine.add_argument("--model", type=Path, metavar="DIR", help="the model directory (save_pretrained, with its tokenizer)")
    mine.add_argument("--data", type=Path, metavar="FILE", help="a .csv, .tsv, .jsonl or .parquet file")
    for column, default, text in (
        ("text", "text", "a classifier's input text"), ("pair", None, "the second text of sentence pairs"),
        ("label", None, "the gold class to explain (default: the predicted one)"), ("prompt", "prompt", "a language model's prompt"),
        ("target", None, "the continuation whose first token is explained (default: the greedy next token)"),
        ("contrast", None, "explain target rather than this class / text (contrastive)"),
    ):
        mine.add_argument(f"--{column}-column", default=default, metavar="NAME", help=f"{text} (default: {default})")
    mine.add_argument("--deletion", choices=("remove", "mask", "unk", "pad"), default="remove",
                      help="delete tokens from the attention mask (default) or write this token in their place")
    mine.add_argument("--seed", type=int, default=0, help="seed of the drawn rows and the random floor (default: 0)")
    mine.add_argument("--batch-size", type=_positive, default=32, help="rows per batch (default: 32)")
    benchmark.set_defaults(run=_benchmark)


def _benchmark(args: argparse.Namespace) -> int:
    from captum_attnflow.benchmark import QUICK_EXAMPLES, QUICK_METHODS, run_benchmark

    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file; benchmark writes several files: give a directory.")
    out = _writable(args.out, args.out)
    methods = args.methods or (QUICK_METHODS if args.quick and args.data is None else None)
    examples = QUICK_EXAMPLES if args.quick and args.examples is None else args.examples
    if (args.model is None) != (args.data is None):
        raise ValueError("--model DIR and --data FILE go together: your model explained on your rows.")
    if args.data is not None:
        from captum_attnflow.benchmark_user import load_data, load_model, run_user_benchmark
        from captum_attnflow.benchmark_user_data import Columns

        data = load_data(args.data)
        model, tokenizer = load_model(args.model)
        columns = Columns(args.text_column, args.pair_column, args.label_column, args.prompt_column,
                          args.target_column, args.contrast_column)
        result = run_user_benchmark(
            model, tokenizer, data, columns, methods, examples, args.seed, args.batch_size, args.deletion,
            name=args.data.stem, show_progress=not args.no_progress, checkpoint_dir=args.checkpoint_dir,
        )
    else:
        result = run_benchmark(
            args.tasks, methods, examples, seed=args.seed, show_progress=not args.no_progress, checkpoint_dir=args.checkpoint_dir
        )
    if int(os.environ.get("RANK", "0")) == 0:  # under accelerate launch every process has the table; one writes it
        print(result.to_markdown())
        print("\nwritten: " + ", ".join(str(path) for path in result.save(out)))
    return 0


def _layer(value: str) -> int | None:
    if value == "all":
        return None
    return _whole_number(value, "a layer number 1..L or 'all'", "layers are numbered from 1")


def _head(value: str) -> int | str:
    if value == "all":
        return value
    return _whole_number(value, "a head number 0..H-1 or 'all'", "heads are numbered from 0", minimum=0)


def _positive(value: str) -> int:
    return _whole_number(value, "a positive integer", "expected a positive integer")


def _whole_number(value: str, expected: str, too_small: str, minimum: int = 1) -> int:
    """Parse an argparse value as an integer >= ``minimum``; the messages say what was expected instead."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value!r}") from None
    if number < minimum:
        raise argparse.ArgumentTypeError(f"{too_small}, got {number}")
    return number


def _load(directory: Path | None, agreement_only: bool = False) -> tuple[Any, Any]:
    """The bundled model, a saved agreement model, or (unless ``agreement_only``) any saved
    Hugging Face sequence-classification model and its tokenizer; anything else is refused
    before a model with random weights could be built from it."""
    if directory is None:
        return load_agreement_model()
    if not directory.is_dir() or not (directory / "config.json").is_file():
        raise FileNotFoundError(f"--model {directory} is not a directory saved with save_pretrained (no config.json).")
    config = json.loads((directory / "config.json").read_text())
    kind = config.get("model_type")
    if kind == AgreementConfig.model_type:
        return load_agreement_model(directory)
    if agreement_only:
        raise ValueError(
            f"--model {directory} holds a {kind!r} model; reproduce needs the verb-number agreement model "
            "(`python -m captum_attnflow.models.train --out DIR`), whose data and classes it evaluates."
        )
    heads = [name for name in config.get("architectures") or [] if name.endswith("ForSequenceClassification")]
    if not heads:
        raise ValueError(
            f"--model {directory} holds a {kind!r} model ({', '.join(config.get('architectures') or ['no architecture'])}) "
            "without a sequence-classification head, so it makes no prediction to explain: save a "
            "*ForSequenceClassification model (model.save_pretrained(DIR); tokenizer.save_pretrained(DIR))."
        )
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(f"--model {directory} has no loadable tokenizer: save it beside the model ({error}).") from None
    model = AutoModelForSequenceClassification.from_pretrained(directory, local_files_only=True).eval()
    return model, tokenizer


def _label(model: Any, index: int) -> str:
    if isinstance(model.config, AgreementConfig):
        return NUMBERS[index]
    return str(model.config.id2label.get(index, index))


def _image_path(out: Path, default_name: str) -> Path:
    """Where a figure goes (``out`` itself, or ``out/default_name`` for a directory), its folder
    created now: a bad path fails before the computation, not after it."""
    path = out / default_name if out.is_dir() else out
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise ValueError(
            f"--out {out} is neither an existing directory nor an image file name; end it with "
            f"{', '.join(IMAGE_SUFFIXES)}, or create the directory first."
        )
    return _writable(path.parent, out) / path.name


def _writable(directory: Path, out: Path) -> Path:
    """Create ``directory`` (and its parents) and check it can be written, naming ``--out`` in the error."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"--out {out}: cannot create the directory {directory} ({error.strerror}).") from None
    if not os.access(directory, os.W_OK):
        raise ValueError(f"--out {out}: the directory {directory} is not writable.")
    return directory


def _encode_sentence(sentence: str, tokenizer: Any) -> tuple[torch.Tensor, list[str]]:
    """Token ids (1, n) and token strings of a sentence; words the tokenizer does not know are
    reported on stderr."""
    if not sentence.strip():
        raise ValueError("the sentence has no words; pass e.g. \"the keys to the cabinet\".")
    encoded = tokenizer(sentence, return_tensors="pt", return_offsets_mapping=True)
    ids = encoded["input_ids"]
    tokens = tokenizer.convert_ids_to_tokens(ids[0].tolist())
    unknown = [
        sentence[start:end]
        for token, (start, end) in zip(tokens, encoded["offset_mapping"][0].tolist())
        if token == tokenizer.unk_token
    ]
    if unknown:
        print(
            f"warning: not in the model's vocabulary, read as {tokenizer.unk_token}: {', '.join(unknown)}",
            file=sys.stderr,
        )
    return ids, tokens


def _predict(model: Any, ids: torch.Tensor) -> tuple[int, str]:
    with torch.no_grad():
        probabilities = torch.softmax(model(ids).logits[0].float(), -1)
    predicted = int(probabilities.argmax())
    return predicted, f"{_label(model, predicted)} (probability {probabilities[predicted]:.3f})"


def _explain(args: argparse.Namespace) -> int:
    out = _image_path(args.out, DEFAULT_HEATMAP.name)
    model, tokenizer = _load(args.model)
    num_layers = model.config.num_hidden_layers
    if args.layer is not None and args.layer > num_layers:
        raise ValueError(f"--layer {args.layer} is out of range: the model has layers 1..{num_layers} (or all).")
    ids, tokens = _encode_sentence(args.sentence, tokenizer)
    predicted, prediction = _predict(model, ids)
    print(f"prediction: {prediction}")

    heads = model.config.num_attention_heads
    if args.head == "all" and args.layer is None:
        raise ValueError("--head all shows the heads of one layer: give it with --layer N.")
    if isinstance(args.head, int) and args.head >= heads:
        raise ValueError(f"--head {args.head} is out of range: the model has heads 0..{heads - 1} (or all).")
    methods = tuple(METHODS) if args.method == "all" else (args.method,)
    if args.head is not None:  # per-head results exist for the methods computed from attention weights
        if args.method != "all" and METHODS[args.method].per_layer and not METHODS[args.method].from_attentions:
            raise ValueError(f"--head is for the methods computed from attention weights ({', '.join(paper_methods())}), not {args.method}.")
        methods = tuple(name for name in methods if METHODS[name].from_attentions or not METHODS[name].per_layer)
    layers = list(range(num_layers)) if args.layer is None else [args.layer - 1]
    scores, labels = {}, {}
    for name in methods:
        method = METHODS[name].build(model, tokenizer)
        target = {"target": predicted} if METHODS[name].class_specific else {}
        target.update(METHODS[name].display)
        if METHODS[name].per_layer and args.head == "all":
            scores[name] = method.attribute(ids, layer=args.layer, head="all")[:, 0]  # (H, n)
            labels[name] = [f"L{args.layer} h{head}" for head in range(heads)]
        elif METHODS[name].per_layer:
            head = {} if args.head is None else {"head": args.head}
            scores[name] = method.attribute(ids, layer=None, **target, **head)[layers, 0]
            suffix = "" if args.head is None else f" h{args.head}"
            labels[name] = [f"L{layer + 1}{suffix}" for layer in layers]
        else:
            scores[name] = method.attribute(ids, target=predicted)
    result = ExplanationResult(
        tokens, scores, labels, prediction, str(args.model or "bundled agreement model"),
        {name: VALUE_LABELS[name] for name in scores if name in VALUE_LABELS},
    )
    if args.words:
        result = result.aggregate_words(tokenizer(args.sentence), args.words, text=args.sentence)
    print(_score_table(result.tokens, result.scores, labels))
    figure = plot_methods(result.scores, result.tokens, title=f'"{args.sentence}": {prediction}', layer_labels=labels,
                          value_labels=VALUE_LABELS)
    figure.savefig(out, dpi=120)
    print(f"heatmap written to {out}")
    if args.html:
        result.to_html(args.html)
        print(f"HTML view written to {args.html}")
    return 0


def _figures(args: argparse.Namespace) -> int:
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file; figures writes two images: give a directory.")
    out = _writable(args.out, args.out)
    model, tokenizer = _load(args.model)
    ids, tokens = _encode_sentence(args.sentence, tokenizer)
    predicted, prediction = _predict(model, ids)
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
                       value_labels=VALUE_LABELS).savefig(first, dpi=120)
    second = out / "figures2_3.png"
    plot_methods({name: values[:, 0] for name, values in maps.items()}, tokens,
                 title=f"Figures 2-3: {tokens[0]} over layers, {quoted}", value_labels=VALUE_LABELS).savefig(second, dpi=120)
    print(f"prediction: {prediction}")
    print(f"written: {first}, {second}")
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


def _reproduce(args: argparse.Namespace) -> int:
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file; reproduce writes several files: give a directory.")
    if args.ranking == "dense" and args.protocol != "paper":
        raise ValueError("--ranking dense is the authors' Spearman formula: add --protocol paper.")
    out = _writable(args.out, args.out)
    model, tokenizer = _load(args.model, agreement_only=True)
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


DEFAULT_GENERATION_HEATMAP = Path("captum_attnflow_generate.png")


def _add_generate(commands: Any) -> None:
    generate = commands.add_parser(
        "generate",
        help="explain a language model's continuation of a prompt",
        description="Continue PROMPT greedily (or take --target) with the bundled agreement language model or a "
        "local Hugging Face causal LM / encoder-decoder directory, print each prompt token's score for every "
        "output token and write the output-tokens x prompt-tokens heatmap (Captum's plot_token_attr).",
    )
    generate.add_argument("prompt", help='the prompt, e.g. "the keys to the cabinet"')
    generate.add_argument("--target", help="explain this continuation instead of generating one")
    generate.add_argument(
        "--contrast", metavar="TEXT",
        help='explain why the model wrote the target rather than TEXT (e.g. "is"), by the gradient of the '
        "difference of their logits; needs --method gradient_rollout (the default then)",
    )
    generate.add_argument(
        "--method", choices=(*attention_methods(), "attnlrp"), default=None,
        help="attribution method (default: rollout; gradient_rollout with --contrast)",
    )
    generate.add_argument(
        "--layer", type=_positive, default=None, metavar="N", help="explain after layer N (default: the last)"
    )
    generate.add_argument("--max-new-tokens", type=_positive, default=10, help="longest continuation (default: 10)")
    generate.add_argument(
        "--receptive-field", action="store_true",
        help="divide each score by the number of positions that can attend to the token (decoder-only models)",
    )
    generate.add_argument("--drop-sink", action="store_true", help="leave the first prompt token (BOS) out")
    generate.add_argument(
        "--out", type=Path, default=DEFAULT_GENERATION_HEATMAP, metavar="FILE.png",
        help=f"where to write the heatmap (default: {DEFAULT_GENERATION_HEATMAP})",
    )
    generate.add_argument(
        "--model", type=Path, metavar="DIR",
        help="a local Hugging Face model directory (causal LM or encoder-decoder) instead of the bundled one",
    )
    generate.add_argument(
        "--html", type=Path, metavar="FILE.html",
        help="also write a self-contained HTML view (one row per output token, the score on hover)",
    )
    generate.add_argument(
        "--words", choices=("sum", "max", "mean"), nargs="?", const="sum", default=None, metavar="sum|max|mean",
        help="one score per word on both axes, prompt and output (sum by default)",
    )
    generate.set_defaults(run=_generate)


def _generate(args: argparse.Namespace) -> int:
    from captum_attnflow.attr.llm import LLMAttentionAttribution
    from captum_attnflow.models.language_model import load_agreement_lm

    if args.model is None:
        model, tokenizer = load_agreement_lm()
    else:
        model, tokenizer = _load_language_model(args.model)
    method = args.method or ("rollout" if args.contrast is None else "gradient_rollout")
    if args.contrast is not None and not METHODS[method].class_specific:
        raise ValueError(f"--contrast explains a difference of logits by its gradient: use --method gradient_rollout, not {method}.")
    explainer = LLMAttentionAttribution(METHODS[method].build(model, tokenizer), tokenizer)
    result = explainer.attribute(
        args.prompt,
        target=args.target,
        contrast_target=args.contrast,
        layer=-1 if args.layer is None else args.layer,
        max_new_tokens=args.max_new_tokens,
        receptive_field=args.receptive_field,
        drop_sink=args.drop_sink,
        **({} if explainer.encoder_decoder else dict(METHODS[method].display)),
    )
    print(f"continuation: {tokenizer.convert_tokens_to_string(result.output_tokens).strip()}")
    if args.words:
        result = result.aggregate_words(tokenizer, args.words)
    print(_generation_table(result.input_tokens, result.output_tokens, result.token_attr))
    figure, _ = result.plot_token_attr()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=120, bbox_inches="tight")
    print(f"heatmap written to {args.out}")
    if args.html:
        result.to_html(args.html)
        print(f"HTML view written to {args.html}")
    return 0


def _generation_table(input_tokens: list[str], output_tokens: list[str], token_attr: torch.Tensor) -> str:
    """Prompt tokens as rows, one column per output token (the transpose of Captum's heatmap)."""
    width = max(len(token) for token in [*input_tokens, "prompt"])
    names = [f"{t + 1}:{token}" for t, token in enumerate(output_tokens)]
    widths = [max(8, len(name)) for name in names]
    header = f"{'prompt':<{width}}  " + "  ".join(f"{name:>{w}}" for name, w in zip(names, widths))
    lines = [header, "-" * len(header)]
    for j, token in enumerate(input_tokens):
        cells = "  ".join(f"{float(token_attr[t, j]):>{w}.4f}" for t, w in enumerate(widths))
        lines.append(f"{token:<{width}}  {cells}")
    return "\n".join(lines)


def _load_language_model(directory: Path) -> tuple[Any, Any]:
    """A causal LM or encoder-decoder and its tokenizer from a local directory, offline."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"--model {directory} holds no config.json: pass a directory saved with save_pretrained.")
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    loader = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    model = loader.from_pretrained(directory, local_files_only=True).eval()
    return model, AutoTokenizer.from_pretrained(directory, local_files_only=True)


DEFAULT_ADVERSARIAL_DIR = Path("captum_attnflow_adversarial")


def _add_adversarial(commands: argparse._SubParsersAction) -> None:
    adversarial = commands.add_parser(
        "adversarial",
        help="is attention the only path? adversarial attention, probing and what it means for rollout and flow",
        description="Train chunk taggers and adversaries of them and of the bundled agreement classifier "
        "(Yang; Wiegreffe & Pinter 2019): per model the score, the JSD and KL of its attention to the "
        "original per layer and the TVD of its predictions, beside another seed and uniform attention; "
        "per-instance adversarial attention (Jain & Wallace 2019); probing classifiers; the Spearman "
        "correlation of raw attention, rollout and flow across models and with blank-out. Writes markdown, "
        "CSV files and the TVD-vs-JSD plot to DIR.",
    )
    adversarial.add_argument(
        "--models", nargs="+", choices=tuple(MODELS), default=list(MODELS),
        help="originals to study: yang and deep chunk taggers, the agreement classifier (default: all)",
    )
    adversarial.add_argument(
        "--lambdas", nargs="+", type=float, default=list(DEFAULT_LAMBDAS), metavar="LAMBDA",
        help="lambda grid of the global adversaries (default: %(default)s)",
    )
    adversarial.add_argument("--train-examples", type=_positive, default=4096, help="generated training sentences (default: 4096)")
    adversarial.add_argument("--test-examples", type=_positive, default=512, help="held-out sentences (default: 512)")
    adversarial.add_argument("--batch-size", type=_positive, default=32, help="sentences per batch (default: 32)")
    adversarial.add_argument(
        "--train-steps", type=_positive, default=150,
        help="steps of each model trained from scratch: originals, other seed, uniform, probes (default: 150)",
    )
    adversarial.add_argument("--adversary-steps", type=_positive, default=80, help="steps of each adversary (default: 80)")
    adversarial.add_argument(
        "--agreement-steps", type=_positive, default=600,
        help="steps of the agreement classifiers trained from scratch: other seed, uniform (default: 600)",
    )
    adversarial.add_argument(
        "--per-instance-examples", type=_positive, default=32, help="examples of the per-instance adversary (default: 32)"
    )
    adversarial.add_argument(
        "--per-instance-steps", type=_positive, default=100, help="optimisation steps of the per-instance adversary (default: 100)"
    )
    adversarial.add_argument("--epsilon", type=float, default=0.01, help="TVD bound of the per-instance adversary (default: 0.01)")
    adversarial.add_argument("--seed", type=int, default=0, help="seed of data, initialisation and order (default: 0)")
    adversarial.add_argument(
        "--threads", type=_positive, default=1,
        help="torch CPU threads (default: 1; these small matrices gain little from more, and lose much on a busy machine)",
    )
    adversarial.add_argument(
        "--out", type=Path, default=DEFAULT_ADVERSARIAL_DIR, metavar="DIR",
        help=f"output directory (default: {DEFAULT_ADVERSARIAL_DIR})",
    )
    adversarial.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    adversarial.set_defaults(run=_adversarial)


def _adversarial(args: argparse.Namespace) -> int:
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        result = run_study(
            models=args.models,
            lambdas=args.lambdas,
            train_examples=args.train_examples,
            test_examples=args.test_examples,
            batch_size=args.batch_size,
            train_steps=args.train_steps,
            adversary_steps=args.adversary_steps,
            agreement_steps=args.agreement_steps,
            per_instance_examples=args.per_instance_examples,
            per_instance_steps=args.per_instance_steps,
            epsilon=args.epsilon,
            seed=args.seed,
            progress=not args.no_progress,
        )
    finally:
        torch.set_num_threads(threads)
    print(result.to_markdown())
    paths = result.save(args.out)
    print("written: " + ", ".join(str(path) for path in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
