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

from pathlib import Path
from typing import Any

import torch

from captum_attnflow.devices import resolve_device

# The weight dtypes a model can be loaded in, by the names the command line takes.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# accelerate's strategies for spreading a model over the devices it sees.
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


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
        device: where the whole model goes, see :func:`~captum_attnflow.devices.resolve_device`
            (None: the CPU).
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
