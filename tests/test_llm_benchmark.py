"""benchmarks/llm.py builds every path it measures and each runs: on a tiny GPT-2, in this process."""

from __future__ import annotations

import runpy
from pathlib import Path

import torch
import transformers

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "llm.py"


def test_every_path_of_the_llm_benchmark_runs_on_a_tiny_model():
    script = runpy.run_path(str(SCRIPT), run_name="llm_benchmark")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=40, n_embd=16, n_head=2, n_layer=2, n_positions=32)
    model = transformers.GPT2LMHeadModel(config).eval()
    tokenizer = script["word_tokenizer"](config.vocab_size)
    prompt, target = " ".join(f"t{i}" for i in range(5, 13)), torch.tensor([7, 9])
    for path in ["forward", "captum", *script["METHODS"]]:
        script["explainer"](path, model, tokenizer)(prompt, target)
