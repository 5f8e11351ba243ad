"""The benchmark scripts answer ``--help`` at once: they parse their arguments before they import
torch, transformers, numba or Captum."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"
# flow.py and lxt_agreement.py import torch, networkx and scipy at module level (a table of the
# networkx solvers, a torch.autograd.Function of their own) and are not held to this.
LIGHT = ("gpu.py", "rollout.py", "generation.py", "internals.py", "llm.py", "memory.py", "context.py")


def test_help_imports_nothing_heavy():
    script = (
        "import runpy, sys\n"
        "for path in sys.argv[1:]:\n"
        "    sys.argv = [path, '--help']\n"
        "    try:\n"
        "        runpy.run_path(path, run_name='__main__')\n"
        "    except SystemExit as done:\n"
        "        assert done.code == 0, path\n"
        "print(sorted(name for name in ('torch', 'transformers', 'numba', 'captum', 'captum_attnflow') if name in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, *(str(BENCHMARKS / name) for name in LIGHT)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("usage: ") == len(LIGHT)
    assert done.stdout.splitlines()[-1] == "[]"
