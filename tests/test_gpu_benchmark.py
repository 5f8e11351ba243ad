"""benchmarks/gpu.py runs: every row of both tables at tiny sizes (on the CPU without a GPU), none failing."""

from __future__ import annotations

import runpy
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu.py"
ROWS = ("sdpa forward", "forward + backward", "rollout, every layer (lean)", "gradient-weighted rollout, every layer",
        "AttnLRP", "ALTI, every layer", "attention norms", "value zeroing, every layer", "forward",
        "lean rollout of the last position", "captum", "gradient-weighted rollout (LLM wrapper)")


def test_gpu_benchmark_prints_every_row_of_both_tables(capsys):
    runpy.run_path(str(SCRIPT), run_name="gpu_benchmark")["main"](["--smoke", "--bert", "12", "--llama", "12"])
    lines = capsys.readouterr().out.splitlines()
    assert not [line for line in lines if "failed" in line]
    measured = {line[:44].strip() for line in lines if line.rstrip().endswith(("-", " G", "x"))}
    assert measured == set(ROWS)
