"""``captum-attnflow cite --context FILE --question "..."``: which source of a context a language model's
answer came from, the sources ranked by an attention method's score (see
:class:`captum_attnflow.attr.llm.LLMAttentionAttribution` with a ``TextTemplateInput``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from captum_attnflow.cli import _choices as choices
from captum_attnflow.cli import _common as common
from captum_attnflow.cli import _options as options

HELP = "which source of a context did a language model's answer come from"
DESCRIPTION = (
    "Split the context of FILE into sources (sentences, paragraphs or lines), ask the QUESTION after it, let the "
    "bundled retrieval language model or a Hugging Face causal LM (a directory, or a name in the local cache) answer "
    "greedily, and print the sources ranked by how much the answer drew on each: the sum of its tokens' scores."
)
# How much of each source the ranked list prints.
SHOWN_CHARACTERS = 90


def add_arguments(cite: argparse.ArgumentParser) -> None:
    """The arguments of ``cite``."""
    cite.add_argument("--context", type=Path, required=True, metavar="FILE", help="a text file holding the context")
    cite.add_argument("--question", required=True, help='the question asked after the context, e.g. "Who wrote it?"')
    cite.add_argument("--by", choices=("sentence", "paragraph", "line"), default=None,
                      help="what a source is (default: sentence)")
    cite.add_argument("--method", choices=(*choices.ATTENTION_METHODS, "attnlrp"), default="rollout",
                      help="attribution method (default: rollout)")
    cite.add_argument("--answer", help="explain this answer instead of generating one")
    cite.add_argument("--max-new-tokens", type=common.positive, default=16, help="longest answer (default: 16)")
    cite.add_argument("--top", type=common.positive, default=None, metavar="K", help="print the K best sources only")
    options.add_model(cite, "a Hugging Face causal LM instead of the bundled retrieval language model")
    options.add_placement(cite)
    options.add_html(cite, "also write a self-contained HTML view, the sources shaded by their scores")


def run(args: argparse.Namespace) -> int:
    from captum_attnflow.attr.llm import LLMAttentionAttribution
    from captum_attnflow.methods import METHODS

    if not args.context.is_file():
        raise ValueError(f"--context {args.context} is not a file; give a text file holding the context.")
    context = args.context.read_text(encoding="utf-8")
    model, tokenizer, prompt = _prompt(args, context)
    explainer = LLMAttentionAttribution(METHODS[args.method].build(model, tokenizer), tokenizer)
    result = explainer.attribute(prompt, target=args.answer, max_new_tokens=args.max_new_tokens)
    said = [token for token in result.output_tokens if token not in tokenizer.all_special_tokens]
    print(f"answer: {tokenizer.convert_tokens_to_string(said).strip()}")
    print(_ranked(result.input_tokens, result.seq_attr.tolist(), args.top))
    common.write_html(result, args.html)
    return 0


def _prompt(args: argparse.Namespace, context: str) -> tuple[Any, Any, Any]:
    """The model, its tokenizer and the question's ``TextTemplateInput``
    (:func:`~captum_attnflow.context_prompt`); the bundled retrieval language model reads the
    context and the question as it was trained to (``Question: ...`` and ``Answer:`` after the
    facts; its word-level tokenizer makes no token of whitespace)."""
    from captum_attnflow.data.retrieval import TEMPLATE_TAIL
    from captum_attnflow.data.sources import context_prompt

    if args.model is None:
        from captum_attnflow.models.retrieval import load_retrieval_model

        model, tokenizer = load_retrieval_model(**common.placement(args))
        prompt = context_prompt(context, args.question, by=args.by or "sentence", template="{context}\n" + TEMPLATE_TAIL)
        _warn_unknown_words(tokenizer, prompt.to_model_input())
        return model, tokenizer, prompt
    from captum_attnflow.cli.generate import _load_language_model

    model, tokenizer = _load_language_model(args.model, common.placement(args))
    return model, tokenizer, context_prompt(context, args.question, by=args.by or "sentence")


def _warn_unknown_words(tokenizer: Any, text: str) -> None:
    """Say on stderr which words of ``text`` the bundled model's word-level tokenizer reads as ``<unk>``."""
    encoded = tokenizer(text, return_offsets_mapping=True)
    unknown = list(dict.fromkeys(
        text[start:end] for token, (start, end) in zip(encoded["input_ids"], encoded["offset_mapping"])
        if token == tokenizer.unk_token_id
    ))
    if unknown:
        shown = ", ".join(unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        print(f"note: the bundled retrieval model does not know {len(unknown)} word(s) of the context and question "
              f"({shown}) and reads each as <unk>; it knows facts written 'Name: value (attribute).' (see "
              "captum_attnflow.data.retrieval_examples). Give --model for other text.", file=sys.stderr)


def _ranked(sources: list[str], scores: list[float], top: int | None) -> str:
    """The sources best first: rank, score and the source's text (shortened)."""
    order = sorted(range(len(sources)), key=lambda index: -scores[index])[:top]
    width = len(str(len(sources)))
    lines = [f"{'rank':>4}  {'score':>8}  {'#':>{width}}  source", "-" * (SHOWN_CHARACTERS + 20)]
    for rank, index in enumerate(order, 1):
        text = " ".join(sources[index].split())
        text = text if len(text) <= SHOWN_CHARACTERS else text[: SHOWN_CHARACTERS - 1] + "…"
        lines.append(f"{rank:>4}  {scores[index]:>8.4f}  {index:>{width}}  {text}")
    return "\n".join(lines)
