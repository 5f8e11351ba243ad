"""Where kernels run and how large their blocks are, by device."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from captum_attnflow.functional.kernels import block_bytes, gpu_kernels
from captum_attnflow.functional.precompile import precompile


def test_blocks_keep_the_cpu_budget_and_take_a_share_of_the_gpus_free_memory(monkeypatch):
    assert block_bytes(torch.device("cpu"), 48 * 2**20, 2**30) == 48 * 2**20
    for free, expected in ((80 * 2**30, 2**30), (4 * 2**30, 2**29), (2**20, 48 * 2**20)):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, free=free: (free, 80 * 2**30))
        assert block_bytes(torch.device("cuda"), 48 * 2**20, 2**30) == expected


def test_triton_kernels_only_on_cuda():
    assert gpu_kernels(torch.device("cpu"), "captum_attnflow.capture.lean_triton") is None
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: no kernels on CUDA either")
    assert gpu_kernels(torch.device("cuda"), "captum_attnflow.capture.lean_triton").__name__ == "captum_attnflow.capture.lean_triton"



def test_precompile_runs_every_cpu_kernel_on_its_tiny_inputs():
    # scripts/install.sh runs it on a fresh install (compiling into numba's cache); here the
    # kernels are compiled already and the calls check that it still matches the functions.
    assert precompile() >= 0
