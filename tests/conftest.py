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

from helpers import CONFIGS, make_tiny_model  # noqa: E402


@pytest.fixture(params=sorted(CONFIGS))
def arch(request) -> str:
    return request.param


@pytest.fixture
def tiny_model_factory():
    return make_tiny_model
