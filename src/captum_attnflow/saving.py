"""One file format for every result that can be saved and loaded: JSON beside safetensors.

``save_result(path, kind, fields, arrays)`` writes

* ``path`` (``.json``): ``{"format": "captum_attnflow", "kind": kind, "format_version": 1,
  "package_version": ..., "fields": {...}, "arrays": [names]}``, the readable part (tokens,
  method names, layers, model name, ...);
* ``path`` with the suffix ``.safetensors`` beside it: the arrays, by name;

or, with ``compress=True``, one zip archive (deflate) holding both as ``result.json`` and
``arrays.safetensors``. ``load_result`` reads either form (a zip is recognised by its content,
not its name) from the path given to ``save_result`` or any path it returned: ``run``,
``run.json``, ``run.safetensors`` or ``run.zip`` all find what ``save_result("run")`` wrote
(inseq's convention). It checks the kind, and refuses a file of a newer format version with a
ValueError. Nothing is pickled: JSON and safetensors hold data only.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

FORMAT = "captum_attnflow"
FORMAT_VERSION = 1
_JSON, _ARRAYS = "result.json", "arrays.safetensors"


def save_result(
    path: str | Path, kind: str, fields: Mapping[str, Any], arrays: Mapping[str, Any], compress: bool = False
) -> list[Path]:
    """Write a result as JSON + safetensors (or one zip with ``compress=True``).

    Args:
        path: the JSON file (``.json`` added when the name has another suffix), or the zip
            file with ``compress=True`` (``.zip`` added likewise).
        kind: the result class's name, checked on load.
        fields: JSON-serialisable values (lists, dicts, str, numbers, None).
        arrays: ``{name: array or tensor}``, saved as contiguous numpy arrays.
        compress: one deflated zip instead of two files.

    Returns:
        list[Path]: the files written.

    Example::

        >>> import tempfile, numpy as np
        >>> from captum_attnflow.saving import load_result, save_result
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     written = save_result(f"{folder}/run", "Demo", {"tokens": ["a", "b"]}, {"scores": np.ones(2)})
        ...     fields, arrays = load_result(f"{folder}/run", "Demo")  # the path given to save_result
        >>> [path.name for path in written], fields["tokens"], arrays["scores"].tolist()
        (['run.json', 'run.safetensors'], ['a', 'b'], [1.0, 1.0])
    """
    from safetensors.numpy import save

    from captum_attnflow import __version__

    numpy_arrays = {name: np.ascontiguousarray(_numpy(value)) for name, value in arrays.items()}
    header = dict(
        format=FORMAT, kind=kind, format_version=FORMAT_VERSION, package_version=__version__,
        fields=dict(fields), arrays=list(numpy_arrays),
    )
    text = json.dumps(header, indent=1, allow_nan=True)
    blob = save(numpy_arrays) if numpy_arrays else b""
    path = Path(path)
    if compress:
        path = path if path.suffix == ".zip" else path.with_name(path.name + ".zip")
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(_JSON, text)
            archive.writestr(_ARRAYS, blob)
        return [path]
    path = path if path.suffix == ".json" else path.with_name(path.name + ".json")
    path.write_text(text)
    beside = path.with_suffix(".safetensors")
    beside.write_bytes(blob)
    return [path, beside]


def load_result(path: str | Path, kind: str) -> tuple[dict, dict[str, np.ndarray]]:
    """The ``fields`` and ``arrays`` of a file written by :func:`save_result` (example there).

    Args:
        path: the path given to :func:`save_result` (with or without its suffix, compressed or
            not) or one of the paths it returned.
        kind: the result class's name the file must hold.

    Raises:
        FileNotFoundError: nothing saved at ``path``; the message names the files looked for.
        ValueError: not such a file, a file of another kind, one of a newer format version
            (update captum_attnflow to read it), or a name that both a JSON and a zip file
            were saved under (name one of them).
    """
    from safetensors.numpy import load

    path = saved_file(path)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            text, blob = archive.read(_JSON).decode(), archive.read(_ARRAYS)
    else:
        text = path.read_text()
        beside = path.with_suffix(".safetensors")
        blob = beside.read_bytes() if beside.exists() else None
    try:
        header = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not a saved captum_attnflow result (not JSON: {error}).") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"{path} is not a saved captum_attnflow result (no \"format\": \"{FORMAT}\" in it).")
    version = header.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(
            f"{path} has format version {version!r}, newer than this captum_attnflow reads ({FORMAT_VERSION}; "
            f"it was written by version {header.get('package_version')}): upgrade captum_attnflow to load it."
        )
    if header.get("kind") != kind:
        raise ValueError(f"{path} holds a {header.get('kind')}, not a {kind}: load it with {header.get('kind')}.load.")
    names = header.get("arrays", [])
    if names and blob is None:
        raise ValueError(f"{path}: its arrays file {path.with_suffix('.safetensors')} is missing; keep the two files together.")
    arrays = load(blob) if names else {}
    return header["fields"], arrays


def saved_file(path: str | Path) -> Path:
    """The file :func:`save_result` wrote when given ``path`` or returned as one of its paths:
    ``path`` itself when it is a file (the ``.json`` beside it for the ``.safetensors`` half),
    else ``path`` with ``.json`` or ``.zip`` added as :func:`save_result` adds them.

    Example::

        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     written = save_result(f"{folder}/run", "Demo", {}, {}, compress=True)
        ...     saved_file(f"{folder}/run") == saved_file(f"{folder}/run.zip") == written[0]
        True
    """
    path = Path(path)
    if path.suffix == ".safetensors" and path.with_suffix(".json").is_file():
        return path.with_suffix(".json")
    if path.is_file():
        return path
    candidates = [path.with_name(path.name + suffix) for suffix in (".json", ".zip")]
    found = [candidate for candidate in candidates if candidate.is_file()]
    if len(found) > 1:
        raise ValueError(f"both {found[0]} and {found[1]} were saved as {path}: load the one you mean by its full name.")
    if not found:
        raise FileNotFoundError(f"no saved result at {path}: looked for {path}, {candidates[0]} and {candidates[1]}.")
    return found[0]


def _numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a tensor; numpy has no bfloat16
        value = value.detach().cpu()
        return (value.float() if str(value.dtype) == "torch.bfloat16" else value).numpy()
    return np.asarray(value)
