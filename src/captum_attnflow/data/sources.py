"""A context split into sources (sentences, paragraphs or lines), and the Captum
``TextTemplateInput`` of a context and a question whose values are those sources.

Everything here is rules over the text itself: no model, no download (nltk's punkt is not used),
nothing read from the network at import or call.
"""

from __future__ import annotations

import re
import string
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from captum.attr import TextTemplateInput

SPLITS = ("sentence", "paragraph", "line")

# Abbreviations that do not end a sentence: titles before a name, Latin and reference
# abbreviations before what they introduce (the word is compared lower-cased, without its final dot).
_NEVER_FINAL = frozenset(
    "mr mrs ms dr prof rev hon gen col capt lt sgt gov sen rep st mt ft vs e.g i.e cf fig figs eq no nos vol "
    "vols pp approx dept ca viz".split()
)
# Abbreviations that may end one: a sentence ends after them only when the next word is one that
# usually starts a sentence (a pronoun, a determiner, a connective), so "the U.S. Army" stays whole
# and "moved to the U.S. Then" splits. Single letters (initials) and dotted acronyms count here too.
_MAYBE_FINAL = frozenset(
    "etc inc ltd co corp jr sr al jan feb mar apr jun jul aug sep sept oct nov dec a.m p.m".split()
)
_STARTERS = frozenset(
    "the a an he she it they we i you this that these those there then but and so however yet in on at "
    "after before when while if as his her its their our my your what who why how".split()
)
# A candidate end: terminal punctuation, closing quotes or brackets, then whitespace.
_END = re.compile(r"([.!?\u2026]+)([\"'\u201d\u2019)\]]*)(\s+)")
_OPENING = "\"'\u201c\u2018([{"
_DOTTED = re.compile(r"^(?:[^\W\d_]\.)+[^\W\d_]$")  # U.S, e.g, a.m: letters joined by dots
_BLANK_LINE = re.compile(r"\n[^\S\n]*\n\s*")


def split_sources(text: str, by: str = "sentence") -> list[str]:
    """``text`` split into sources: its sentences, paragraphs or lines, offline, by rules.

    No character is dropped or changed: each source keeps the whitespace that follows it (the
    text's leading whitespace goes with the first), so ``"".join(split_sources(text)) == text``.
    A piece that would hold only whitespace joins the source before it.

    * ``by="paragraph"``: a blank line (a line of only spaces and tabs) ends a paragraph.
    * ``by="line"``: every line break ends a source (``str.splitlines``); blank lines join the
      line above.
    * ``by="sentence"``: a blank line, and ``.``, ``!``, ``?``, ``…`` or a run of them (``?!``,
      ``...``), possibly followed by closing quotes or brackets (``."``, ``.')``), then whitespace,
      then a word that does not start in lower case. Decimals (``3.14``) have no whitespace
      after the dot and never split. After a single ``.``, the word before it is checked:
      titles and reference abbreviations (``Mr.``, ``Dr.``, ``e.g.``, ``i.e.``, ``No.``, ``Fig.``)
      never end a sentence; initials (``J.``), dotted acronyms (``U.S.``, ``a.m.``) and ``etc.``,
      ``Inc.``, ``Jr.``, month names end one only before a word that usually starts a sentence
      (``The``, ``He``, ``Then``, ...), so ``the U.S. Army`` stays one sentence and
      ``moved to the U.S. Then he left.`` is two. A single line break is not a boundary.

    Args:
        text: the context.
        by: ``"sentence"`` (default), ``"paragraph"`` or ``"line"``.

    Returns:
        list[str]: the sources in order; ``[]`` for an empty text, ``[text]`` for one of only
        whitespace.

    Raises:
        TypeError: ``text`` is not a string.
        ValueError: another ``by``.

    Example::

        >>> split_sources("Dr. Smith paid $3.14 at 9 a.m. yesterday. He said 'stop.' Then... nothing!")
        ['Dr. Smith paid $3.14 at 9 a.m. yesterday. ', "He said 'stop.' ", 'Then... nothing!']
        >>> split_sources("First paragraph,\\nstill first.\\n\\nSecond.", by="paragraph")
        ['First paragraph,\\nstill first.\\n\\n', 'Second.']
        >>> split_sources("a\\n\\nb\\n", by="line")
        ['a\\n\\n', 'b\\n']
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}.")
    if by not in SPLITS:
        raise ValueError(f"by must be one of {', '.join(map(repr, SPLITS))}, got {by!r}.")
    if by == "line":
        ends = _line_ends(text)
    elif by == "paragraph":
        ends = [match.end() for match in _BLANK_LINE.finditer(text)]
    else:
        ends = sorted({*(match.end() for match in _BLANK_LINE.finditer(text)), *_sentence_ends(text)})
    return _cut(text, ends)


def _line_ends(text: str) -> list[int]:
    ends, position = [], 0
    for line in text.splitlines(keepends=True):
        position += len(line)
        ends.append(position)
    return ends


def _sentence_ends(text: str) -> list[int]:
    """The offsets right after the whitespace that follows each sentence's end."""
    ends = []
    for match in _END.finditer(text):
        following = text[match.end() :].lstrip(_OPENING)
        if not following or following[0].islower():
            continue
        if match.group(1) == "." and not _ends_after_dot(text[: match.start()], following):
            continue
        ends.append(match.end())
    return ends


