"""Where and in which precision a model is loaded: one device, or accelerate's device map across
several, and the dtype of its weights.

:func:`load_pretrained` is the one place that turns the user's ``device``, ``dtype`` and
``device_map`` (the ``captum-attnflow`` options of the same names, or the keyword arguments of
the bundled models' loaders) into a ``from_pretrained`` call: names are checked before any
weight is read, a CUDA or MPS device that this torch cannot see is refused with the fix, and
``device="auto"`` takes the first CUDA device when there is one (None keeps the CPU, as
``from_pretrained`` does); under ``accelerate launch`` or ``torchrun``, ``"auto"`` and ``"cuda"``
take each process's own GPU (``LOCAL_RANK``), as transformers does. The methods then read the
model where it is: inputs go to :func:`~captum_attnflow.hf.input_device` (see
docs/large-models.md for models spread over several devices).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

# The weight dtypes a model can be loaded in, by the names the command line takes.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# accelerate's strategies for spreading a model over the devices it sees.
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
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

        >>> resolve_device("cpu")
        device(type='cpu')
        >>> resolve_device("auto") == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))
        True
    """
    if device is None:
        return torch.device("cpu")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not isinstance(device, torch.device):
        if not isinstance(device, str) or not _DEVICE.fullmatch(device):
            raise ValueError(f"unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps.")
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


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | str:
    """``from_pretrained``'s ``dtype``: a :class:`torch.dtype` from :data:`DTYPES` (given or by
    name), or ``"auto"`` (None or ``"auto"``): the dtype the checkpoint was saved in.

    Raises:
        ValueError: another name or dtype; the message lists the names taken.

    Example::

        >>> resolve_dtype("bfloat16"), resolve_dtype(None)
        (torch.bfloat16, 'auto')
    """
    if dtype is None or dtype == "auto":
        return "auto"
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"unknown dtype {dtype!r}; use auto (the checkpoint's), {', '.join(DTYPES)}.")


def load_pretrained(
    model_class: Any,
    path: str | Path,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    device_map: str | dict | None = None,
    **kwargs: Any,
) -> Any:
    """``model_class.from_pretrained(path, ...)`` in eval mode, placed and typed as asked.

    Args:
        model_class: a transformers model class (``AutoModelForCausalLM``, ``BertModel``, ...).
        path: the directory or hub name ``from_pretrained`` reads.
        device: where the whole model goes, see :func:`resolve_device` (None: the CPU).
        dtype: the dtype of its weights, see :func:`resolve_dtype` (None: the checkpoint's).
        device_map: instead of ``device``, accelerate's device map for a model larger than one
            device: one of :data:`DEVICE_MAPS` or a dict module name -> device (needs
            accelerate); inputs then go to :func:`~captum_attnflow.hf.input_device`.
        **kwargs: passed on to ``from_pretrained`` (e.g. ``local_files_only=True``).

    Raises:
        ValueError: an unknown device, dtype or device map, a device this torch cannot use, or
            both ``device`` and ``device_map`` given.

    Example::

        >>> from transformers import GPT2LMHeadModel
        >>> from captum_attnflow.models.language_model import ASSET_DIR
        >>> model = load_pretrained(GPT2LMHeadModel, ASSET_DIR, device="cpu", dtype="bfloat16")
        >>> model.device, model.dtype, model.training
        (device(type='cpu'), torch.bfloat16, False)
    """
    dtype = resolve_dtype(dtype)
    if device_map is not None:
        if device is not None:
            raise ValueError(
                f"device {str(device)!r} and device_map {device_map!r} both place the model: give one, "
                "device for one device, device_map to spread it over several."
            )
        if isinstance(device_map, str) and device_map not in DEVICE_MAPS:
            raise ValueError(f"unknown device_map {device_map!r}; use {', '.join(DEVICE_MAPS)} or a dict module name -> device.")
        return model_class.from_pretrained(path, dtype=dtype, device_map=device_map, **kwargs).eval()
    device = resolve_device(device)
    return model_class.from_pretrained(path, dtype=dtype, **kwargs).to(device).eval()
