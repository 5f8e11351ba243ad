"""``captum-attnflow adversarial``: the adversarial-attention study (see
:mod:`captum_attnflow.adversarial.study`)."""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path

from captum_attnflow.cli import _choices as choices
from captum_attnflow.cli import _common as common
from captum_attnflow.cli import _options as options

DEFAULT_ADVERSARIAL_DIR = Path("captum_attnflow_adversarial")

HELP = "is attention the only path? adversarial attention, probing and what it means for rollout and flow"
DESCRIPTION = (
    "Train chunk taggers and adversaries of them and of the bundled agreement classifier (Yang; Wiegreffe & "
    "Pinter 2019): per model the score, the JSD and KL of its attention to the original per layer and the TVD "
    "of its predictions, beside another seed and uniform attention; per-instance adversarial attention (Jain & "
    "Wallace 2019); probing classifiers; the Spearman correlation of raw attention, rollout and flow across "
    "models and with blank-out. Writes markdown, CSV files and the TVD-vs-JSD plot to DIR."
)


def add_arguments(adversarial: argparse.ArgumentParser) -> None:
    """The arguments of ``adversarial``; those named after a parameter of
    :func:`~captum_attnflow.adversarial.study.run_study` are passed on to it."""
    adversarial.add_argument(
        "--models", nargs="+", choices=choices.ADVERSARIAL_MODELS, default=list(choices.ADVERSARIAL_MODELS),
        help="originals to study: yang and deep chunk taggers, the agreement classifier (default: all)",
    )
    adversarial.add_argument(
        "--lambdas", nargs="+", type=float, default=list(choices.DEFAULT_LAMBDAS), metavar="LAMBDA",
        help="lambda grid of the global adversaries (default: %(default)s)",
    )
    adversarial.add_argument("--train-examples", type=common.positive, default=4096, help="generated training sentences (default: 4096)")
    adversarial.add_argument("--test-examples", type=common.positive, default=512, help="held-out sentences (default: 512)")
    adversarial.add_argument("--batch-size", type=common.positive, default=32, help="sentences per batch (default: 32)")
    adversarial.add_argument(
        "--train-steps", type=common.positive, default=150,
        help="steps of each model trained from scratch: originals, other seed, uniform, probes (default: 150)",
    )
    adversarial.add_argument("--adversary-steps", type=common.positive, default=80, help="steps of each adversary (default: 80)")
    adversarial.add_argument(
        "--agreement-steps", type=common.positive, default=600,
        help="steps of the agreement classifiers trained from scratch: other seed, uniform (default: 600)",
    )
    adversarial.add_argument(
        "--per-instance-examples", type=common.positive, default=32, help="examples of the per-instance adversary (default: 32)"
    )
    adversarial.add_argument(
        "--per-instance-steps", type=common.positive, default=100, help="optimisation steps of the per-instance adversary (default: 100)"
    )
    adversarial.add_argument("--epsilon", type=float, default=0.01, help="TVD bound of the per-instance adversary (default: 0.01)")
    options.add_seed(adversarial, "data, initialisation and order")
    adversarial.add_argument(
        "--threads", type=common.positive, default=1,
        help="torch CPU threads (default: 1; these small matrices gain little from more, and lose much on a busy machine)",
    )
    options.add_output_directory(adversarial, DEFAULT_ADVERSARIAL_DIR)
    options.add_no_progress(adversarial)


def run(args: argparse.Namespace) -> int:
    import torch

    from captum_attnflow.adversarial.study import run_study

    parameters = frozenset(inspect.signature(run_study).parameters) - {"progress"}
    study_options = {name: value for name, value in vars(args).items() if name in parameters}
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        result = run_study(**study_options, progress=not args.no_progress)
    finally:
        torch.set_num_threads(threads)
    print(result.to_markdown())
    paths = result.save(args.out)
    print("written: " + ", ".join(str(path) for path in paths))
    return 0
