"""The Evaluator's checkpoints: ``.npz`` files of per-example scores, written whole or not at all,
identified by the Evaluator's fingerprint and a hash of every example's tokens, and the
``.part<rank>.npz`` files of each process merged back when a run resumes."""

from __future__ import annotations

import glob
import hashlib
import os
import zipfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from captum_attnflow.evaluate.results import ComparisonResult

# Written into every checkpoint: a file without it was not written by an Evaluator.
CHECKPOINT_FORMAT = "captum_attnflow.Evaluator checkpoint 1"


def _part_path(checkpoint: str | Path, rank: int) -> Path:
    path = _checkpoint_path(checkpoint)
    return path.with_name(f"{path.stem}.part{rank}.npz")


def _checkpoint_path(checkpoint: str | Path) -> Path:
    path = Path(checkpoint)
    if path.suffix != ".npz":
        raise ValueError(f"checkpoint must be a .npz path, got {str(checkpoint)!r}.")
    return path


def _example_hashes(batch: Mapping[str, Any]) -> list[int]:
    """A 63-bit hash of each example's real token ids (or pixels): what identifies an example across runs."""
    if "input_ids" not in batch:
        pixels = batch["pixel_values"].detach().cpu().float().flatten(1)
        return [int.from_bytes(hashlib.blake2b(row.numpy().tobytes(), digest_size=8).digest(), "little") >> 1 for row in pixels]
    ids = batch["input_ids"].detach().cpu().long()
    mask = batch.get("attention_mask")
    mask = torch.ones_like(ids, dtype=torch.bool) if mask is None else torch.as_tensor(mask).cpu().bool()
    return [
        int.from_bytes(hashlib.blake2b(row[keep].numpy().tobytes(), digest_size=8).digest(), "little") >> 1
        for row, keep in zip(ids, mask)
    ]


def _check_same_examples(checkpoint: Any, ids: np.ndarray, batch_hashes: list[int], hashes: dict[int, int]) -> None:
    for example, value in zip(ids.tolist(), batch_hashes):
        if hashes.get(example, value) != value:
            raise ValueError(
                f"checkpoint {checkpoint} was written for other data: example {example} has other tokens now. "
                "Delete the checkpoint (and its .part*.npz files) to start afresh, or pass another checkpoint path."
            )


def _write_checkpoint(result: ComparisonResult, path: Path, fingerprint: str, hashes: dict[int, int]) -> None:
    """Write ``result`` to ``path`` atomically: a temporary file in the same folder, then a rename,
    so a crash mid-write leaves the previous file intact."""
    example_hashes = np.array([hashes.get(example, -1) for example in result.example_ids.tolist()], dtype=np.int64)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as file:
            np.savez(
                file,
                format=np.array(CHECKPOINT_FORMAT),
                fingerprint=np.array(fingerprint),
                example_hashes=example_hashes,
                **result.arrays(),
            )
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _read_checkpoint(path: Path, fingerprint: str) -> tuple[ComparisonResult, dict[int, int]]:
    fix = "delete it to start afresh, or pass another checkpoint path."
    try:
        with np.load(path, allow_pickle=False) as data:
            contents = {name: data[name] for name in data.files}
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as error:  # numpy says ValueError for non-npz
        raise ValueError(f"checkpoint {path} is corrupt or truncated ({type(error).__name__}: {error}); {fix}") from error
    if "format" not in contents or str(contents["format"]) != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint {path} was not written by an Evaluator; {fix}")
    if str(contents["fingerprint"]) != fingerprint:
        raise ValueError(
            f"checkpoint {path} was written by an Evaluator with other methods or settings "
            f"({contents['fingerprint']}); {fix}"
        )
    try:
        result = ComparisonResult.from_arrays(contents)
        hashes = dict(zip(contents["example_ids"].tolist(), contents["example_hashes"].tolist()))
    except (KeyError, ValueError) as error:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"checkpoint {path} is corrupt or truncated ({type(error).__name__}: {error}); {fix}") from error
    return result, hashes


def _load_checkpoint(checkpoint: str | Path, fingerprint: str) -> tuple[ComparisonResult, dict[int, int]]:
    path = _checkpoint_path(checkpoint)
    # glob.escape: a name like "run[1]" is a file name, not a pattern.
    parts = sorted(path.parent.glob(f"{glob.escape(path.stem)}.part*.npz"))
    files = ([path] if path.exists() else []) + parts
    results, hashes = [], {}
    for file in files:
        result, file_hashes = _read_checkpoint(file, fingerprint)
        results.append(result)
        hashes.update(file_hashes)
    return ComparisonResult.merge(results), hashes


def _save_final(
    result: ComparisonResult, checkpoint: str | Path, rank: int, world: int, fingerprint: str, hashes: dict[int, int]
) -> None:
    if rank == 0:
        _write_checkpoint(result, _checkpoint_path(checkpoint), fingerprint, hashes)
    if world > 1:
        from accelerate import PartialState

        PartialState().wait_for_everyone()
    _part_path(checkpoint, rank).unlink(missing_ok=True)
