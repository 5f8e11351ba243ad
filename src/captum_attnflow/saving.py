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
import zlib
from pathlib import Path
from typing import Any, Mapping

import numpy as np

FORMAT = "captum_attnflow"
FORMAT_VERSION = 1
_JSON, _ARRAYS = "result.json", "arrays.safetensors"
_DAMAGED = "save the result again, or restore the files that save wrote from a copy."


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
            (update captum_attnflow to read it), a name that both a JSON and a zip file
            were saved under (name one of them), or a damaged file: a zip or a safetensors file
            that cannot be read (overwritten, truncated, empty) or that holds other arrays than
            the JSON lists.
    """
    path = saved_file(path)
    text, blob, arrays_file = _read(path)
    header = _header(text, path, kind)
    names = header["arrays"]
    if not names:
        return header["fields"], {}
    if blob is None:
        raise ValueError(f"{path}: its arrays file {arrays_file} is missing; keep the two files together.")
    return header["fields"], _arrays(blob, names, arrays_file, path)


def _read(path: Path) -> tuple[bytes, bytes | None, str]:
    """The JSON text, the safetensors bytes (None when the file beside is missing) and the name of
    where the arrays are, of the zip or the JSON file at ``path``."""
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                return archive.read(_JSON), archive.read(_ARRAYS), f"{path} ({_ARRAYS})"
        except (zipfile.BadZipFile, KeyError, EOFError, zlib.error) as error:
            raise ValueError(f"{path} is a damaged zip archive ({error}): {_DAMAGED}") from None
    beside = path.with_suffix(".safetensors")
    return path.read_bytes(), beside.read_bytes() if beside.is_file() else None, str(beside)


def _header(text: bytes, path: Path, kind: str) -> dict:
    """The checked JSON header: this format, a version this package reads, ``kind``."""
    if text.startswith(b"PK\x03\x04"):  # a zip that is_zipfile refused: its directory, at the end, is gone
        raise ValueError(f"{path} is a damaged or truncated zip archive: {_DAMAGED}")
    try:
        header = json.loads(text.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
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
    if not isinstance(header.get("fields"), dict) or not isinstance(header.get("arrays"), list):
        raise ValueError(f"{path} is damaged (its \"fields\" or \"arrays\" entry is missing): {_DAMAGED}")
    return header


def _arrays(blob: bytes, names: list[str], arrays_file: str, path: Path) -> dict[str, np.ndarray]:
    """The arrays of the safetensors bytes ``blob``, which must hold exactly the ``names`` the JSON
    lists. safetensors reads data only (a JSON header and raw bytes): nothing in the file is run."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    try:
        arrays = load(blob)
    except SafetensorError as error:
        raise ValueError(f"{arrays_file} is damaged (not a safetensors file: {error}): {_DAMAGED}") from None
    if sorted(arrays) != sorted(names):
        raise ValueError(
            f"{arrays_file} holds the arrays {sorted(arrays)}, not the {sorted(names)} that {path} lists: "
            f"the two files come from different saves; {_DAMAGED}"
        )
    return arrays


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
