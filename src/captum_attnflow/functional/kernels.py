"""Where a kernel runs and how large its blocks are: the rules by which the library picks its
Triton kernels and sizes its blocks of work for a device."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

import torch


def gpu_kernels(device: torch.device, module: str) -> ModuleType | None:
    """The Triton kernel module ``module`` (e.g. ``"captum_attnflow.capture.lean_triton"``) where its
    kernels run, a CUDA device with Triton installed (it ships with torch's CUDA builds); None
    elsewhere, where the caller computes the same with torch operations (or its CPU kernel)."""
    if device.type != "cuda" or importlib.util.find_spec("triton") is None:
        return None
    return importlib.import_module(module)


# On a GPU a block of work takes up to this share of the memory free when it starts: a layer is
# then a few large launches (thousands of small ones leave the device idle between them).
_GPU_FREE_SHARE = 8


def block_bytes(device: torch.device, cpu_bytes: int, gpu_bytes: int) -> int:
    """Bytes one block of work may take on ``device``: ``cpu_bytes`` on the CPU (sized for its
    caches); on a GPU an eighth of the memory free now, at least ``cpu_bytes`` and at most
    ``gpu_bytes``."""
    if device.type != "cuda":
        return cpu_bytes
    free, _ = torch.cuda.mem_get_info(device)
    return max(cpu_bytes, min(free // _GPU_FREE_SHARE, gpu_bytes))
