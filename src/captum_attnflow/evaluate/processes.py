"""The Evaluator on several processes: the rank and world size a launcher set, the refusal of data
already split by accelerate, and the gathering of every process's scores and example hashes."""

from __future__ import annotations

import os
from typing import Any

import torch

from captum_attnflow.evaluate.results import ComparisonResult


def _process_group(device: torch.device) -> tuple[int, int]:
    """(rank, world size); accelerate is only needed when a launcher started several processes."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    from accelerate import PartialState

    # accelerate joins CPU processes (gloo) only when asked to; without cpu=True every process
    # would run alone and evaluate all the data. An existing Accelerator's state is kept.
    state = PartialState(cpu=device.type == "cpu")
    if state.num_processes != world:
        raise RuntimeError(
            f"the launcher started {world} processes but accelerate set up {state.num_processes} "
            f"({state.distributed_type}), e.g. an Accelerator() made earlier without cpu=True on a "
            "machine without GPUs: create it with Accelerator(cpu=True), or none at all."
        )
    return state.process_index, state.num_processes


def _check_not_sharded(data: Any, world: int) -> None:
    """Refuse a DataLoader that ``accelerator.prepare`` already split: the Evaluator shards by
    itself, and numbers examples by their place in the full data."""
    if world <= 1:
        return
    from accelerate.data_loader import DataLoaderDispatcher, DataLoaderShard

    if isinstance(data, (DataLoaderShard, DataLoaderDispatcher)):
        raise ValueError(
            "data is a DataLoader prepared by accelerate (already split across processes); pass the "
            "original DataLoader: Evaluator.run shards the batches itself and gathers the scores."
        )


def _gather(result: ComparisonResult) -> list[ComparisonResult]:
    from accelerate.utils import gather_object

    return gather_object([result])


def _gather_hashes(hashes: dict[int, int]) -> dict[int, int]:
    from accelerate.utils import gather_object

    merged: dict[int, int] = {}
    for part in gather_object([hashes]):
        merged.update(part)
    return merged
