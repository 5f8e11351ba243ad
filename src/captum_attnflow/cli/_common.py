"""What the commands of ``captum-attnflow`` share: argument types, finding and loading a model,
encoding a sentence, the prediction, output paths, and the colour-bar labels of the figures.

Importing this module loads no torch or transformers (the parser is built from it); the
functions that need them import them when called.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

IMAGE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg")
# What the colour bars of the figures show.
VALUE_LABELS = {
    "raw": "attention weight (head mean)",
    "rollout": "rollout score",
    "flow": "max-flow value",
    "gradient_rollout": "relevance (not normalised)",
    "value_zeroing": "value-zeroing share",
    "alti": "ALTI share",
    "norm": "norm of weighted values",
    "saliency": "gradient norm",
    "blankout": "drop in probability",
    "attnlrp": "relevance (AttnLRP)",
}


def layer(value: str) -> int | None:
    """``--layer``: a layer number 1..L, or None for ``all``."""
    if value == "all":
        return None
    return _whole_number(value, "a layer number 1..L or 'all'", "layers are numbered from 1")


def head(value: str) -> int | str:
    """``--head``: a head number 0..H-1, or ``"all"``."""
    if value == "all":
        return value
    return _whole_number(value, "a head number 0..H-1 or 'all'", "heads are numbered from 0", minimum=0)


def positive(value: str) -> int:
    """A count given on the command line: an integer >= 1."""
    return _whole_number(value, "a positive integer", "expected a positive integer")


def _whole_number(value: str, expected: str, too_small: str, minimum: int = 1) -> int:
    """Parse an argparse value as an integer >= ``minimum``; the messages say what was expected instead."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value!r}") from None
    if number < minimum:
        raise argparse.ArgumentTypeError(f"{too_small}, got {number}")
    return number


def placement(args: argparse.Namespace) -> dict[str, Any]:
    """``device``, ``dtype`` and ``device_map`` of :func:`~captum_attnflow.hf.placement.load_pretrained`
    from ``--device``, ``--dtype`` and ``--device-map`` (``--device auto``, the default, gives
    way to a device map)."""
    device = None if args.device_map is not None and args.device == "auto" else args.device
    return dict(device=device, dtype=args.dtype, device_map=args.device_map)


def check_placement(args: argparse.Namespace) -> None:
    """Refuse a ``--device`` this torch cannot use (an unknown name, CUDA on a CPU-only build or
    a machine without a GPU, a missing ``cuda:N``) with torch alone, before the command imports
    transformers and Captum to load the model, which would check the same later."""
    device = placement(args)["device"]
    if device is not None:
        from captum_attnflow.devices import resolve_device

        resolve_device(device)


def model_directory(name: str) -> Path:
    """The directory ``--model NAME_OR_DIR`` names: a directory saved with ``save_pretrained``, or
    the snapshot of a Hub model in the local Hugging Face cache (``HF_HUB_CACHE``, ``HF_HOME``),
    found offline: nothing is downloaded, so ``HF_HUB_OFFLINE`` holds.

    Raises:
        FileNotFoundError: neither; the message names the directory and the cache looked in.
    """
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"--model {name} is a directory without config.json: pass one saved with save_pretrained.")
        return path
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        snapshot = Path(snapshot_download(name, local_files_only=True))
    except (HFValidationError, LocalEntryNotFoundError):
        snapshot = None
    if snapshot is None or not (snapshot / "config.json").is_file():
        raise FileNotFoundError(
            f"--model {name}: no directory {path.absolute()}, and no model {name!r} with a config.json in "
            f"the local Hugging Face cache ({constants.HF_HUB_CACHE}, looked up offline). Pass a directory saved "
            f"with save_pretrained, or download the model once (`hf download {name}`)."
        )
    return snapshot


