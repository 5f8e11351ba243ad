"""Options that several ``captum-attnflow`` commands declare, each defined once: its flag, type,
metavar and default live here, while the help text, which says what the option means for that
command, is the command's. Nothing here imports torch: ``--help`` stays instant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from captum_attnflow.cli._choices import ATTENTION_METHODS, DEVICE_MAPS, DTYPES, PAPER_METHODS

# How --words merges the sub-word pieces of a word; the bare flag means the first.
WORD_MERGES = ("sum", "max", "mean")


def add_model(parser: Any, help: str) -> None:
    """``--model NAME_OR_DIR``: a saved model directory, or a Hub name found in the local Hugging
    Face cache, instead of the bundled model (None when not given; see ``_common.model_directory``)."""
    parser.add_argument(
        "--model", metavar="NAME_OR_DIR",
        help=f"{help}; a directory saved with save_pretrained, or a Hub name (e.g. gpt2) already in the local "
        "Hugging Face cache, read offline",
    )


def add_placement(parser: Any) -> None:
    """``--device``, ``--dtype`` and ``--device-map``: where and in which precision the model is
    loaded (``hf.placement.load_pretrained``), for the bundled model as for the user's."""
    group = parser.add_argument_group("device and precision")
    group.add_argument(
        "--device", default="auto", metavar="auto|cpu|cuda|cuda:N|mps",
        help="where the model runs (default: auto, the first CUDA device when there is one, else the CPU)",
    )
    group.add_argument(
        "--dtype", choices=DTYPES, default="auto", metavar="|".join(DTYPES),
        help="the dtype of the model's weights (default: auto, the dtype it was saved in)",
    )
    group.add_argument(
        "--device-map", choices=DEVICE_MAPS, default=None, metavar="|".join(DEVICE_MAPS),
        help="instead of --device, spread a model larger than one device over the GPUs (then the CPU) with "
        "accelerate's device map (needs accelerate)",
    )


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
        "--methods", nargs="+", choices=ATTENTION_METHODS, default=PAPER_METHODS, metavar="NAME",
        help=f"per-layer methods {purpose} (default: {default_note}{' '.join(PAPER_METHODS)}; "
        f"any of {', '.join(ATTENTION_METHODS)})",
    )


def add_seed(parser: Any, seeded: str) -> None:
    """``--seed``: an integer seed (default 0) of what ``seeded`` names."""
    parser.add_argument("--seed", type=int, default=0, help=f"seed of {seeded} (default: 0)")


def add_no_progress(parser: Any, bars: str = "bars") -> None:
    """``--no-progress``: hide the progress ``bars`` (or ``"bar"``)."""
    parser.add_argument("--no-progress", action="store_true", help=f"hide the progress {bars}")
