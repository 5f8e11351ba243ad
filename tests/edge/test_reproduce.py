"""Tests of the paper-table reproduction: both tables, per-example values checked against scipy on
single unpadded examples, the ground-truth score by hand, files, and the model left as it was."""

from __future__ import annotations

import copy
import csv
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import rankdata, spearmanr

from captum_attnflow import AttentionFlow, AttentionRollout, RawAttention
from captum_attnflow.baselines import BlankOut, TokenSaliency
from captum_attnflow.data import build_tokenizer, encode_examples, generate_examples
from captum_attnflow.data.agreement import SHORT_SENTENCES
from captum_attnflow.models import AgreementConfig, AgreementModel
from captum_attnflow.models.train import with_end_token
from captum_attnflow.reproduce import PAPER_TABLES, Reproduction, dense_rank_spearman, gradient_sum, reproduce

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
    assert "Table 1, our protocol (words ranked, [CLS] left out)" in markdown
    assert "Table 2, our protocol (words ranked, [CLS] left out)" in markdown
    assert "Spearman correlation with blank-out (20 examples" in markdown
    assert "Spearman correlation with input gradients (20 examples" in markdown
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

# The authors' protocol: on a small model with an end token, so every piece of it is exercised.
SMALL = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4)


@pytest.fixture(scope="module")
def end_token_model():
    torch.manual_seed(1)
    return AgreementModel(AgreementConfig(**SMALL)).eval(), with_end_token(build_tokenizer())


@pytest.fixture(scope="module")
def paper_result(end_token_model) -> Reproduction:
    model, tokenizer = end_token_model
    return reproduce(8, seed=2, batch_size=3, model=model, tokenizer=tokenizer, progress=False,
                     protocol="paper", ranking="dense")


def test_paper_protocol_ranks_every_token_with_absolute_blank_out_and_the_end_token_at_zero(paper_result, end_token_model):
    model, tokenizer = end_token_model
    examples = generate_examples(8, seed=2, split="test")
    for index in (0, 4, 7):
        ids = encode_examples([examples[index]], tokenizer)["input_ids"]
        assert tokenizer.convert_ids_to_tokens(ids[0].tolist())[-1] == "[MASK]"
        signed = BlankOut(model, tokenizer=tokenizer).attribute(ids, target=examples[index].label)[0]
        absolute = signed.abs()
        absolute[-1] = 0.0  # the end token: never blanked
        rollout = AttentionRollout(model).attribute(ids, layer=None)[:, 0]
        row = int(np.flatnonzero(paper_result.correlations.example_ids == index)[0])
        for layer in range(2):
            everything = spearmanr(rollout[layer].numpy(), absolute.numpy()).statistic
            words = spearmanr(rollout[layer, 1:-1].numpy(), signed[1:-1].numpy()).statistic
            assert paper_result.correlations.scores[("rollout", "|blank-out|", layer + 1)][row] == pytest.approx(everything, abs=1e-6)
            assert paper_result.correlations.scores[("rollout", "blank-out", layer + 1)][row] == pytest.approx(words, abs=1e-6)


def test_paper_protocol_tables_and_files(paper_result, tmp_path):
    assert paper_result.correlations.references == [
        "blank-out", "input gradients", "|blank-out|", "gradient sum", "gradient sum, float64",
        "|blank-out|, dense ranks", "gradient sum, dense ranks", "gradient sum, float64, dense ranks",
    ]
    markdown = paper_result.to_markdown()
    assert markdown.index("the authors' protocol") < markdown.index("our protocol")
    assert markdown.count("| rollout (paper) | 0.32 ± 0.26 | 0.38 ± 0.27 |") == 3  # blank-out, |blank-out|, dense ranks
    rows = paper_result.table("gradient sum, float64")
    assert (rows[0]["paper_mean"], rows[0]["paper_std"]) == PAPER_TABLES["input gradients"]["raw"][0]
    names = [path.name for path in paper_result.save(tmp_path)]
    assert "table1_abs_blank_out.csv" in names and "table2_gradient_sum_float64_dense_ranks.csv" in names
    assert len(paper_result.plot().axes) == 9  # 8 references + the ground truth (3 x 3 grid)


def test_paper_protocol_leaves_the_model_as_it_was(end_token_model):
    model, tokenizer = end_token_model
    model.train()
    try:
        reproduce(2, model=model, tokenizer=tokenizer, progress=False, protocol="paper")
        assert model.training
    finally:
        model.eval()
    assert all(parameter.dtype == torch.float32 and parameter.grad is None for parameter in model.parameters())


