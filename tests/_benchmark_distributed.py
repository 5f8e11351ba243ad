"""``captum-attnflow benchmark --model DIR --data FILE`` under ``accelerate launch``, checked by
test_benchmark_user.py: ``accelerate launch --multi_gpu --num_processes 2 _benchmark_distributed.py
MODEL DATA OUT CHECKPOINTS``; process 0 writes the report to OUT, every process its values to
``OUT/values<rank>.json``."""

from __future__ import annotations

import json
import os
import sys

import torch

from captum_attnflow.benchmark import load_data, load_model, run_benchmark


def main(model_dir: str, data: str, out: str, checkpoints: str) -> None:
    torch.set_num_threads(1)
    model, tokenizer = load_model(model_dir)
    result = run_benchmark(model=model, tokenizer=tokenizer, dataset=load_data(data), methods=["rollout", "saliency", "random"],
                           batch_size=2, n_resamples=99, show_progress=False, checkpoint_dir=checkpoints)
    values = {" | ".join(map(str, key)): value.tolist() for key, value in result.leaderboard.values.items()}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"values{os.environ['RANK']}.json"), "w") as file:
        json.dump({"values": values, "examples": result.examples, "timed": sorted(result.seconds["data"])}, file)


if __name__ == "__main__":
    main(*sys.argv[1:5])
