"""Where a kernel runs: the one rule by which the library picks its Triton kernels."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

import torch


def gpu_kernels(device: torch.device, module: str) -> ModuleType | None:
    """The Triton kernel module ``module`` (e.g. ``"captum_attnflow.hf.lean_triton"``) where its
    kernels run, a CUDA device with Triton installed (it ships with torch's CUDA builds); None
    elsewhere, where the caller computes the same with torch operations (or its CPU kernel)."""
    if device.type != "cuda" or importlib.util.find_spec("triton") is None:
        return None
    return importlib.import_module(module)
