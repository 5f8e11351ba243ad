"""Evaluator checkpoints: written atomically, refused clearly when corrupt, foreign or stale, glob-safe names."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from captum_attnflow import AttentionRollout
from captum_attnflow.baselines import TokenSaliency
from captum_attnflow.evaluate import ComparisonResult, Evaluator
from helpers import make_batches, make_classifier, make_evaluator, model_state


def assert_same(first: ComparisonResult, second: ComparisonResult) -> None:
    assert first.example_ids.tolist() == second.example_ids.tolist()
    assert set(first.scores) == set(second.scores)
    for key in first.scores:
        np.testing.assert_allclose(first.scores[key], second.scores[key], equal_nan=True)


def test_glob_characters_in_the_name_resume(tmp_path, crash):
    model, batches = make_classifier(), make_batches(3)
    checkpoint = crash(
        make_evaluator(model, []), batches, 2, save_every=10, error=KeyboardInterrupt, checkpoint=tmp_path / "run[1].npz"
    )
    # Progress is saved on the interruption itself, not only every save_every batches.
    assert (tmp_path / "run[1].part0.npz").exists()
    calls: list = []
    resumed = make_evaluator(model, calls).run(batches, checkpoint=checkpoint)
    assert calls == [4]  # only the batch that was not done
    assert_same(resumed, make_evaluator(model, []).run(batches))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["run[1].npz"]


def test_a_crash_while_writing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model, batches = make_classifier(), make_batches(2)
    checkpoint = tmp_path / "scores.npz"
    first = make_evaluator(model, []).run(batches[:1], checkpoint=checkpoint)
    real_savez = np.savez

    def crash_mid_write(file, **arrays):
        real_savez(file, **{key: arrays[key] for key in list(arrays)[:2]})  # half written
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", crash_mid_write)
    with pytest.raises(OSError, match="disk full"):
        make_evaluator(model, []).run(batches, checkpoint=checkpoint)
    monkeypatch.undo()
    assert_same(ComparisonResult.load(checkpoint), first)  # intact, readable
    assert sorted(path.name for path in tmp_path.iterdir()) == ["scores.npz"]  # no temporary left


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04 truncated zip", b"not a checkpoint at all"])
def test_corrupt_or_truncated_checkpoints_name_the_file_and_the_fix(tmp_path, content):
    checkpoint = tmp_path / "scores.npz"
    checkpoint.write_bytes(content)
    with pytest.raises(ValueError, match=r"scores.npz is corrupt or truncated.*delete it to start afresh"):
        make_evaluator(make_classifier(), []).run(make_batches(1), checkpoint=checkpoint)


def test_a_truncated_real_checkpoint_is_refused(tmp_path):
    checkpoint = tmp_path / "scores.npz"
    make_evaluator(make_classifier(), []).run(make_batches(1), checkpoint=checkpoint)
    checkpoint.write_bytes(checkpoint.read_bytes()[: checkpoint.stat().st_size // 2])
    with pytest.raises(ValueError, match="corrupt or truncated"):
        make_evaluator(make_classifier(), []).run(make_batches(1), checkpoint=checkpoint)


def test_a_foreign_npz_is_refused(tmp_path):
    checkpoint = tmp_path / "scores.npz"
    ComparisonResult([0, 1], {("raw", "grad", 1): [0.1, 0.2]}).save(checkpoint)  # scores, but no Evaluator's
    with pytest.raises(ValueError, match="not written by an Evaluator"):
        make_evaluator(make_classifier(), []).run(make_batches(1), checkpoint=checkpoint)


def test_other_methods_or_other_data_are_refused(tmp_path):
    model, batches = make_classifier(), make_batches(2)
    checkpoint = tmp_path / "scores.npz"
    make_evaluator(model, []).run(batches, checkpoint=checkpoint)
    other_methods = Evaluator(model, {"rollout": AttentionRollout}, {"grad": TokenSaliency(model)}, show_progress=False)
    with pytest.raises(ValueError, match="other methods or settings"):
        other_methods.run(batches, checkpoint=checkpoint)
    other_data = [dict(batch, input_ids=batch["input_ids"].flip(-1) * batch["attention_mask"]) for batch in batches]
    with pytest.raises(ValueError, match="written for other data: example 0"):
        make_evaluator(model, []).run(other_data, checkpoint=checkpoint)


def test_the_model_runs_in_eval_mode_and_is_restored():
    model, batches = make_classifier(), make_batches(1)
    expected = make_evaluator(model, []).run(batches)
    model.train()
    before = model_state(model)
    assert_same(make_evaluator(model, []).run(batches), expected)
    assert model_state(model) == before and model.training
    assert torch.is_grad_enabled()
