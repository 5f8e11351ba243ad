"""The Triton kernels compile for an H100 (sm_90) as the wrappers launch them: Triton's compiler
and ptxas need no GPU, and refuse code that the interpreter runs (tests/_triton_compile.py, in a
process without TRITON_INTERPRET)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the GPU kernels need triton (pip install triton, Linux x86-64)")

SCRIPT = Path(__file__).parent / "_triton_compile.py"


@pytest.mark.slow  # 30-90 s: 33 kernel variants through LLVM and ptxas
def test_every_kernel_variant_compiles_for_an_h100(tmp_path):
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    environment["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton 3.9's default, set to silence its warning
    environment["TRITON_CACHE_DIR"] = str(tmp_path)  # compiled now, not found in a cache
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=environment, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[-1] == "compiled 33"
    assert {line.split()[0] for line in lines[:-1]} == {
        "_row_statistics", "_fused_probabilities", "_fused_product", "_token_distances"
    }
