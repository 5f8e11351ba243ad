"""Tests of the paper-table reproduction: both tables, per-example values checked against scipy on
single unpadded examples, the ground-truth score by hand, files, and the model left as it was."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from captum_attnflow import AttentionFlow, AttentionRollout, RawAttention
from captum_attnflow.baselines import BlankOut, TokenSaliency
from captum_attnflow.data import build_tokenizer, encode_examples, generate_examples
from captum_attnflow.models import AgreementConfig, AgreementModel
from captum_attnflow.reproduce import PAPER_TABLES, Reproduction, reproduce

NUM_SAMPLES, SEED = 20, 3


@pytest.fixture(scope="module")
def model_and_tokenizer():
    torch.manual_seed(0)
    return AgreementModel(AgreementConfig()).eval(), build_tokenizer()


@pytest.fixture(scope="module")
def result(model_and_tokenizer) -> Reproduction:
    model, tokenizer = model_and_tokenizer
    # A small batch size puts examples of different lengths in one padded batch and uses several batches.
    return reproduce(NUM_SAMPLES, seed=SEED, batch_size=7, model=model, tokenizer=tokenizer, progress=False)


def _single(model, tokenizer, example):
    """Scores of one example, unpadded, each method called on its own."""
    ids = encode_examples([example], tokenizer)["input_ids"]
    methods = {
        "raw": RawAttention(model).attribute(ids, layer=None)[:, 0],
        "rollout": AttentionRollout(model).attribute(ids, layer=None)[:, 0],
        "flow": AttentionFlow(model).attribute(ids, layer=None)[:, 0],
    }
    references = {
        "blank-out": BlankOut(model, tokenizer=tokenizer).attribute(ids, target=example.label)[0],
        "input gradients": TokenSaliency(model).attribute(ids, target=example.label)[0],
    }
    return ids, methods, references


def test_markdown_has_both_tables_with_ours_beside_the_papers(result):
    markdown = result.to_markdown()
    assert "Table 1: Spearman correlation with blank-out" in markdown
    assert "Table 2: Spearman correlation with input gradients" in markdown
    for method in ("raw", "rollout", "flow"):
        assert markdown.count(f"| {method} (ours) |") == 2
        assert markdown.count(f"| {method} (paper) |") == 2
    assert "| raw (paper) | 0.69 ± 0.27 | 0.10 ± 0.43 |" in markdown
    assert "| flow (paper) | 0.22 ± 0.31 | 0.31 ± 0.34 |" in markdown
    assert "Held-out accuracy" in markdown and "Ground truth" in markdown


def test_tables_are_the_per_example_correlations_summarised(result):
    assert result.num_samples == NUM_SAMPLES
    rows = result.table("blank-out")
    assert [(row["method"], row["layer"]) for row in rows] == [
        (method, layer) for method in ("raw", "rollout", "flow") for layer in range(1, 7)
    ]
    for row in rows:
        values = result.correlations.scores[(row["method"], "blank-out", row["layer"])]
        assert row["mean"] == pytest.approx(np.nanmean(values))
        assert row["std"] == pytest.approx(np.nanstd(values))
        assert row["count"] + row["nan_count"] == NUM_SAMPLES
        assert (row["paper_mean"], row["paper_std"]) == PAPER_TABLES["blank-out"][row["method"]][row["layer"] - 1]


@pytest.mark.parametrize("index", [0, 5, 13])
def test_batched_correlations_match_scipy_on_the_unpadded_example(result, model_and_tokenizer, index):
    model, tokenizer = model_and_tokenizer
    example = generate_examples(NUM_SAMPLES, seed=SEED, split="test")[index]
    _, methods, references = _single(model, tokenizer, example)
    row = int(np.flatnonzero(result.correlations.example_ids == index)[0])
    for method, scores in methods.items():
        for reference, reference_scores in references.items():
            for layer in range(scores.shape[0]):
                expected = spearmanr(scores[layer, 1:].numpy(), reference_scores[1:].numpy()).statistic
                measured = result.correlations.scores[(method, reference, layer + 1)][row]
                if math.isnan(expected):
                    assert math.isnan(measured)
                else:
                    assert measured == pytest.approx(expected, abs=1e-6), (method, reference, layer)


def test_ground_truth_counts_subject_above_and_tied_with_the_best_attractor(result, model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    examples = generate_examples(NUM_SAMPLES, seed=SEED, split="test")
    with_attractors = [example for example in examples if example.attractor_indices]
    assert len(result.num_attractors) == len(with_attractors)
    assert sorted(result.num_attractors) == sorted(example.num_attractors for example in with_attractors)
    above = {name: np.zeros(6) for name in ("raw", "rollout", "flow")}
    above.update({name: np.zeros(1) for name in ("blank-out", "input gradients")})
    tied = {name: np.zeros_like(counts) for name, counts in above.items()}
    for example in with_attractors:
        _, methods, references = _single(model, tokenizer, example)
        subject = example.subject_index + 1
        attractors = [index + 1 for index in example.attractor_indices]
        for name, scores in {**methods, **{k: v[None] for k, v in references.items()}}.items():
            for layer, row in enumerate(scores.tolist()):
                best = max(row[a] for a in attractors)
                above[name][layer] += row[subject] > best + 1e-6
                tied[name][layer] += abs(row[subject] - best) <= 1e-6
    fractions, ties = result.ground_truth(), result.ground_truth_ties()
    for name, counts in above.items():
        np.testing.assert_allclose(fractions[name], counts / len(with_attractors), atol=1e-12, err_msg=name)
        np.testing.assert_allclose(ties[name], tied[name] / len(with_attractors), atol=1e-12, err_msg=name)
    assert ties["flow"].max() > 0  # flow's saturated tokens: the case ties are reported for
    chance = np.mean([1 / (1 + example.num_attractors) for example in with_attractors])
    assert fractions["chance"][0] == pytest.approx(chance)


def test_accuracy_is_the_models_own_predictions(result, model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    examples = generate_examples(NUM_SAMPLES, seed=SEED, split="test")
    batch = encode_examples(examples, tokenizer)
    with torch.no_grad():
        predicted = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits.argmax(-1)
    np.testing.assert_array_equal(result.correct, (predicted == batch["labels"]).numpy())
    np.testing.assert_array_equal(result.has_attractors, [bool(e.attractor_indices) for e in examples])


def test_save_writes_markdown_csv_plot_and_per_example_values(result, tmp_path):
    paths = result.save(tmp_path / "out")
    names = sorted(path.name for path in paths)
    assert names == sorted([
        "reproduction.md", "table1_blank_out.csv", "table2_input_gradients.csv", "ground_truth.csv",
        "reproduction.png", "correlations.npz",
    ])
    assert all(path.stat().st_size > 0 for path in paths)
    with open(tmp_path / "out" / "table1_blank_out.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 18 and rows[0]["paper_mean"] == "0.69"
    with open(tmp_path / "out" / "ground_truth.csv") as handle:
        assert len(list(csv.DictReader(handle))) == 3 * 6 + 3
    assert (tmp_path / "out" / "reproduction.png").read_bytes().startswith(b"\x89PNG")
    assert len(result.plot().axes) == 3


def test_model_mode_is_restored_and_dropout_is_off(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    model.train()
    try:
        first = reproduce(4, model=model, tokenizer=tokenizer, progress=False)
        second = reproduce(4, model=model, tokenizer=tokenizer, progress=False)
        assert model.training
    finally:
        model.eval()
    for key, values in first.correlations.scores.items():
        np.testing.assert_array_equal(values, second.correlations.scores[key])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_samples=0), "num_samples must be a positive int"),
        (dict(num_samples=4, batch_size=0), "batch_size must be a positive int"),
        (dict(num_samples=4, tokenizer=object()), "pass both model and tokenizer"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        reproduce(progress=False, **kwargs)
