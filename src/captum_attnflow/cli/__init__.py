"""The ``captum-attnflow`` command: explain a sentence, draw the paper's figures, reproduce its tables.

``captum-attnflow explain "the keys to the cabinet"`` prints the model's prediction and
per-token scores and writes a layers x tokens heatmap; ``captum-attnflow figures`` draws the
paper's Figure 1 (raw attention, rollout and flow of every position at every layer) and
Figures 2-3 (the CLS token over layers) for a sentence; ``captum-attnflow reproduce`` computes
Tables 1 and 2 of Abnar & Zuidema (2020) (see :mod:`captum_attnflow.reproduce`). They run on
the verb-number model that ships with the package or on another (``--model NAME_OR_DIR``: a
directory saved with ``save_pretrained``, or a Hub name already in the local Hugging Face
cache, read offline): an agreement model, or for ``explain`` and ``figures`` any Hugging Face
sequence-classification model with its tokenizer. ``captum-attnflow generate`` explains a
language model's continuation of a prompt; ``captum-attnflow adversarial`` runs the
adversarial-attention study (see :mod:`captum_attnflow.adversarial.study`). Every command that
loads a model takes ``--device auto|cpu|cuda|cuda:N|mps`` (auto, the default: the first CUDA
device when there is one), ``--dtype auto|float32|bfloat16|float16`` and ``--device-map`` (a
model spread over several devices by accelerate).

Building the parser imports no torch, transformers or Captum (``--help`` answers at once); each
command imports what it runs when it runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from captum_attnflow.cli import _common as common
from captum_attnflow.cli import adversarial, benchmark, cite, explain, figures, generate, reproduce

# The commands in the order ``--help`` lists them. Each module declares its command: ``HELP``
# and ``DESCRIPTION`` (its line in the list and its own ``--help``), ``add_arguments(parser)``
# and ``run(args)``; the sub-parser is named after the module.
COMMANDS = (explain, figures, reproduce, generate, cite, adversarial, benchmark)


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
        if hasattr(args, "device"):
            common.check_placement(args)
        return args.run(args)
    except (ValueError, TypeError, OSError) as error:
        print(f"captum-attnflow {args.command}: error: {error}", file=sys.stderr)
        return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="captum-attnflow",
        description="Attention rollout and attention flow (Abnar & Zuidema, ACL 2020) and the other attention "
        "attributions, on the bundled models or on yours: every command that explains a model takes "
        "--model NAME_OR_DIR.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        name = command.__name__.rpartition(".")[2]
        subparser = commands.add_parser(name, help=command.HELP, description=command.DESCRIPTION)
        command.add_arguments(subparser)
        subparser.set_defaults(run=command.run)
    return parser

