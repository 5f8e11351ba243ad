import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from helpers import UNK, make_classifier, model_state, padded_batch
from helpers import DISTRIBUTED_FAITHFULNESS, make_batches, make_evaluator
from captum_attnflow import AttentionFlow, AttentionRollout, RawAttention
from captum_attnflow.baselines import BlankOut, TokenSaliency
from captum_attnflow.evaluate import ComparisonResult, Evaluator, compare


def assert_same_result(ours, expected):
    np.testing.assert_array_equal(ours.example_ids, expected.example_ids)
    assert list(ours.scores) == list(expected.scores) and list(ours.metrics) == list(expected.metrics)
    for key, values in expected.scores.items():
        np.testing.assert_allclose(ours.scores[key], values, atol=1e-12, rtol=0, equal_nan=True, err_msg=str(key))
    # Probabilities of float32 forward passes: another thread count sums in another order.
    for key, values in expected.metrics.items():
        np.testing.assert_allclose(ours.metrics[key], values, atol=1e-6, rtol=0, equal_nan=True, err_msg=str(key))
    assert ours.to_markdown() == expected.to_markdown()


def by_hand(model, batches):
    """The same comparison without the Evaluator: every method called directly on all examples."""
    ids = torch.cat([batch["input_ids"] for batch in batches])
    mask = torch.cat([batch["attention_mask"] for batch in batches])
    labels = torch.cat([batch["labels"] for batch in batches])
    methods = {
        "raw": RawAttention(model).attribute(ids, attention_mask=mask, layer=None),
        "rollout": AttentionRollout(model).attribute(ids, attention_mask=mask, layer=None),
        "position": -torch.arange(ids.shape[1], dtype=torch.float32).expand(ids.shape),
    }
    references = {
        "blank-out": BlankOut(model, token=UNK).attribute(ids, target=labels, attention_mask=mask),
        "grad": TokenSaliency(model).attribute(ids, target=labels, attention_mask=mask),
    }
    return compare(methods, references, mask=mask)


def test_end_to_end_run_equals_direct_calls_and_prints_the_papers_table():
    model = make_classifier()
    batches = make_batches(3)
    before = model_state(model)
    calls = []
    result = make_evaluator(model, calls).run(batches)
    assert model_state(model) == before
    assert_same_result(result, by_hand(model, batches))
    assert calls == [4, 4, 4] and len(result) == 12
    table = result.to_markdown()
    lines = table.splitlines()
    assert lines[0] == "Spearman correlation with blank-out (12 examples, mean ± std)"
    assert lines[2] == "| method | L1 | L2 | L3 | score |"
    assert lines[4].startswith("| raw | ") and lines[5].startswith("| rollout | ") and lines[6].startswith("| position |")
    assert "Spearman correlation with grad (12 examples, mean ± std)" in table
    rows = {(row["method"], row["reference"], row["layer"]): row for row in result.summary()}
    assert rows[("rollout", "grad", 3)]["count"] + rows[("rollout", "grad", 3)]["nan_count"] == 12


def test_dataloader_generator_and_list_give_the_same_result():
    model = make_classifier()
    batches = make_batches(2)
    examples = [{key: value[i] for key, value in batch.items()} for batch in batches for i in range(4)]
    evaluator = make_evaluator(model, [])
    from_list = evaluator.run(batches)
    assert_same_result(evaluator.run(DataLoader(examples, batch_size=4, shuffle=False)), from_list)
    assert_same_result(evaluator.run(batch for batch in batches), from_list)


def test_batch_position_target_and_special_tokens_reach_the_methods():
    model = make_classifier(seed=1)
    ids, mask = padded_batch(seed=7)
    position = mask.sum(-1) - 1  # the last real token of each example
    special = torch.zeros_like(mask)
    special[:, 0] = 1
    special[torch.arange(4), position] = 1
    seen = {}

    def record(batch):
        seen.update(batch)
        return torch.rand(batch["input_ids"].shape, generator=torch.Generator().manual_seed(0))

    batch = {"input_ids": ids, "attention_mask": mask, "position": position, "special_tokens_mask": special, "y": torch.tensor([2, 1, 0, 2])}
    evaluator = Evaluator(
        model, {"raw": RawAttention(model), "record": record}, {"grad": TokenSaliency(model)},
        exclude_special_tokens=True, target="y", show_progress=False,
    )
    result = evaluator.run([batch])
    assert seen["target"].tolist() == [2, 1, 0, 2]
    expected = compare(
        {"raw": RawAttention(model).attribute(ids, attention_mask=mask, position=position, layer=None), "record": record(batch)},
        {"grad": TokenSaliency(model).attribute(ids, target=torch.tensor([2, 1, 0, 2]), attention_mask=mask)},
        mask=mask, exclude=special,
    )
    assert_same_result(result, expected)


