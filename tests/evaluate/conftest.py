"""Fixtures of the evaluation tests."""

from __future__ import annotations

import pytest


class Crash(Exception):
    """A failure in the middle of a run, raised by its batches."""


@pytest.fixture
def crash(tmp_path):
    """``crash(evaluator, batches, count, save_every=1, error=Crash, checkpoint=tmp_path / "scores.npz")``:
    ``evaluator``'s run with that checkpoint, stopped by ``error`` raised after the first
    ``count`` batches; returns the checkpoint's path, for the run that resumes."""

    def run(evaluator, batches, count, save_every=1, error=Crash, checkpoint=tmp_path / "scores.npz"):
        def stopped():
            yield from batches[:count]
            raise error

        with pytest.raises(error):
            evaluator.run(stopped(), checkpoint=checkpoint, save_every=save_every)
        return checkpoint

    return run