def _ends_after_dot(before: str, following: str) -> bool:
    """Whether a single dot ends a sentence, from the word before it and the one after."""
    words = before.split()
    word = words[-1].lstrip(_OPENING).lower() if words else ""
    if word in _NEVER_FINAL:
        return False
    if word in _MAYBE_FINAL or len(word) == 1 and word.isalpha() or _DOTTED.match(word):
        next_word = re.match(r"[^\W_]+", following)
        return next_word is not None and next_word.group(0).lower() in _STARTERS
    return True


def _cut(text: str, ends: list[int]) -> list[str]:
    """``text`` cut at ``ends``; pieces of only whitespace join the one before (the first, the next)."""
    pieces, start = [], 0
    for end in [*ends, len(text)]:
        if end > start:
            pieces.append(text[start:end])
            start = end
    sources: list[str] = []
    for piece in pieces:
        if sources and (not piece.strip() or not sources[-1].strip()):
            sources[-1] += piece
        else:
            sources.append(piece)
    return sources


def context_prompt(
    context: str | Sequence[str],
    question: str,
    by: str = "sentence",
    template: str = "Context: {context}\n\nQuestion: {question}",
    separator: str = "\n",
) -> "TextTemplateInput":
    """A Captum ``TextTemplateInput`` of a context and a question, the context's sources as its values.

    Each source is one interpretable feature: through
    :class:`~captum_attnflow.LLMAttentionAttribution` or Captum's ``LLMAttribution`` it gets one
    score. The whitespace around a source and everything of ``template`` outside ``{context}``
    are the template's own text and belong to no source.

    Args:
        context: the context as one string, split by :func:`split_sources` (``by``), its text kept
            exactly; or the sources themselves (documents, passages), joined by ``separator``.
        question: the question, written where ``template`` has ``{question}``.
        by: how a string context is split: ``"sentence"`` (default), ``"paragraph"`` or ``"line"``.
        template: the prompt around the context: ``{context}`` and ``{question}`` once each,
            braces elsewhere doubled (``{{``) as in ``str.format``. Default:
            ``"Context: {context}\\n\\nQuestion: {question}"``.
        separator: what joins the sources of a list. Default ``"\\n"``.

    Returns:
        TextTemplateInput: values the sources without their leading and trailing whitespace (a
        list, in order), ``to_model_input()`` the prompt.

    Raises:
        TypeError: a context that is neither a string nor a list of strings.
        ValueError: a context without any source; a template without ``{context}`` or
            ``{question}``, with either twice, or with another field.

    Example::

        >>> prompt = context_prompt("Paris is in France. Rome is in Italy.", "Where is Rome?")
        >>> prompt.values
        ['Paris is in France.', 'Rome is in Italy.']
        >>> print(prompt.to_model_input())
        Context: Paris is in France. Rome is in Italy.
        <BLANKLINE>
        Question: Where is Rome?
        >>> context_prompt(["Doc one.", "Doc two."], "Which?", template="{context}\\nQ: {question}").to_model_input()
        'Doc one.\\nDoc two.\\nQ: Which?'
    """
    from captum.attr import TextTemplateInput  # Captum (and matplotlib) load when a prompt is built

    if isinstance(context, str):
        pieces = [(source, True) for source in split_sources(context, by)]
    elif isinstance(context, Sequence) and all(isinstance(source, str) for source in context):
        pieces = [(separator, False)] * (2 * len(context) - 1)
        pieces[::2] = [(source, True) for source in context]
    else:
        raise TypeError(f"context must be a string or a list of strings, got {type(context).__name__}.")
    values, parts = [], []
    for text, is_source in pieces:
        core = text.strip()
        if not is_source:
            parts.append(_escape(text))
            continue
        lead = text[: len(text) - len(text.lstrip())]
        parts.append(f"{_escape(lead)}{{}}{_escape(text[len(lead) + len(core) :])}")
        values.append(core)
    if not values or not any(values):
        raise ValueError("the context holds no source: pass some text (or a non-empty list of sources).")
    return TextTemplateInput(_fill(template, "".join(parts), question), values=values)


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _fill(template: str, context: str, question: str) -> str:
    """``template`` with ``{context}`` replaced by the (already escaped) fields of the sources and
    ``{question}`` by the escaped question; its own text stays escaped."""
    pieces, seen = [], []
    for literal, field, spec, conversion in string.Formatter().parse(template):
        pieces.append(_escape(literal))
        if field is None:
            continue
        if field not in ("context", "question") or spec or conversion:
            raise ValueError(
                f"template takes the fields {{context}} and {{question}} only, got {{{field}}}; "
                "write other braces doubled ({{ and }})."
            )
        seen.append(field)
        pieces.append(context if field == "context" else _escape(question))
    if sorted(seen) != ["context", "question"]:
        raise ValueError(f"template must hold {{context}} and {{question}} once each, got {template!r}.")
    return "".join(pieces)
