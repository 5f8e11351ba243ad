"""Shared fixtures; the helpers they build on are in ``helpers.py``."""

from __future__ import annotations

import pytest

from helpers import CONFIGS, make_tiny_model


@pytest.fixture(params=sorted(CONFIGS))
def arch(request) -> str:
    return request.param


@pytest.fixture
def tiny_model_factory():
    return make_tiny_model
