"""Which device a name means, checked against what this torch can use.

It needs torch alone (no transformers, Captum or matplotlib), and torch only once the name is
known, so that the command line refuses a misspelt device at once and one the machine does not
have before a command imports what it runs; :func:`~captum_attnflow.hf.placement.load_pretrained`
places models through it.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device ``device`` names, checked against what this torch can use.

    Args:
        device: ``"cpu"`` (or None), ``"cuda"``, ``"cuda:N"``, ``"mps"``, a
            :class:`torch.device`, or ``"auto"``: the first CUDA device when torch sees one,
            else the CPU. ``"auto"`` and ``"cuda"`` mean ``cuda:LOCAL_RANK`` in a process
            started by ``accelerate launch`` or ``torchrun`` (one GPU per process).

    Raises:
        ValueError: an unknown name, or a CUDA / MPS device this machine or this build of
            torch does not have; the message names the devices there are.

    Example::

        >>> import torch
        >>> resolve_device("cpu")
        device(type='cpu')
        >>> resolve_device("auto") == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
        True
    """
    unknown = f"unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps."
    if isinstance(device, str) and not _DEVICE.fullmatch(device):
        raise ValueError(unknown)
    import torch

    if device is None:
        return torch.device("cpu")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not isinstance(device, torch.device):
        if not isinstance(device, str):
            raise ValueError(unknown)
        device = torch.device(device)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise ValueError(
                f"device {str(device)!r}: torch sees no CUDA device (torch {torch.__version__}, {build}); "
                "use device 'cpu', or install the CUDA build of torch on a machine with an NVIDIA GPU."
            )
        index = int(os.environ.get("LOCAL_RANK", 0)) if device.index is None else device.index
        if index >= count:
            raise ValueError(f"device {str(device)!r}: torch sees {count} CUDA device(s), cuda:0..cuda:{count - 1} (asked for cuda:{index}).")
        return torch.device("cuda", index)
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device 'mps': this machine or this build of torch has no MPS (Apple GPU) backend; use 'cpu'.")
    return device
