"""The ``captum-attnflow`` command: explain a sentence with the bundled model, reproduce the paper's tables.

``captum-attnflow explain "the keys to the cabinet"`` prints the model's prediction and
per-token scores and writes a layers x tokens heatmap; ``captum-attnflow reproduce`` computes
Tables 1 and 2 of Abnar & Zuidema (2020) (see :mod:`captum_attnflow.reproduce`);
``captum-attnflow adversarial`` runs the adversarial-attention study (see
:mod:`captum_attnflow.adversarial.study`). Both run on
the verb-number model that ships with the package, or on a checkpoint directory saved with
``save_pretrained`` (``--model DIR``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

from captum_attnflow.adversarial.study import DEFAULT_LAMBDAS, MODELS, run_study
from captum_attnflow.attr import AttentionFlow, AttentionRollout, RawAttention
from captum_attnflow.baselines import BlankOut, TokenSaliency
from captum_attnflow.data.agreement import PLURAL, SINGULAR
from captum_attnflow.models import load_agreement_model
from captum_attnflow.reproduce import reproduce
from captum_attnflow.visualize import plot_methods

ATTENTION_METHODS = {"raw": RawAttention, "rollout": AttentionRollout, "flow": AttentionFlow}
OUTPUT_METHODS = ("saliency", "blankout")
METHODS = (*ATTENTION_METHODS, *OUTPUT_METHODS)
NUMBERS = {SINGULAR: "singular", PLURAL: "plural"}
DEFAULT_HEATMAP = Path("captum_attnflow_explain.png")
DEFAULT_REPRODUCTION_DIR = Path("captum_attnflow_reproduction")


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
        "--out", type=Path, default=DEFAULT_HEATMAP, metavar="FILE.png",
        help=f"where to write the heatmap (default: {DEFAULT_HEATMAP})",
    )
    explain.add_argument("--model", type=Path, metavar="DIR", help="a saved model directory instead of the bundled one")
    explain.set_defaults(run=_explain)

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
    repro.add_argument("--model", type=Path, metavar="DIR", help="a saved model directory instead of the bundled one")
    repro.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    repro.set_defaults(run=_reproduce)
    _add_generate(commands)
    _add_adversarial(commands)
    return parser


def _layer(value: str) -> int | None:
    if value == "all":
        return None
    return _whole_number(value, "a layer number 1..L or 'all'", "layers are numbered from 1")


def _positive(value: str) -> int:
    return _whole_number(value, "a positive integer", "expected a positive integer")


def _whole_number(value: str, expected: str, below_one: str) -> int:
    """Parse an argparse value as an integer >= 1; the messages say what was expected instead."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{below_one}, got {number}")
    return number


def _load(directory: Path | None) -> tuple[Any, Any]:
    if directory is not None and not directory.is_dir():
        raise FileNotFoundError(f"--model {directory} is not a directory saved with save_pretrained.")
    return load_agreement_model(directory)


def _explain(args: argparse.Namespace) -> int:
    model, tokenizer = _load(args.model)
    num_layers = model.config.num_hidden_layers
    if args.layer is not None and args.layer > num_layers:
        raise ValueError(f"--layer {args.layer} is out of range: the model has layers 1..{num_layers} (or all).")
    encoded = tokenizer(args.sentence, return_tensors="pt", return_offsets_mapping=True)
    ids = encoded["input_ids"]
    if ids.shape[1] < 2:
        raise ValueError("the sentence has no words; pass e.g. \"the keys to the cabinet\".")
    tokens = tokenizer.convert_ids_to_tokens(ids[0].tolist())
    unknown = [
        args.sentence[start:end]
        for token, (start, end) in zip(tokens, encoded["offset_mapping"][0].tolist())
        if token == tokenizer.unk_token
    ]
    if unknown:
        print(
            f"warning: not in the model's vocabulary, read as {tokenizer.unk_token}: {', '.join(unknown)}",
            file=sys.stderr,
        )
    with torch.no_grad():
        probabilities = torch.softmax(model(ids).logits[0].float(), -1)
    predicted = int(probabilities.argmax())
    prediction = f"{NUMBERS[predicted]} (probability {probabilities[predicted]:.3f})"
    print(f"prediction: {prediction}")

    methods = METHODS if args.method == "all" else (args.method,)
    layers = list(range(num_layers)) if args.layer is None else [args.layer - 1]
    scores, labels = {}, {}
    for method in methods:
        if method in ATTENTION_METHODS:
            scores[method] = ATTENTION_METHODS[method](model).attribute(ids, layer=None)[layers, 0]
            labels[method] = [f"L{layer + 1}" for layer in layers]
        elif method == "saliency":
            scores[method] = TokenSaliency(model).attribute(ids, target=predicted)
        else:
            scores[method] = BlankOut(model, tokenizer=tokenizer).attribute(ids, target=predicted)

    print(_score_table(tokens, scores, labels))
    figure = plot_methods(scores, tokens, title=f'"{args.sentence}": {prediction}', layer_labels=labels)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=120)
    print(f"heatmap written to {args.out}")
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
    model, tokenizer = _load(args.model)
    result = reproduce(
        num_samples=args.samples,
        seed=args.seed,
        batch_size=args.batch_size,
        model=model,
        tokenizer=tokenizer,
        include_cls=args.include_cls,
        progress=not args.no_progress,
    )
    print(result.to_markdown())
    paths = result.save(args.out)
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
        "--method", choices=tuple(ATTENTION_METHODS), default="rollout", help="attribution method (default: rollout)"
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
    generate.set_defaults(run=_generate)


def _generate(args: argparse.Namespace) -> int:
    from captum_attnflow.attr.llm import LLMAttentionAttribution
    from captum_attnflow.models.language_model import load_agreement_lm

    if args.model is None:
        model, tokenizer = load_agreement_lm()
    else:
        model, tokenizer = _load_language_model(args.model)
    explainer = LLMAttentionAttribution(ATTENTION_METHODS[args.method](model), tokenizer)
    result = explainer.attribute(
        args.prompt,
        target=args.target,
        layer=-1 if args.layer is None else args.layer,
        max_new_tokens=args.max_new_tokens,
        receptive_field=args.receptive_field,
        drop_sink=args.drop_sink,
    )
    print(f"continuation: {tokenizer.convert_tokens_to_string(result.output_tokens).strip()}")
    print(_generation_table(result.input_tokens, result.output_tokens, result.token_attr))
    figure, _ = result.plot_token_attr()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=120, bbox_inches="tight")
    print(f"heatmap written to {args.out}")
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
