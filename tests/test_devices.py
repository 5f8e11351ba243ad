"""Device names: checked, devices this torch cannot use refused with the fix, ``auto`` and
``cuda`` meaning each launched process's own GPU."""

from __future__ import annotations

import pytest
import torch

from captum_attnflow.devices import resolve_device

NO_CUDA = not torch.cuda.is_available()


def test_device_names():
    assert resolve_device(None) == resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    assert resolve_device("auto") == (torch.device("cpu") if NO_CUDA else torch.device("cuda", 0))
    for bad in ("gpu", "cuda:x", "CPU", "cuda:0:1", 0):
        with pytest.raises(ValueError, match="unknown device .* use auto, cpu, cuda, cuda:N or mps"):
            resolve_device(bad)


@pytest.mark.skipif(not NO_CUDA, reason="checks the error of a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda", 0)])
def test_cuda_without_cuda_is_refused_with_the_fix(device):
    with pytest.raises(ValueError, match="torch sees no CUDA device .* use device 'cpu'"):
        resolve_device(device)


def test_each_process_of_a_launch_takes_its_own_gpu(monkeypatch):
    """``auto`` and ``cuda`` mean ``cuda:LOCAL_RANK`` (a pretended machine with two GPUs)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)  # a device named in full stays
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(ValueError, match=r"torch sees 2 CUDA device\(s\), cuda:0..cuda:1 \(asked for cuda:2\)"):
        resolve_device("auto")
