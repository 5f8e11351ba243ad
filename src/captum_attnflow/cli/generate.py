"""``captum-attnflow generate PROMPT``: explain a language model's continuation of a prompt, token by
token (see :class:`captum_attnflow.attr.llm.LLMAttentionAttribution`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from captum_attnflow.cli import _choices as choices
from captum_attnflow.cli import _common as common
from captum_attnflow.cli import _options as options

if TYPE_CHECKING:
    import torch

DEFAULT_GENERATION_HEATMAP = Path("captum_attnflow_generate.png")

HELP = "explain a language model's continuation of a prompt"
DESCRIPTION = (
    "Continue PROMPT greedily (or take --target) with the bundled agreement language model or a Hugging "
    "Face causal LM / encoder-decoder (a directory, or a name in the local cache), print each prompt token's "
    "score for every output token (an encoder-decoder's source tokens, then its target prefix, and each output "
    "token's source share) and write the output-tokens x prompt-tokens heatmap (Captum's plot_token_attr)."
)


def add_arguments(generate: argparse.ArgumentParser) -> None:
    """The arguments of ``generate``."""
    generate.add_argument("prompt", help='the prompt, e.g. "the keys to the cabinet"')
    generate.add_argument("--target", help="explain this continuation instead of generating one")
    generate.add_argument(
        "--contrast", metavar="TEXT",
        help='explain why the model wrote the target rather than TEXT (e.g. "is"), by the gradient of the '
        "difference of their logits; needs --method gradient_rollout (the default then)",
    )
    generate.add_argument(
        "--method", choices=(*choices.ATTENTION_METHODS, "attnlrp"), default=None,
        help="attribution method (default: rollout; gradient_rollout with --contrast)",
    )
    generate.add_argument(
        "--layer", type=common.positive, default=None, metavar="N", help="explain after layer N (default: the last)"
    )
    generate.add_argument("--max-new-tokens", type=common.positive, default=10, help="longest continuation (default: 10)")
    generate.add_argument(
        "--receptive-field", action="store_true",
        help="divide each score by the number of positions that can attend to the token (decoder-only models)",
    )
    generate.add_argument("--drop-sink", action="store_true", help="leave the first prompt token (BOS) out")
    generate.add_argument(
        "--out", type=Path, default=DEFAULT_GENERATION_HEATMAP, metavar="FILE.png",
        help=f"where to write the heatmap (default: {DEFAULT_GENERATION_HEATMAP})",
    )
    options.add_model(generate, "a Hugging Face causal LM or encoder-decoder instead of the bundled one")
    options.add_placement(generate)
    options.add_html(generate, "also write a self-contained HTML view (one row per output token, the score on hover)")
    options.add_words(generate, "one score per word on both axes, prompt and output (sum by default)")


def run(args: argparse.Namespace) -> int:
    from captum_attnflow.attr.llm import LLMAttentionAttribution
    from captum_attnflow.methods import METHODS
    from captum_attnflow.models.language_model import load_agreement_lm

    if args.model is None:
        model, tokenizer = load_agreement_lm(**common.placement(args))
    else:
        model, tokenizer = _load_language_model(args.model, common.placement(args))
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
    if result.source_share is None:
        print(_generation_table(result.input_tokens, result.output_tokens, result.token_attr))
    else:  # an encoder-decoder: the source's scores, then the target prefix's, and each token's shares
        import torch

        print(_generation_table(result.input_tokens, result.output_tokens, result.token_attr, "source"))
        prefix = [result.decoder_start_token or "<start>", *result.output_tokens[:-1]]
        scores = torch.cat([result.decoder_start_attr[:, None], result.output_attr[:, :-1]], 1)
        print(_generation_table(prefix, result.output_tokens, scores, "target prefix"))
        print("source share:  " + "  ".join(f"{t + 1}:{token} {float(share):.4f}"
                                             for t, (token, share) in enumerate(zip(result.output_tokens, result.source_share))))
    figure, _ = result.plot_token_attr()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=120, bbox_inches="tight")
    print(f"heatmap written to {args.out}")
    common.write_html(result, args.html)
    return 0


def _generation_table(
    input_tokens: list[str], output_tokens: list[str], token_attr: torch.Tensor, label: str = "prompt"
) -> str:
    """Prompt tokens (or an encoder-decoder's source or target prefix, ``label``) as rows, one
    column per output token (the transpose of Captum's heatmap)."""
    width = max(len(token) for token in [*input_tokens, label])
    names = [f"{t + 1}:{token}" for t, token in enumerate(output_tokens)]
    widths = [max(8, len(name)) for name in names]
    header = f"{label:<{width}}  " + "  ".join(f"{name:>{w}}" for name, w in zip(names, widths))
    lines = [header, "-" * len(header)]
    for j, token in enumerate(input_tokens):
        cells = "  ".join(f"{float(token_attr[t, j]):>{w}.4f}" for t, w in enumerate(widths))
        lines.append(f"{token:<{width}}  {cells}")
    return "\n".join(lines)


def _load_language_model(name: str, placement: dict[str, Any]) -> tuple[Any, Any]:
    """A causal LM or encoder-decoder and its tokenizer (``--model NAME_OR_DIR``, offline), placed
    by ``placement``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    from captum_attnflow.hf import load_pretrained

    directory = common.model_directory(name)
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    loader = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    model = load_pretrained(loader, directory, **placement, local_files_only=True)
    return model, AutoTokenizer.from_pretrained(directory, local_files_only=True)
