"""The Evaluator's faithfulness option: the metrics per method and layer equal direct calls,
resume from checkpoints, refuse other settings, and tabulate with intervals and ranks."""

import csv

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import torch

from helpers import UNK, make_batches, make_classifier
from captum_attnflow import AttentionRollout, RawAttention
from captum_attnflow.baselines import TokenSaliency
from captum_attnflow.evaluate import (
    ComparisonResult,
    Evaluator,
    aopc_comprehensiveness,
    log_odds,
    perturbation_auc,
    subject_first,
)

FAITHFULNESS = {
    "comprehensiveness": {"fractions": [0.2, 0.5]},
    "log-odds": {},
    "log-odds, unk": {"metric": "log-odds", "deletion": UNK},
}


def position(batch):
    return -torch.arange(batch["input_ids"].shape[1], dtype=torch.float32).expand(batch["input_ids"].shape)


def evaluator(model, calls=None, faithfulness=FAITHFULNESS, references=True):
    def counted(batch):
        if calls is not None:
            calls.append(batch["input_ids"].shape[0])
        return position(batch)

    return Evaluator(
        model, {"raw": RawAttention, "position": counted}, {"grad": TokenSaliency(model)} if references else {},
        show_progress=False, faithfulness=faithfulness,
    )


def assert_same(first, second):
    assert first.example_ids.tolist() == second.example_ids.tolist()
    assert list(first.scores) == list(second.scores) and list(first.metrics) == list(second.metrics)
    for mine, theirs in ((first.scores, second.scores), (first.metrics, second.metrics)):
        for key in theirs:
            np.testing.assert_allclose(mine[key], theirs[key], atol=1e-12, rtol=0, equal_nan=True, err_msg=str(key))
    assert first.higher_is_better == second.higher_is_better


def test_metrics_per_method_and_layer_equal_direct_calls():
    model = make_classifier()
    batches = make_batches(2)
    result = evaluator(model).run(batches)
    ids = torch.cat([batch["input_ids"] for batch in batches])
    mask = torch.cat([batch["attention_mask"] for batch in batches])
    labels = torch.cat([batch["labels"] for batch in batches])
    raw = RawAttention(model).attribute(ids, attention_mask=mask, layer=None)
    methods = {("raw", layer + 1): raw[layer] for layer in range(3)}
    methods[("position", None)] = position({"input_ids": ids})
    assert set(result.metrics) == {(method, metric, layer) for (method, layer) in methods for metric in FAITHFULNESS}
    common = dict(target=labels, attention_mask=mask)
    for (method, layer), scores in methods.items():
        expected = {
            "comprehensiveness": aopc_comprehensiveness(model, ids, scores, fractions=[0.2, 0.5], **common),
            "log-odds": log_odds(model, ids, scores, **common),
            "log-odds, unk": log_odds(model, ids, scores, deletion=UNK, **common),
        }
        for metric, values in expected.items():
            np.testing.assert_allclose(result.metrics[(method, metric, layer)], values.double().numpy(), atol=1e-5, rtol=0)
    assert result.higher_is_better == {"comprehensiveness": True, "log-odds": False, "log-odds, unk": False}
    assert set(result.scores) == {("raw", "grad", 1), ("raw", "grad", 2), ("raw", "grad", 3), ("position", "grad", None)}


def test_an_interrupted_run_with_metrics_resumes_and_refuses_other_metric_settings(crash):
    model, batches, calls = make_classifier(), make_batches(3), []
    checkpoint = crash(evaluator(model, calls), batches, 2)
    assert calls == [4, 4]
    other = {**FAITHFULNESS, "log-odds": {"fractions": [0.1]}}
    with pytest.raises(ValueError, match="other methods or settings"):
        evaluator(model, faithfulness=other).run(batches, checkpoint=checkpoint)
    with pytest.raises(ValueError, match="other methods or settings"):
        evaluator(model, faithfulness=None).run(batches, checkpoint=checkpoint)
    resumed = evaluator(model, calls).run(batches, checkpoint=checkpoint)
    assert calls == [4, 4, 4]
    assert_same(resumed, evaluator(model).run(batches))
    assert_same(ComparisonResult.load(checkpoint), resumed)


