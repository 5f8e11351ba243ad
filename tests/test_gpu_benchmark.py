"""benchmarks/gpu.py runs: every row of its tables at tiny sizes (on the CPU without a GPU), none failing."""

from __future__ import annotations

import importlib.util
import os
import runpy
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu.py"
ROWS = ("sdpa forward", "forward + backward", "rollout, every layer (lean)", "gradient-weighted rollout, every layer",
        "AttnLRP", "ALTI, every layer", "attention norms", "value zeroing, every layer", "forward",
        "lean rollout of the last position", "captum", "gradient-weighted rollout (LLM wrapper)")
# one layer's kernels: with Triton's interpreter on the CPU (tests/conftest.py), as on a GPU
KERNEL_ROWS = ("sdpa", "row statistics (pass 1)", "row product of 16 vectors (pass 2)",
               "fused probabilities written (both passes)")


@pytest.mark.slow  # the whole script end to end (30 s on 2 cores); its pieces have tests of their own
def test_gpu_benchmark_prints_every_row_of_both_tables(capsys):
    runpy.run_path(str(SCRIPT), run_name="gpu_benchmark")["main"](["--smoke", "--bert", "12", "--llama", "12"])
    lines = capsys.readouterr().out.splitlines()
    assert not [line for line in lines if "failed" in line]
    measured = {line[:44].strip() for line in lines if line.rstrip().endswith(("-", " G", "x"))}
    kernels = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton")
    assert measured == set(ROWS) | (set(KERNEL_ROWS) if kernels else set())