def load(name: str | None, placement: dict[str, Any], agreement_only: bool = False) -> tuple[Any, Any]:
    """The bundled model, a saved agreement model, or (unless ``agreement_only``) any saved
    Hugging Face sequence-classification model and its tokenizer (``name`` as
    :func:`model_directory` finds it), placed by ``placement`` (:func:`placement`); anything
    else is refused before a model with random weights could be built from it."""
    from captum_attnflow.models import AgreementConfig, load_agreement_model

    if name is None:
        return load_agreement_model(**placement)
    directory = model_directory(name)
    config = json.loads((directory / "config.json").read_text())
    kind = config.get("model_type")
    if kind == AgreementConfig.model_type:
        return load_agreement_model(directory, **placement)
    if agreement_only:
        raise ValueError(
            f"--model {name} holds a {kind!r} model; reproduce needs the verb-number agreement model "
            "(`python -m captum_attnflow.models.train --out DIR`), whose data and classes it evaluates."
        )
    heads = [head for head in config.get("architectures") or [] if head.endswith("ForSequenceClassification")]
    if not heads:
        raise ValueError(
            f"--model {name} holds a {kind!r} model ({', '.join(config.get('architectures') or ['no architecture'])}) "
            "without a sequence-classification head, so it makes no prediction to explain: save a "
            "*ForSequenceClassification model (model.save_pretrained(DIR); tokenizer.save_pretrained(DIR))."
        )
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from captum_attnflow.hf import load_pretrained

    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(f"--model {name} has no loadable tokenizer: save it beside the model ({error}).") from None
    model = load_pretrained(AutoModelForSequenceClassification, directory, **placement, local_files_only=True)
    return model, tokenizer


def _label(model: Any, index: int) -> str:
    from captum_attnflow.data.agreement import PLURAL, SINGULAR
    from captum_attnflow.models import AgreementConfig

    if isinstance(model.config, AgreementConfig):
        return {SINGULAR: "singular", PLURAL: "plural"}[index]
    return str(model.config.id2label.get(index, index))


def image_path(out: Path, default_name: str) -> Path:
    """Where a figure goes (``out`` itself, or ``out/default_name`` for a directory), its folder
    created now: a bad path fails before the computation, not after it."""
    path = out / default_name if out.is_dir() else out
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise ValueError(
            f"--out {out} is neither an existing directory nor an image file name; end it with "
            f"{', '.join(IMAGE_SUFFIXES)}, or create the directory first."
        )
    return writable(path.parent, out) / path.name


def output_directory(out: Path, writes: str) -> Path:
    """``--out`` of a command that writes several files: a directory, created now and writable;
    ``writes`` says what the command writes, for the error when ``out`` is a file."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; {writes}: give a directory.")
    return writable(out, out)


def write_html(result: Any, path: Path | None) -> None:
    """Write ``result``'s HTML view to ``path`` (``--html``), if one was given, and say so."""
    if path:
        result.to_html(path)
        print(f"HTML view written to {path}")


def writable(directory: Path, out: Path) -> Path:
    """Create ``directory`` (and its parents) and check it can be written, naming ``--out`` in the error."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"--out {out}: cannot create the directory {directory} ({error.strerror}).") from None
    if not os.access(directory, os.W_OK):
        raise ValueError(f"--out {out}: the directory {directory} is not writable.")
    return directory


def encode_sentence(sentence: str, tokenizer: Any, model: Any) -> tuple[torch.Tensor, list[str]]:
    """Token ids (1, n) on ``model``'s input device and token strings of a sentence; words the
    tokenizer does not know are reported on stderr."""
    from captum_attnflow.hf import input_device

    if not sentence.strip():
        raise ValueError("the sentence has no words; pass e.g. \"the keys to the cabinet\".")
    encoded = tokenizer(sentence, return_tensors="pt", return_offsets_mapping=True)
    ids = encoded["input_ids"]
    tokens = tokenizer.convert_ids_to_tokens(ids[0].tolist())
    unknown = [
        sentence[start:end]
        for token, (start, end) in zip(tokens, encoded["offset_mapping"][0].tolist())
        if token == tokenizer.unk_token
    ]
    if unknown:
        print(
            f"warning: not in the model's vocabulary, read as {tokenizer.unk_token}: {', '.join(unknown)}",
            file=sys.stderr,
        )
    return ids.to(input_device(model)), tokens


def predict(model: Any, ids: torch.Tensor) -> tuple[int, str]:
    import torch

    with torch.no_grad():
        probabilities = torch.softmax(model(ids).logits[0].float(), -1)
    predicted = int(probabilities.argmax())
    return predicted, f"{_label(model, predicted)} (probability {probabilities[predicted]:.3f})"