def test_the_fingerprint_without_metrics_is_unchanged():
    model = make_classifier()
    plain = Evaluator(model, {"raw": RawAttention}, {"grad": TokenSaliency(model)}, show_progress=False)
    assert "faithfulness" not in plain.fingerprint()
    measured = Evaluator(model, {"raw": RawAttention}, {"grad": TokenSaliency(model)}, show_progress=False,
                         faithfulness="sufficiency")
    assert '"faithfulness": {"sufficiency": {"metric": "sufficiency"}}' in measured.fingerprint()


def test_faithfulness_alone_with_the_ground_truth_and_its_tables(tmp_path):
    model = make_classifier(seed=2)
    batches = make_batches(2)
    for batch in batches:
        batch["subject_positions"] = torch.tensor([1, 2, 1, 2])
        batch["attractor_positions"] = torch.tensor([[2, -1], [1, 0], [-1, -1], [1, -1]])
    result = Evaluator(model, {"rollout": AttentionRollout, "position": position}, {}, show_progress=False,
                       faithfulness=["subject-first", "sufficiency"]).run(batches)
    assert result.scores == {} and len(result) == 8
    scores = position({"input_ids": torch.cat([b["input_ids"] for b in batches])})
    expected = subject_first(scores, torch.tensor([1, 2, 1, 2] * 2), torch.tensor([[2, -1], [1, 0], [-1, -1], [1, -1]] * 2))
    np.testing.assert_array_equal(result.metrics[("position", "subject-first", None)], expected.numpy())
    board = result.leaderboard(n_resamples=99)
    table = board.to_markdown()
    assert table.splitlines()[0] == "subject-first (higher is better; 8 examples; mean [95% CI] and group, best mean first)"
    assert "| method | L1 | L2 | L3 | score |" in table and "sufficiency (lower is better" in table
    assert "Undefined, left out" in table  # the examples without attractors
    board.to_csv(tmp_path / "faithfulness.csv")
    with open(tmp_path / "faithfulness.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 * 4 and {row["metric"] for row in rows} == {"subject-first", "sufficiency"}
    assert len(board.plot().axes) == 2
    result.save(tmp_path / "result.npz")
    assert_same(ComparisonResult.load(tmp_path / "result.npz"), result)


def test_vision_batches_get_perturbation_metrics():
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    model = ViTForImageClassification(ViTConfig(
        image_size=8, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=3,
    )).eval()
    pixels = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    batches = [{"pixel_values": pixels[:3]}, {"pixel_values": pixels[3:]}]
    result = Evaluator(model, {"rollout": AttentionRollout}, {}, show_progress=False,
                       faithfulness=["positive-perturbation", "negative-perturbation"]).run(batches)
    scores = AttentionRollout(model).attribute(pixels, layer=None)
    for metric, order in (("positive-perturbation", "positive"), ("negative-perturbation", "negative")):
        expected = perturbation_auc(model, pixels, scores[-1], order=order)
        np.testing.assert_allclose(result.metrics[("rollout", metric, 2)], expected.numpy(), atol=1e-7)
    assert result.higher_is_better == {"positive-perturbation": False, "negative-perturbation": True}


def test_bad_faithfulness_settings_get_clear_errors():
    model = make_classifier()
    grad = {"grad": TokenSaliency(model)}
    with pytest.raises(ValueError, match="unknown faithfulness metric 'aopc'"):
        Evaluator(model, {"raw": RawAttention}, grad, faithfulness=["aopc"])
    with pytest.raises(ValueError, match=r"takes no option\(s\) \['target'\]"):
        Evaluator(model, {"raw": RawAttention}, grad, faithfulness={"log-odds": {"target": 1}})
    with pytest.raises(TypeError, match="recorded in checkpoints"):
        Evaluator(model, {"raw": RawAttention}, grad, faithfulness={"log-odds": {"pad_token_id": object()}})
    with pytest.raises(TypeError, match="references may be"):
        Evaluator(model, {"raw": RawAttention}, {})
    with pytest.raises(ValueError, match=r"'subject-first' of method 'raw'.*needs batch keys \['subject_positions'"):
        Evaluator(model, {"raw": RawAttention}, grad, show_progress=False, faithfulness="subject-first").run(make_batches(1))


def test_results_with_metrics_merge_only_alike():
    first = ComparisonResult([0], metrics={("raw", "log-odds", 1): [0.1]})
    second = ComparisonResult([1], metrics={("raw", "log-odds", 1): [0.3]})
    merged = ComparisonResult.merge([second, first])
    assert merged.example_ids.tolist() == [0, 1] and merged.metrics[("raw", "log-odds", 1)].tolist() == [0.1, 0.3]
    assert merged.methods == ["raw"] and merged.higher_is_better == {"log-odds": False}
    with pytest.raises(ValueError, match="are in one result only"):
        ComparisonResult.merge([first, ComparisonResult([1], metrics={("raw", "sufficiency", 1): [0.3]})])
    with pytest.raises(ValueError, match="different directions"):
        ComparisonResult.merge([first, ComparisonResult([1], metrics={("raw", "log-odds", 1): [0.3]}, higher_is_better={"log-odds": True})])
    with pytest.raises(ValueError, match="direction of metric 'mine' is unknown"):
        ComparisonResult([0], metrics={("raw", "mine", None): [0.1]})
    with pytest.raises(ValueError, match="no faithfulness values"):
        ComparisonResult([0], {("raw", "grad", 1): [0.5]}).leaderboard()


def test_methods_given_by_name_equal_the_objects():
    model = make_classifier()
    batches = make_batches(2)
    by_name = Evaluator(model, ["rollout", "alti", "integrated_gradients"], ["saliency"],
                        faithfulness=["comprehensiveness"], show_progress=False).run(batches)
    from captum_attnflow import ALTI
    from captum_attnflow.baselines import TokenIntegratedGradients

    objects = Evaluator(
        model, {"rollout": AttentionRollout(model), "alti": ALTI(model), "integrated_gradients": TokenIntegratedGradients(model)},
        {"saliency": TokenSaliency(model)}, faithfulness=["comprehensiveness"], show_progress=False,
    ).run(batches)
    assert by_name.scores.keys() == objects.scores.keys() and by_name.metrics.keys() == objects.metrics.keys()
    for key, values in objects.metrics.items():
        np.testing.assert_allclose(by_name.metrics[key], values, atol=1e-6, equal_nan=True)
    with pytest.raises(ValueError, match="unknown method 'lrp'.*alti"):
        Evaluator(model, ["lrp"], {}, faithfulness=["sufficiency"])


class ShiftedClassifier(torch.nn.Module):
    """A wrapper taking a per-example extra argument: logits + offset, the mask by keyword."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, offset, attention_mask=None):
        return self.model(input_ids, attention_mask=attention_mask).logits + offset


def test_additional_forward_args_of_a_batch_reach_methods_and_metrics():
    model = make_classifier()
    wrapper = ShiftedClassifier(model).eval()
    batches = make_batches(2)
    for batch in batches:
        offset = torch.zeros(len(batch["input_ids"]), 3)
        offset[:, 1] = 5.0  # class 1 made near-certain: the comprehensiveness of class 1 shrinks
        batch["additional_forward_args"] = (offset,)
    measured = Evaluator(wrapper, {"grad": TokenSaliency(wrapper)}, {}, faithfulness=["comprehensiveness"],
                         show_progress=False).run(batches)
    for index, batch in enumerate(batches):
        ids, mask, offset = batch["input_ids"], batch["attention_mask"], batch["additional_forward_args"]
        scores = TokenSaliency(wrapper).attribute(ids, target=batch["labels"], additional_forward_args=offset, attention_mask=mask)
        expected = aopc_comprehensiveness(wrapper, ids, scores, target=batch["labels"], attention_mask=mask,
                                          additional_forward_args=offset)
        np.testing.assert_allclose(measured.metrics[("grad", "comprehensiveness", None)][4 * index : 4 * index + 4],
                                   expected.numpy(), atol=1e-6)
