"""Test-run settings shared by tests/ and tutorials/.

The test command runs on every core with pytest-xdist (``-n auto`` in pyproject.toml). The
models under test are tiny, so one worker per core with one math thread each is faster than
workers whose thread pools fight over the same cores; notebook kernels inherit the setting.
"""

import os

if "PYTEST_XDIST_WORKER" in os.environ:
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")
