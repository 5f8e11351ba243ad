import csv

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

from captum_attnflow.evaluate import ComparisonResult


def example_result(ids=(0, 1, 2, 3)):
    ids = np.array(ids)
    return ComparisonResult(
        ids,
        {
            ("rollout", "blank-out", 1): np.array([0.1, 0.3, np.nan, 0.5])[: len(ids)],
            ("rollout", "blank-out", 2): np.array([0.2, 0.4, 0.6, 0.8])[: len(ids)],
            ("raw", "blank-out", 1): np.array([-0.1, 0.0, 0.1, 0.2])[: len(ids)],
            ("raw", "blank-out", 2): np.array([0.0, 0.0, 0.0, 0.0])[: len(ids)],
            ("saliency", "blank-out", None): np.array([0.9, 0.7, 0.8, 0.6])[: len(ids)],
        },
    )


def test_summary_ignores_and_counts_nan():
    rows = {(r["method"], r["layer"]): r for r in example_result().summary()}
    first = rows[("rollout", 1)]
    assert first["mean"] == pytest.approx(0.3)
    assert first["std"] == pytest.approx(np.std([0.1, 0.3, 0.5]))
    assert (first["count"], first["nan_count"]) == (3, 1)
    assert rows[("saliency", None)]["count"] == 4


def test_markdown_has_the_papers_layout():
    text = example_result().to_markdown()
    lines = text.splitlines()
    assert lines[0].startswith("Spearman correlation with blank-out (4 examples")
    assert lines[2] == "| method | L1 | L2 | score |"
    assert "| rollout | 0.30 ± 0.16 | 0.50 ± 0.22 |  |" in lines
    assert "| raw | 0.05 ± 0.11 | 0.00 ± 0.00 |  |" in lines
    assert "| saliency |  |  | 0.75 ± 0.11 |" in lines
    assert "rollout: 1" in lines[-1]


def test_csv_round_trip(tmp_path):
    example_result().to_csv(tmp_path / "table.csv")
    with open(tmp_path / "table.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 5
    assert rows[0]["method"] == "rollout" and rows[0]["layer"] == "1" and rows[0]["nan_count"] == "1"
    assert float(rows[1]["mean"]) == pytest.approx(0.5)
    assert rows[4]["layer"] == ""


def test_plot_draws_one_line_per_method_per_reference():
    figure = example_result().plot()
    (axes,) = figure.axes
    assert [line.get_label() for line in axes.get_lines()] == ["rollout", "raw", "saliency"]
    np.testing.assert_allclose(axes.get_lines()[0].get_ydata(), [0.3, 0.5])
    assert len(axes.collections) == 2  # the std bands of the per-layer methods


def test_plot_registers_no_pyplot_figure_and_draws_on_given_axes():
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    example_result().plot()
    assert plt.get_fignums() == before  # a notebook shows the returned figure once
    figure, axes = plt.subplots()
    try:
        assert example_result().plot(ax=axes) is figure
        assert len(axes.get_lines()) == 3
        with pytest.raises(ValueError, match="one axes per reference"):
            example_result().plot(ax=[axes, axes])
    finally:
        plt.close(figure)


def test_save_load_merge(tmp_path):
    full = example_result()
    first = ComparisonResult(full.example_ids[:2], {k: v[:2] for k, v in full.scores.items()})
    second = ComparisonResult(full.example_ids[1:], {k: v[1:] for k, v in full.scores.items()})
    second.save(tmp_path / "second.npz")
    merged = ComparisonResult.merge([ComparisonResult.load(tmp_path / "second.npz"), first])
    np.testing.assert_array_equal(merged.example_ids, full.example_ids)
    for key, values in full.scores.items():
        np.testing.assert_array_equal(merged.scores[key], values)
    assert merged.to_markdown() == full.to_markdown()


def test_merge_rejects_different_comparisons():
    other = ComparisonResult(np.array([9]), {("flow", "blank-out", 1): np.array([0.5])})
    with pytest.raises(ValueError, match="different comparisons"):
        ComparisonResult.merge([example_result(), other])
    with pytest.raises(ValueError, match="shape"):
        ComparisonResult(np.array([0, 1]), {("a", "b", None): np.array([0.5])})

def test_published_values_beside_ours_in_csv_and_plot(tmp_path):
    result = ComparisonResult([0, 1], {("raw", "grad", 1): [0.2, 0.4], ("raw", "grad", 2): [0.1, 0.3]})
    beside = {("raw", "grad", 1): (0.53, 0.33), ("raw", "grad", 2): (0.16, 0.38)}
    result.to_csv(tmp_path / "table.csv", beside=beside)
    with open(tmp_path / "table.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["layer"], row["paper_mean"], row["paper_std"]) for row in rows] == [("1", "0.53", "0.33"), ("2", "0.16", "0.38")]
    np.testing.assert_allclose([float(row["mean"]) for row in rows], [0.3, 0.2])
    axes = result.plot(beside=beside).axes[0]
    lines = {line.get_label(): line.get_ydata() for line in axes.get_lines()}
    assert list(lines["raw (paper)"]) == [0.53, 0.16]
    np.testing.assert_allclose(lines["raw (ours)"], [0.3, 0.2])
