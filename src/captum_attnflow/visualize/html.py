"""Token attributions as a self-contained HTML page: inline CSS and script, nothing fetched.

Each section (a method, or the output tokens of a generated text) is a table: one row per
layer, method or output token, one cell per token, coloured on a diverging scale (red above 0,
blue below, white at 0; the scale symmetric, ``max |score|`` of the section at full colour),
the value in the cell's hover text (``title``) and in a read-out line under the table. A legend
shows the scale with its numbers: from 0 (white) to the largest score (red) for a section
without a negative score (raw attention, rollout, flow), from ``-max`` (blue) to ``max`` (red)
otherwise. The prediction is printed above. A section's columns may form groups, each in its
own colours on the section's one scale, apart by a gap (an encoder-decoder's source tokens in
red, its target prefix in green: :data:`PALETTES`). The page works offline, in
a notebook (``_repr_html_`` of the result objects) and in any browser.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import math
from typing import Any, NamedTuple, Sequence

import numpy as np

# The diverging scale's ends (matplotlib's tab:red and tab:blue) and its middle.
POSITIVE = (214, 39, 40)
NEGATIVE = (31, 119, 180)
# The (positive, negative) ends of each group of columns, in order: the first group's are the
# scale above; the second's matplotlib's tab:green and tab:purple.
PALETTES = ((POSITIVE, NEGATIVE), ((44, 160, 44), (148, 103, 189)))
_ids = itertools.count()

_STYLE = """
.caf-view{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;font-size:14px;color:#222;margin:8px 0}
.caf-view h2{font-size:17px;margin:4px 0}.caf-view h3{font-size:15px;margin:14px 0 4px}
.caf-view .caf-prediction{margin:2px 0 8px;color:#444}
.caf-view table{border-collapse:separate;border-spacing:2px}
.caf-view td{padding:3px 5px;border-radius:3px;white-space:pre;text-align:center;cursor:default}
.caf-view th{font-weight:normal;color:#555;text-align:right;padding-right:8px;white-space:pre}
.caf-view td.caf-cell:hover{outline:2px solid #222}
.caf-view .caf-legend{display:flex;align-items:center;gap:6px;font-size:12px;color:#555;margin:4px 0}
.caf-view .caf-bar{width:180px;height:12px;border:1px solid #ccc}
.caf-view .caf-readout{font-size:12px;color:#333;min-height:16px;font-family:monospace}
.caf-view .caf-unit{font-size:12px;color:#777}
.caf-view td.caf-gap{width:10px;padding:0}
"""

_SCRIPT = """
(function(){var root=document.getElementById('%s');if(!root)return;
root.querySelectorAll('td.caf-cell').forEach(function(cell){cell.addEventListener('mouseenter',function(){
var out=cell.closest('.caf-section').querySelector('.caf-readout');
out.textContent=cell.dataset.row+' \\u00b7 '+cell.dataset.token+': '+cell.dataset.score;});});
root.setAttribute('data-ready','1');})();
"""


class Section(NamedTuple):
    """One table of the view.

    Attributes:
        name: its heading (a method's name).
        rows: the row labels (layers, methods, output tokens), R of them.
        tokens: the column labels, the n tokens.
        scores: (R, n) values.
        unit: what the values are (e.g. "rollout score"), printed beside the legend.
        groups: ``(name, count)`` of each group of columns in order, their counts summing to n,
            each group in the colours of :data:`PALETTES` (e.g. ``(("source", 6), ("target
            prefix", 3))``); empty (default): one group.
    """

    name: str
    rows: Sequence[str]
    tokens: Sequence[str]
    scores: Any
    unit: str = ""
    groups: Sequence[tuple[str, int]] = ()


def colour(value: float, scale: float, palette: tuple[tuple[int, int, int], tuple[int, int, int]] = PALETTES[0]) -> tuple[int, int, int]:
    """The RGB colour of ``value`` on the diverging scale reaching full colour at ``±scale``, its
    ends the ``(positive, negative)`` colours of ``palette``.

    Example::

        >>> colour(0.0, 1.0), colour(1.0, 1.0), colour(-2.0, 1.0), colour(1.0, 1.0, PALETTES[1])
        ((255, 255, 255), (214, 39, 40), (31, 119, 180), (44, 160, 44))
    """
    if not math.isfinite(value) or scale <= 0:
        return (255, 255, 255)
    share = min(abs(value) / scale, 1.0)
    end = palette[0] if value > 0 else palette[1]
    return tuple(round(255 + share * (channel - 255)) for channel in end)  # type: ignore[return-value]


def attribution_html(
    sections: Sequence[Section], title: str = "", prediction: str = "", full_page: bool = False
) -> str:
    """The HTML of a view of token attributions (see the module docstring).

    Args:
        sections: the tables, each with its own colour scale.
        title: the heading.
        prediction: a line under the heading (the model's prediction, the generated text).
        full_page: a whole document (``<!DOCTYPE html>...``) rather than a fragment for a
            notebook or a report.

    Returns:
        str: the HTML, with one ``<td class="caf-cell">`` per token and row carrying
        ``data-score`` (the value), ``data-row``, ``data-token`` and ``title``
        ("token: value").

    Example::

        >>> page = attribution_html([Section("rollout", ["L1"], ["the", "keys"], [[0.25, 0.75]])], "demo")
        >>> page.count('class="caf-cell"'), 'title="keys: 0.7500"' in page
        (2, True)
    """
    identifier = f"caf-view-{next(_ids)}"
    parts = [f'<div class="caf-view" id="{identifier}"><style>{_STYLE}</style>']
    if title:
        parts.append(f"<h2>{html.escape(title)}</h2>")
    if prediction:
        parts.append(f'<div class="caf-prediction">{html.escape(prediction)}</div>')
    for section in sections:
        parts.append(_section(section))
    parts.append(f"<script>{_SCRIPT % identifier}</script></div>")
    fragment = "".join(parts)
    if not full_page:
        return fragment
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title or 'captum_attnflow')}</title></head><body>{fragment}</body></html>"
    )


def figure_png(figure: Any, dpi: int = 100) -> bytes:
    """A matplotlib figure drawn once as PNG bytes (to write to a file and embed in a page alike)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def png_html(png: bytes, caption: str = "") -> str:
    """PNG bytes as an inline base64 ``<figure>`` with ``caption`` (no file, no fetch)."""
    data = base64.b64encode(png).decode()
    text = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    return f'<figure style="margin:8px 0"><img alt="{html.escape(caption)}" style="max-width:100%" src="data:image/png;base64,{data}">{text}</figure>'


def page_html(title: str, blocks: Sequence[str]) -> str:
    """A whole document from HTML fragments (figures, views, markdown-free text)."""
    body = "".join(blocks)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>body{{font-family:system-ui,sans-serif;max-width:1240px;"
        f"margin:16px auto;padding:0 12px}}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>"
    )


def _section(section: Section) -> str:
    values = np.asarray(section.scores, dtype=np.float64).reshape(len(section.rows), -1)
    if values.shape[1] != len(section.tokens):
        raise ValueError(
            f"section {section.name!r}: scores have {values.shape[1]} columns for {len(section.tokens)} tokens; "
            "pass one score per token in each row."
        )
    groups = list(section.groups) or [("", len(section.tokens))]
    if sum(count for _, count in groups) != len(section.tokens) or len(groups) > len(PALETTES):
        raise ValueError(
            f"section {section.name!r}: groups {groups} must count its {len(section.tokens)} tokens in at most "
            f"{len(PALETTES)} groups."
        )
    group_of = [g for g, (_, count) in enumerate(groups) for _ in range(count)]
    finite = values[np.isfinite(values)]
    scale = float(np.abs(finite).max()) if finite.size else 0.0
    lines = [f'<div class="caf-section" data-name="{html.escape(section.name)}">']
    if section.name:
        lines.append(f"<h3>{html.escape(section.name)}</h3>")
    lines.append("<table>")
    for label, row in zip(section.rows, values):
        cells = []
        for k, (token, value) in enumerate(zip(section.tokens, row)):
            if k and group_of[k] != group_of[k - 1]:
                cells.append('<td class="caf-gap"></td>')
            red, green, blue = colour(float(value), scale, PALETTES[group_of[k]])
            ink = "#fff" if scale > 0 and abs(value) / scale > 0.6 else "#111"
            shown = html.escape(str(token))
            value = float(value)
            number = f"{value:.4f}"
            kind = f' data-group="{html.escape(groups[group_of[k]][0])}"' if section.groups else ""
            cells.append(
                f'<td class="caf-cell" style="background-color:rgb({red},{green},{blue});color:{ink}" '
                f'data-score="{value!r}" data-row="{html.escape(str(label))}" data-token="{shown}" '
                f'title="{shown}: {number}"{kind}>{shown}</td>'
            )
        lines.append(f"<tr><th>{html.escape(str(label))}</th>{''.join(cells)}</tr>")
    lines.append("</table>")
    low = -scale if (finite < 0).any() else 0.0  # a legend reaching below 0 only for scores that do
    unit = f'<span class="caf-unit">{html.escape(section.unit)}</span>' if section.unit else ""
    bars = []
    for (name, _), palette in zip(groups, PALETTES):
        stops = [colour(value, scale, palette) for value in ((low, 0.0, scale) if low < 0 else (0.0, scale))]
        gradient = f"linear-gradient(to right, {', '.join(f'rgb{stop}' for stop in stops)})"
        shown = f"<span>{html.escape(name)}</span>" if name else ""
        bars.append(f'{shown}<span>{low:.3g}</span><span class="caf-bar" style="background:{gradient}"></span>'
                    f"<span>{scale:.3g}</span>")
    lines.append(f'<div class="caf-legend">{"".join(bars)}{unit}</div>')
    lines.append('<div class="caf-readout">hover over a token to read its score</div></div>')
    return "".join(lines)
