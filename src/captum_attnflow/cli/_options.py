"""Options that several ``captum-attnflow`` commands declare, each defined once: its flag, type,
metavar and default live here, while the help text, which says what the option means for that
command, is the command's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from captum_attnflow.methods import attention_methods, paper_methods

# How --words merges the sub-word pieces of a word; the bare flag means the first.
WORD_MERGES = ("sum", "max", "mean")


def add_model(parser: Any, help: str) -> None:
    """``--model DIR``: a saved model directory instead of the bundled one (None when not given)."""
    parser.add_argument("--model", type=Path, metavar="DIR", help=help)


def add_output_directory(parser: Any, default: Path) -> None:
    """``--out DIR``: the directory a command writes its several files into."""
    parser.add_argument("--out", type=Path, default=default, metavar="DIR", help=f"output directory (default: {default})")


def add_html(parser: Any, help: str) -> None:
    """``--html FILE.html``: also write the self-contained HTML view there."""
    parser.add_argument("--html", type=Path, metavar="FILE.html", help=help)


def add_words(parser: Any, help: str) -> None:
    """``--words [sum|max|mean]``: one score per word, its pieces merged (``sum`` for the bare flag)."""
    parser.add_argument(
        "--words", choices=WORD_MERGES, nargs="?", const=WORD_MERGES[0], default=None, metavar="|".join(WORD_MERGES),
        help=help,
    )


def add_attention_methods(parser: Any, purpose: str, default_note: str = "") -> None:
    """``--methods NAME ...``: per-layer methods, the paper's three by default; the help names
    the ``purpose`` of the methods, the defaults (after ``default_note``) and the choices."""
    parser.add_argument(
        "--methods", nargs="+", choices=attention_methods(), default=paper_methods(), metavar="NAME",
        help=f"per-layer methods {purpose} (default: {default_note}{' '.join(paper_methods())}; "
        f"any of {', '.join(attention_methods())})",
    )


def add_seed(parser: Any, seeded: str) -> None:
    """``--seed``: an integer seed (default 0) of what ``seeded`` names."""
    parser.add_argument("--seed", type=int, default=0, help=f"seed of {seeded} (default: 0)")


def add_no_progress(parser: Any, bars: str = "bars") -> None:
    """``--no-progress``: hide the progress ``bars`` (or ``"bar"``)."""
    parser.add_argument("--no-progress", action="store_true", help=f"hide the progress {bars}")
