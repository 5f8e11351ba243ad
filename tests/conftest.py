"""Shared fixtures; the helpers they build on are in ``helpers.py``."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Without a GPU the Triton kernels are tested on CPU tensors through Triton's interpreter,
    # which must be on when triton is first imported (its own library functions are decorated
    # then; torch imports it with torch._dynamo, so before anything else is imported here).
    os.environ.setdefault("TRITON_INTERPRET", "1")

# pytest-xdist runs a worker process per core, and torch's default is a thread per core in each:
# on 2 cores, 2 workers would run 4 compute threads that wait on each other. One share of the
# cores per worker, for torch here and for the notebooks' kernels (they inherit OMP_NUM_THREADS).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _THREADS = str(max(1, len(os.sched_getaffinity(0)) // _WORKERS))
    os.environ["OMP_NUM_THREADS"] = _THREADS
    torch.set_num_threads(int(_THREADS))

from helpers import CONFIGS, make_tiny_model  # noqa: E402


@pytest.fixture(params=sorted(CONFIGS))
def arch(request) -> str:
    return request.param


@pytest.fixture
def tiny_model_factory():
    return make_tiny_model
