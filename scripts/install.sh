#!/usr/bin/env bash
# Install captum_attnflow with its dev extra into the current Python environment.
# torch is pinned first: an unpinned torch requirement resolves to a 5 GB CUDA build,
# while torch==2.13.0 on this index is the CPU build (pip keeps an installed torch).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".[dev]"
# Compile the numba CPU kernels into their on-disk cache once (about a minute): otherwise the first
# call of flow or ALTI in every new process, each test worker and tutorial included, compiles them.
python -m captum_attnflow.functional.precompile