def test_attention_flow_gives_one_column_per_layer():
    model = make_classifier(seed=3)
    ids, mask = padded_batch(seed=5)
    result = Evaluator(model, {"flow": AttentionFlow}, {"grad": TokenSaliency(model)}, show_progress=False).run(
        [{"input_ids": ids, "attention_mask": mask}]
    )
    expected = compare(
        {"flow": AttentionFlow(model).attribute(ids, attention_mask=mask, layer=None)},
        {"grad": TokenSaliency(model).attribute(ids, attention_mask=mask)},
        mask=mask,
    )
    assert_same_result(result, expected)
    assert result.to_markdown().splitlines()[2] == "| method | L1 | L2 | L3 |"


def test_without_labels_the_predicted_class_is_explained():
    model = make_classifier(seed=2)
    ids, mask = padded_batch(seed=3)
    predicted = model(ids, attention_mask=mask).logits.argmax(-1)
    result = Evaluator(model, {"raw": RawAttention}, {"blank-out": BlankOut(model, token=UNK)}, show_progress=False).run(
        [{"input_ids": ids, "attention_mask": mask}]
    )
    expected = compare(
        {"raw": RawAttention(model).attribute(ids, attention_mask=mask, layer=None)},
        {"blank-out": BlankOut(model, token=UNK).attribute(ids, target=predicted, attention_mask=mask)},
        mask=mask,
    )
    assert_same_result(result, expected)


def test_an_interrupted_run_resumes_from_its_checkpoint(tmp_path, crash):
    model, batches, calls = make_classifier(), make_batches(4), []
    checkpoint = crash(make_evaluator(model, calls), batches, 2)
    assert calls == [4, 4]
    assert list(tmp_path.iterdir()) == [tmp_path / "scores.part0.npz"]
    crash(make_evaluator(model, calls), batches, 3)  # a second interruption keeps what the first one saved
    assert calls == [4, 4, 4]
    resumed = make_evaluator(model, calls).run(batches, checkpoint=checkpoint, save_every=1)
    assert calls == [4, 4, 4, 4]
    assert list(tmp_path.iterdir()) == [checkpoint]
    assert_same_result(resumed, make_evaluator(model, []).run(batches))
    assert_same_result(ComparisonResult.load(checkpoint), resumed)
    again = make_evaluator(model, calls).run(batches, checkpoint=checkpoint)
    assert calls == [4, 4, 4, 4]
    assert_same_result(again, resumed)


def test_bad_input_gets_clear_errors():
    model = make_classifier()
    ids, mask = padded_batch()
    batch = {"input_ids": ids, "attention_mask": mask}
    grad = {"grad": TokenSaliency(model)}
    with pytest.raises(TypeError, match="non-empty mappings"):
        Evaluator(model, {}, grad)
    with pytest.raises(TypeError, match=r"method 'x' must have \.attribute"):
        Evaluator(model, {"x": 3}, grad)
    evaluator = Evaluator(model, {"raw": RawAttention}, grad, show_progress=False)
    with pytest.raises(TypeError, match="'input_ids'"):
        evaluator.run([ids])
    with pytest.raises(ValueError, match=r"\.npz"):
        evaluator.run([batch], checkpoint="scores.csv")
    padded = dict(batch, attention_mask=mask.clone())
    padded["attention_mask"][1] = 0
    with pytest.raises(ValueError, match=r"batch 1 \(examples 4\.\.7\): method 'raw' failed: examples \[1\] are all padding"):
        evaluator.run([batch, padded])
    with pytest.raises(ValueError, match="special_tokens_mask"):
        Evaluator(model, {"raw": RawAttention}, grad, exclude_special_tokens=True, show_progress=False).run([batch])
    with pytest.raises(ValueError, match=r"reference 'raw' must be \(B, n\)"):
        Evaluator(model, grad, {"raw": RawAttention}, show_progress=False).run([batch])
    with pytest.raises(ValueError, match="same B, same n"):
        Evaluator(model, {"short": lambda b: torch.rand(4, 3)}, grad, show_progress=False).run([batch])


@pytest.mark.slow
def test_two_accelerate_processes_give_the_single_process_table(tmp_path):
    pytest.importorskip("accelerate")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    script = Path(__file__).with_name("_evaluate_distributed.py")
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(port), str(script), str(tmp_path),
    ]
    # Two CPU processes (gloo), whatever GPUs the machine has.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    launched = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert launched.returncode == 0, launched.stderr[-3000:]
    single = make_evaluator(make_classifier(), [], faithfulness=DISTRIBUTED_FAITHFULNESS).run(make_batches())
    assert single.metrics  # the faithfulness values are gathered and checkpointed too
    for rank in (0, 1):
        assert_same_result(ComparisonResult.load(tmp_path / f"result{rank}.npz"), single)
    # Batches 0, 2, 4 on process 0 and 1, 3 on process 1: each did its share only.
    assert [int((tmp_path / f"batches{rank}.txt").read_text()) for rank in (0, 1)] == [3, 2]
    assert_same_result(ComparisonResult.load(tmp_path / "checkpoint.npz"), single)
    assert not list(tmp_path.glob("checkpoint.part*"))
