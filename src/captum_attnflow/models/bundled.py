"""Loading the agreement model and tokenizer that ship inside the package (no network needed)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from transformers import PreTrainedTokenizerFast
from transformers.utils import logging as transformers_logging

from captum_attnflow.hf.placement import load_pretrained
from captum_attnflow.models.agreement import AgreementModel

ASSET_DIR = Path(__file__).resolve().parent.parent / "assets" / "agreement"


def load_agreement_model(
    directory: str | Path | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    device_map: str | dict | None = None,
) -> tuple[AgreementModel, PreTrainedTokenizerFast]:
    """The bundled trained verb-number model (eval mode, sdpa attention; CPU unless told) and its tokenizer.

    Trained with ``python -m captum_attnflow.models.train`` (defaults); the held-out accuracy
    measured then is in ``assets/agreement/eval_results.json``. Loads offline and without
    transformers' "Loading weights" progress bar (noise for a model of a few hundred kB).

    Args:
        directory: a checkpoint saved by the training command (``save_pretrained``) to load
            instead of the bundled one; None (default) loads the bundled model.
        device: where the model goes (``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"``, ``"auto"``
            for the first CUDA device when there is one); None (default) the CPU.
        dtype: ``"float32"``, ``"bfloat16"``, ``"float16"`` (or the torch dtype); None (default)
            the checkpoint's float32.
        device_map: accelerate's device map instead of ``device`` (``"auto"``, ...); see
            :func:`~captum_attnflow.hf.placement.load_pretrained`, which loads every model here.

    Returns:
        tuple: ``(model, tokenizer)``, an :class:`~captum_attnflow.models.AgreementModel`
        (6 layers, 8 heads, hidden size 128) and the word-level
        :class:`~transformers.PreTrainedTokenizerFast` that prepends ``[CLS]``.

    Raises:
        FileNotFoundError: the package was installed without its model files, or
            ``directory`` holds no saved model.
        ValueError: an unknown device or dtype, or a device this torch cannot use.

    Example:
        >>> model, tokenizer = load_agreement_model()
        >>> batch = tokenizer(["the keys to the cabinet"], return_tensors="pt")
        >>> model(**batch).logits.argmax(-1).item()  # 1: plural
        1
    """
    if directory is None and not (ASSET_DIR / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"the bundled agreement model is missing from {ASSET_DIR}; reinstall captum-attnflow, "
            "or train one with `python -m captum_attnflow.models.train --out DIR` and load it with "
            "load_agreement_model(DIR)."
        )
    if directory is not None and not (Path(directory) / "config.json").is_file():
        raise FileNotFoundError(
            f"{directory} holds no saved model (no config.json); pass a directory written by "
            "`python -m captum_attnflow.models.train --out DIR`, or None for the bundled model."
        )
    path = ASSET_DIR if directory is None else Path(directory)
    with no_loading_bar():
        model = load_pretrained(AgreementModel, path, device, dtype, device_map, local_files_only=True)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    return model, tokenizer


@contextmanager
def no_loading_bar() -> Iterator[None]:
    """Hide the "Loading weights" bar transformers draws on every ``from_pretrained``."""
    enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            transformers_logging.enable_progress_bar()


def load_checkpoint(
    model_class: Any, path: Path, what: str, training_module: str, **placement: Any
) -> tuple[Any, PreTrainedTokenizerFast]:
    """``(model in eval mode, tokenizer)`` saved in ``path``, without the loading bar, placed by
    ``placement`` (``device``, ``dtype``, ``device_map`` of
    :func:`~captum_attnflow.hf.placement.load_pretrained`); a FileNotFoundError names ``what``
    is missing and the command that trains it, ``python -m <training_module> --out DIR``."""
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"{path} holds no model.safetensors; reinstall captum-attnflow for the bundled {what}, "
            f"or train one with `python -m {training_module} --out DIR`."
        )
    with no_loading_bar():
        model = load_pretrained(model_class, path, **placement, local_files_only=True)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    return model, tokenizer
