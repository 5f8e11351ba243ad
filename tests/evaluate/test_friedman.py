"""The comparison across blocks: Friedman's statistic by its formula and scipy's, Nemenyi's p-values
and critical difference by scikit-posthocs and Demšar's table, the groups against a brute-force
search of the separation graph, and the diagram's bars equal to those groups."""

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import scikit_posthocs
from scipy import stats

from captum_attnflow.evaluate import Leaderboard, critical_difference
from captum_attnflow.visualize.critical_difference import plot_critical_difference

# 10 blocks x 5 methods, higher is better; no ties within a block, the average ranks all distinct.
METHODS = ["m1", "m2", "m3", "m4", "m5"]
TABLE = np.array([
    [0.90, 0.80, 0.70, 0.60, 0.50],
    [0.85, 0.88, 0.60, 0.62, 0.40],
    [0.70, 0.75, 0.72, 0.50, 0.45],
    [0.95, 0.70, 0.80, 0.55, 0.60],
    [0.80, 0.82, 0.65, 0.70, 0.30],
    [0.60, 0.55, 0.58, 0.40, 0.62],
    [0.92, 0.85, 0.83, 0.81, 0.50],
    [0.77, 0.79, 0.60, 0.61, 0.59],
    [0.88, 0.71, 0.74, 0.69, 0.52],
    [0.81, 0.84, 0.70, 0.72, 0.68],
])
# Demšar (2006), Table 5(a): the two-tailed Nemenyi test's q_0.05 for k = 2..6 methods.
Q_005 = {2: 1.960, 3: 2.343, 4: 2.569, 5: 2.728, 6: 2.850}


def _scores(table, methods=METHODS):
    return {f"block {i}": dict(zip(methods, row)) for i, row in enumerate(table)}


def _brute_force_groups(names, separated):
    """Every largest set of names of which no pair is separated, by trying all subsets."""
    fine = [set(subset) for size in range(1, len(names) + 1) for subset in itertools.combinations(names, size)
            if not any(separated[names.index(a)][names.index(b)] for a, b in itertools.combinations(subset, 2))]
    return sorted(sorted(s, key=names.index) for s in fine if not any(s < other for other in fine))


def test_friedman_and_nemenyi_are_the_formula_scipys_and_scikit_posthocs():
    result = critical_difference(_scores(TABLE))
    n, k = TABLE.shape
    ranks = np.array([stats.rankdata(-row) for row in TABLE])  # 1 = best
    mean = ranks.mean(0)
    assert result.names == [METHODS[j] for j in np.argsort(mean)]
    assert result.average_ranks == pytest.approx(dict(zip(METHODS, mean)))
    chi2 = 12 * n / (k * (k + 1)) * (np.sum(mean**2) - k * (k + 1) ** 2 / 4)  # Demšar's equation, no ties
    assert result.statistic == pytest.approx(chi2) == stats.friedmanchisquare(*TABLE.T).statistic
    assert result.pvalue == pytest.approx(stats.chi2.sf(chi2, k - 1)) and result.pvalue < 0.05
    nemenyi = scikit_posthocs.posthoc_nemenyi_friedman(pd.DataFrame(-TABLE, columns=METHODS))
    np.testing.assert_allclose(result.pvalues, nemenyi.loc[result.names, result.names].to_numpy(), rtol=1e-12)
    assert result.critical_difference == pytest.approx(Q_005[k] * math.sqrt(k * (k + 1) / (6 * n)), abs=1e-3)
    for i, j in itertools.combinations(range(k), 2):  # separated exactly when further apart than the CD
        apart = abs(result.average_ranks[result.names[i]] - result.average_ranks[result.names[j]])
        assert result.separated()[i, j] == (apart > result.critical_difference)


def test_groups_are_the_largest_sets_the_library_test_does_not_separate():
    result = critical_difference(_scores(TABLE))
    nemenyi = scikit_posthocs.posthoc_nemenyi_friedman(pd.DataFrame(-TABLE, columns=METHODS)).loc[result.names, result.names]
    separated = (stats.friedmanchisquare(*TABLE.T).pvalue < 0.05) & (nemenyi.to_numpy() < 0.05)
    expected = _brute_force_groups(result.names, separated)
    assert result.groups == expected and len(expected) > 1  # not one group of all: the table separates some
    assert any(len(group) > 1 for group in expected)  # and not all apart


def test_the_diagrams_bars_are_the_groups():
    result = critical_difference(_scores(TABLE))
    figure = plot_critical_difference(result)
    axes = figure.axes[0]
    by_rank = {round(rank, 9): name for name, rank in result.average_ranks.items()}
    bars = [line for line in axes.lines if line.get_linewidth() == 3]
    drawn = sorted(sorted((by_rank[round(x, 9)] for x in bar.get_xdata()), key=result.names.index) for bar in bars)
    assert drawn == [group for group in result.groups if len(group) > 1]
    labels = {text.get_text() for text in axes.texts}
    assert all(any(name in label for label in labels) for name in METHODS)
    assert any(f"critical difference {result.critical_difference:.2f}" in label for label in labels)


def test_lower_is_better_blocks_rank_the_other_way():
    directions = {f"block {i}": i % 2 == 0 for i in range(len(TABLE))}
    flipped = np.array([row if directions[f"block {i}"] else -row for i, row in enumerate(TABLE)])
    assert critical_difference(_scores(flipped), directions).average_ranks == pytest.approx(
        critical_difference(_scores(TABLE)).average_ranks)


def test_without_friedmans_rejection_nothing_is_separated():
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 1, (6, 4))
    result = critical_difference(_scores(noise, METHODS[:4]))
    assert result.pvalue > 0.05 and result.groups == [result.names]
    assert not result.separated().any()


def test_methods_missing_somewhere_are_left_out_and_too_few_refused():
    scores = _scores(TABLE)
    del scores["block 3"]["m5"]
    scores["block 4"]["m4"] = float("nan")
    result = critical_difference(scores)
    assert sorted(result.names) == ["m1", "m2", "m3"] and result.left_out == ["m4", "m5"]
    assert "Left out (no score in some block): m4, m5" in result.to_markdown()
    with pytest.raises(ValueError, match="at least 2 blocks and 3 methods"):
        critical_difference({"only": {"a": 1.0, "b": 2.0, "c": 3.0}})
    with pytest.raises(ValueError, match="no direction for blocks"):
        critical_difference(_scores(TABLE), {"block 0": True})


def test_a_leaderboards_metrics_are_the_blocks_and_names_map_entries_to_methods():
    rng = np.random.default_rng(3)
    per_example = {}
    for i, row in enumerate(TABLE):
        layer = 6 if i % 2 else 4  # two models of different depth
        names = {"m1": f"m1 L{layer}", "m2": "m2", "m3": "m3", "m4": "m4", "m5": "m5"}
        per_example[f"task {i}: comprehensiveness"] = {names[m]: value + rng.normal(0, 0.01, 12) - rng.normal(0, 0.01, 12)
                                                       for m, value in zip(METHODS, row)}
    board = Leaderboard.from_values(per_example, higher_is_better=dict.fromkeys(per_example, True), n_resamples=99)
    result = board.critical_difference(names=lambda entry: entry.split(" L")[0])
    assert result.blocks == board.metrics and sorted(result.names) == METHODS
    np.testing.assert_allclose(
        result.scores[:, result.names.index("m2")], [board.ranking(metric).intervals["m2"].mean for metric in board.metrics]
    )
    with pytest.raises(ValueError, match="same name"):
        board.critical_difference(names=lambda entry: "one")