def test_dense_rank_spearman_is_the_no_ties_formula_on_dense_ranks():
    x = np.array([[0.1, 0.5, 0.5, 0.9, 0.3], [1.0, 2.0, 3.0, 4.0, 5.0]])
    y = np.array([[3.0, 1.0, 2.0, 2.0, 7.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    expected = []
    for row_x, row_y in zip(x, y):
        d = rankdata(row_x, method="dense") - rankdata(row_y, method="dense")
        expected.append(1 - 6 * (d**2).sum() / (5 * (5**2 - 1)))
    np.testing.assert_allclose(dense_rank_spearman(x, y).numpy(), expected)
    mask = np.array([[1, 1, 0, 1, 1], [1, 0, 0, 0, 0]], dtype=bool)
    d = rankdata(x[0, mask[0]], method="dense") - rankdata(y[0, mask[0]], method="dense")
    assert dense_rank_spearman(x, y, mask)[0].item() == pytest.approx(1 - 6 * (d**2).sum() / (4 * 15))
    assert dense_rank_spearman(x, y, mask)[1].item() == 0.0  # one token: undefined, counted as 0
    assert dense_rank_spearman([[1.0, float("nan")]], [[1.0, 2.0]]).item() == 0.0


@given(st.lists(st.floats(-1e3, 1e3), min_size=2, max_size=12, unique=True), st.randoms(use_true_random=False))
def test_dense_rank_spearman_without_ties_is_scipys(values, random):
    other = list(values)
    random.shuffle(other)
    expected = spearmanr(values, other).statistic
    assert dense_rank_spearman([values], [other]).item() == pytest.approx(expected, abs=1e-9)


class _SumOfEmbeddings(torch.nn.Module):
    """logits = (sum_i e_i) W: the gradient sum has a closed form, and it is not 0."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(10, 4)
        self.weight = torch.nn.Parameter(torch.randn(4, 2))

    def get_input_embeddings(self):
        return self.embedding

    def forward(self, inputs_embeds, attention_mask):
        summed = (inputs_embeds * attention_mask[..., None]).sum(1)
        return SimpleNamespace(logits=summed @ self.weight)


def test_gradient_sum_matches_its_closed_form_on_a_model_without_layer_norm():
    torch.manual_seed(0)
    model = _SumOfEmbeddings()
    ids, mask = torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([[1, 1, 1], [1, 1, 0]])
    with torch.no_grad():
        logits = model(model.embedding(ids), mask).logits
    # p_sg - p_pl = tanh(z / 2) with z = l_sg - l_pl = s . (w_sg - w_pl): its derivative along e_{i,d}.
    half = torch.tanh((logits[:, 0] - logits[:, 1]) / 2)
    per_token = (1 - half**2) / 2 * (model.weight[:, 0] - model.weight[:, 1]).sum()
    expected = per_token.abs()[:, None].detach() * mask
    torch.testing.assert_close(gradient_sum(model, ids, mask), expected)


def test_gradient_sum_is_exactly_zero_in_a_pre_layer_norm_model_up_to_rounding(end_token_model):
    model, tokenizer = end_token_model
    ids = tokenizer(["the keys to the cabinet", "a dog"], padding=True, return_tensors="pt")
    ids, mask = ids["input_ids"], ids["attention_mask"]
    model64 = copy.deepcopy(model).double()
    # Why: shifting a token's embedding along the all-ones direction changes no output.
    with torch.no_grad():
        embeddings = model64.get_input_embeddings()(ids)
        shifted = embeddings.clone()
        shifted[0, 2] += 3.0
        torch.testing.assert_close(model64(inputs_embeds=shifted, attention_mask=mask).logits,
                                   model64(inputs_embeds=embeddings, attention_mask=mask).logits, rtol=0, atol=1e-12)
    embeddings = embeddings.clone().requires_grad_()
    probabilities = torch.softmax(model64(inputs_embeds=embeddings, attention_mask=mask).logits, -1)
    (gradient,) = torch.autograd.grad((probabilities[:, 0] - probabilities[:, 1]).sum(), embeddings)
    norms = gradient.norm(dim=-1)[mask.bool()]
    assert norms.min() > 0
    relative64 = gradient_sum(model64, ids, mask)[mask.bool()] / norms
    relative32 = gradient_sum(model, ids, mask)[mask.bool()].double() / norms
    assert relative64.max() < 1e-13
    assert 0 < relative32.max() < 1e-5


def test_short_data_is_short_and_mostly_without_attractors():
    examples = generate_examples(400, seed=0, split="test", **SHORT_SENTENCES)
    lengths = [len(example.words) for example in examples]
    assert max(lengths) <= SHORT_SENTENCES["max_words"]
    assert 6 <= np.median(lengths) <= 8
    assert np.mean([example.num_attractors == 0 for example in examples]) > 0.7
    result = reproduce(3, seed=0, progress=False, data="short", model=AgreementModel(AgreementConfig(**SMALL)).eval(),
                       tokenizer=build_tokenizer())
    assert result.data == "short" and result.num_samples == 3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(protocol="theirs"), "protocol must be one of 'ours', 'paper'"),
        (dict(data="natural"), "data must be one of 'generated', 'short'"),
        (dict(ranking="dense"), "use it with protocol='paper'"),
    ],
)
def test_bad_protocol_arguments_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        reproduce(4, progress=False, **kwargs)


def test_the_tables_take_any_per_layer_method_by_name():
    result = reproduce(num_samples=8, progress=False, methods=("alti", "gradient_rollout"))
    assert {key[0] for key in result.correlations.scores} == {"alti", "gradient_rollout"}
    assert result.subject_first["alti"].shape[0] == 6 and "| alti |" in result.to_markdown()
    with pytest.raises(ValueError, match="names of per-layer methods"):
        reproduce(num_samples=8, progress=False, methods=("saliency",))
