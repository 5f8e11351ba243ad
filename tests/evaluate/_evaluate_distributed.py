"""One Evaluator run under ``accelerate launch``, checked by test_evaluator.py.

Launched as ``accelerate launch --multi_gpu --num_processes 2 _evaluate_distributed.py OUT``, every
process writes the result it got to ``OUT/result<rank>.npz`` and how many batches it evaluated
to ``OUT/batches<rank>.txt``; the checkpoint goes to ``OUT/checkpoint.npz``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, where helpers.py is

from helpers import DISTRIBUTED_FAITHFULNESS, make_batches, make_classifier, make_evaluator  # noqa: E402


def main(out: Path) -> None:
    torch.set_num_threads(1)
    calls: list = []
    evaluator = make_evaluator(make_classifier(), calls, faithfulness=DISTRIBUTED_FAITHFULNESS)
    result = evaluator.run(make_batches(), checkpoint=out / "checkpoint.npz", save_every=1)
    rank = os.environ["RANK"]
    result.save(out / f"result{rank}.npz")
    (out / f"batches{rank}.txt").write_text(str(len(calls)))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
