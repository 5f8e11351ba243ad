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

# The tiny families of helpers.CONFIGS that every ``arch`` test runs on, named rather than imported:
# pytest-xdist's controller loads this file too, and importing helpers (transformers' models and
# the package) would keep it, and the test command, busy for about 9 s before a worker starts.
ARCHS = ("bert", "distilbert", "gpt2", "llama", "roberta")


@pytest.fixture(params=ARCHS)
def arch(request) -> str:
    from helpers import CONFIGS

    assert set(CONFIGS) == set(ARCHS), "name every tiny family of helpers.CONFIGS in ARCHS"
    return request.param


@pytest.fixture
def tiny_model_factory():
    from helpers import make_tiny_model

    return make_tiny_model
