"""The site's equations as MathML, written at build time: pages read offline need no script and no
network to show them.

Three sources of LaTeX reach the pages:

* the Markdown pages, where ``pymdownx.arithmatex`` (generic mode) keeps ``$...$``, ``\\(...\\)``
  and ``$$...$$`` away from Markdown and wraps them in ``<span class="arithmatex">`` or
  ``<div class="arithmatex">``;
* the docstrings of the API reference, written with reStructuredText's ``:math:`...``` role and
  ``.. math::`` directive: :class:`RstMath` (a Griffe extension, ``extensions:`` of mkdocstrings
  in mkdocs.yml) rewrites them to arithmatex's syntax before the docstring is rendered;
* the tutorials' Markdown cells (mkdocs-jupyter), where nbconvert leaves ``$...$`` and
  ``$$...$$`` in the text.

:func:`on_page_content` (``hooks:`` in mkdocs.yml) then converts each to MathML with
``latex2mathml``; browsers lay MathML out themselves (MathML Core: Chromium 109, Firefox, Safari).
A formula latex2mathml cannot read, or with a command it does not know, fails the build, naming
the page.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

_ARITHMATEX = re.compile(r'<(?P<tag>span|div) class="arithmatex">(?P<tex>.*?)</(?P=tag)>', re.S)
_DELIMITERS = {"\\(": "\\)", "\\[": "\\]", "$$": "$$", "$": "$"}
# In a tutorial's page: scripts and styles are skipped whole, tags are kept as they are, and only
# the text of Markdown cells, outside code, is searched for dollars.
_HTML_PIECE = re.compile(r"<script\b.*?</script>|<style\b.*?</style>|<!--.*?-->|<[^>]+>", re.S | re.I)
_DOLLARS = re.compile(r"\$\$(?P<block>.+?)\$\$|(?<![\\$])\$(?P<inline>[^$\s](?:[^$]*?[^$\s])?)\$", re.S)
_ROLE = re.compile(r":math:`(?P<tex>[^`]+)`")
_DIRECTIVE = re.compile(r"^(?P<indent>[ \t]*)\.\. math::[ \t]*(?P<rest>.*)$")
_UNKNOWN = re.compile(r">(\\[A-Za-z]+)")


class MathError(ValueError):
    """A formula that latex2mathml cannot convert."""


def mathml(tex: str, display: bool) -> str:
    """``tex`` as a ``<math>`` element, ``display="block"`` or ``"inline"``.

    Raises:
        MathError: latex2mathml cannot read it (the message names it).
    """
    from latex2mathml.converter import convert

    try:
        converted = convert(tex.strip(), display="block" if display else "inline")
    except Exception as error:  # latex2mathml raises its own exception types and plain ones
        raise MathError(f"cannot convert the formula {tex!r} to MathML: {error!r}") from error
    # A command latex2mathml does not know is kept as its name, which would show as raw LaTeX.
    if unknown := _UNKNOWN.findall(converted):
        raise MathError(f"cannot convert the formula {tex!r} to MathML: latex2mathml does not know {', '.join(unknown)}")
    return converted


def _arithmatex(match: re.Match) -> str:
    tex = html.unescape(match["tex"]).strip()
    opening = next(mark for mark in _DELIMITERS if tex.startswith(mark))
    return mathml(tex[len(opening):-len(_DELIMITERS[opening])], display=match["tag"] == "div")


def _dollars(text: str) -> str:
    def convert(match: re.Match) -> str:
        block = match["block"] is not None
        return mathml(html.unescape(match["block"] if block else match["inline"]), display=block)

    return _DOLLARS.sub(convert, text)


def notebook_math(page_html: str) -> str:
    """The ``$...$`` and ``$$...$$`` of a tutorial's Markdown cells as MathML; code, scripts,
    styles and outputs are left as they are."""
    out, cursor, depth, skip = [], 0, 0, 0
    for piece in _HTML_PIECE.finditer(page_html):
        text = page_html[cursor:piece.start()]
        out.append(_dollars(text) if depth and not skip else text)
        tag = piece.group()
        name = re.match(r"</?([a-zA-Z0-9]+)", tag)
        name = name.group(1).lower() if name else ""
        closing = tag.startswith("</")
        if name == "div" and depth:
            depth += -1 if closing else 1
        elif name == "div" and "jp-RenderedMarkdown" in tag:
            depth = 1
        elif name in ("code", "pre") and depth:
            skip += -1 if closing else 1
        out.append(tag)
        cursor = piece.end()
    out.append(page_html[cursor:])
    return "".join(out)


def on_page_content(html_: str, page: Any, **kwargs: Any) -> str:
    """Every formula of a page as MathML (arithmatex's, and the tutorials' dollars)."""
    try:
        converted = _ARITHMATEX.sub(_arithmatex, html_)
        if page.file.src_uri.endswith(".ipynb"):
            converted = notebook_math(converted)
    except MathError as error:
        raise MathError(f"{page.file.src_uri}: {error}") from error
    return converted


def rst_math(text: str) -> str:
    """reStructuredText's ``:math:`...``` and ``.. math::`` in a docstring as arithmatex's
    ``\\(...\\)`` and ``$$`` blocks (kept at the directive's indentation, blank lines around)."""
    text = _ROLE.sub(lambda match: f"\\({match['tex']}\\)", text)
    lines, out, index = text.split("\n"), [], 0
    while index < len(lines):
        directive = _DIRECTIVE.match(lines[index])
        if directive is None:
            out.append(lines[index])
            index += 1
            continue
        indent = directive["indent"]
        body = [directive["rest"]] if directive["rest"].strip() else []
        index += 1
        while index < len(lines) and (not lines[index].strip() or len(lines[index]) - len(lines[index].lstrip()) > len(indent)):
            body.append(lines[index].strip())
            index += 1
        formula = " ".join(line for line in body if line)
        out += ["", f"{indent}$$", f"{indent}{formula}", f"{indent}$$", ""]
    return "\n".join(out)


class RstMath(griffe.Extension):
    """Griffe extension: the docstrings' reStructuredText maths in arithmatex's syntax, so that
    the API reference shows equations (see :func:`rst_math`)."""

    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        if not obj.is_alias and obj.docstring is not None:
            obj.docstring.value = rst_math(obj.docstring.value)
