"""One Evaluator run, shared by test_evaluator.py and its ``accelerate launch`` check.

Launched as ``accelerate launch --multi_gpu --num_processes 2 _evaluate_distributed.py OUT``, every
process writes the result it got to ``OUT/result<rank>.npz`` and how many batches it evaluated
to ``OUT/batches<rank>.txt``; the checkpoint goes to ``OUT/checkpoint.npz``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from _classifier import UNK, make_classifier, padded_batch  # noqa: E402
from captum_attnflow import AttentionRollout, RawAttention  # noqa: E402
from captum_attnflow.baselines import BlankOut, TokenSaliency  # noqa: E402
from captum_attnflow.evaluate import Evaluator  # noqa: E402

NUM_BATCHES = 5


def make_batches(num_batches: int = NUM_BATCHES) -> list[dict]:
    """Right-padded batches of 4 examples with labels, each batch padded differently."""
    batches = []
    for seed in range(num_batches):
        ids, mask = padded_batch(seed=seed)
        labels = torch.randint(0, 3, (ids.shape[0],), generator=torch.Generator().manual_seed(100 + seed))
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return batches


def make_evaluator(model: torch.nn.Module, calls: list) -> Evaluator:
    """Raw attention and rollout per layer, and a position baseline (a callable that counts its calls),
    against blank-out and input gradients."""

    def first_tokens_first(batch: dict) -> torch.Tensor:
        calls.append(batch["input_ids"].shape[0])
        return -torch.arange(batch["input_ids"].shape[1], dtype=torch.float32).expand(batch["input_ids"].shape)

    return Evaluator(
        model,
        {"raw": RawAttention, "rollout": AttentionRollout(model), "position": first_tokens_first},
        {"blank-out": BlankOut(model, token=UNK), "grad": TokenSaliency(model)},
        show_progress=False,
    )


def main(out: Path) -> None:
    torch.set_num_threads(1)
    calls: list = []
    result = make_evaluator(make_classifier(), calls).run(make_batches(), checkpoint=out / "checkpoint.npz", save_every=1)
    rank = os.environ["RANK"]
    result.save(out / f"result{rank}.npz")
    (out / f"batches{rank}.txt").write_text(str(len(calls)))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
