"""Bootstrap intervals and paired tests against scipy on fixed data; Holm and the ranking by hand."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from captum_attnflow.evaluate import bootstrap_interval, paired_test, rank_methods
from captum_attnflow.evaluate.statistics import group_letters, holm, not_separated_groups

VALUES = np.array([0.12, 0.55, 0.31, 0.9, 0.47, 0.05, 0.66, 0.38, 0.29, 0.71, 0.44, 0.18, 0.83, 0.5, 0.27])


@pytest.mark.parametrize("method", ["BCa", "percentile", "basic"])
@pytest.mark.parametrize("confidence", [0.9, 0.95])
def test_bootstrap_interval_is_scipys_on_the_defined_values(method, confidence):
    with_nan = np.insert(VALUES, [2, 7], np.nan)
    ours = bootstrap_interval(with_nan, confidence=confidence, n_resamples=2000, seed=3, method=method)
    expected = stats.bootstrap(
        (VALUES,), np.mean, confidence_level=confidence, n_resamples=2000, method=method,
        random_state=np.random.default_rng(3),
    ).confidence_interval
    assert ours.mean == pytest.approx(VALUES.mean(), abs=1e-15)
    assert (ours.low, ours.high) == pytest.approx((expected.low, expected.high), abs=1e-12)
    assert ours.count == VALUES.size
    assert ours.low < ours.mean < ours.high


def test_bootstrap_interval_degenerate_cases():
    assert bootstrap_interval([np.nan, np.nan]).count == 0 and math.isnan(bootstrap_interval([]).mean)
    single = bootstrap_interval([0.4, np.nan])
    assert (single.mean, single.count) == (0.4, 1) and math.isnan(single.low) and math.isnan(single.high)
    assert tuple(bootstrap_interval([0.3] * 5)) == (pytest.approx(0.3), pytest.approx(0.3), pytest.approx(0.3), 5)
    with pytest.raises(ValueError, match="confidence must be in"):
        bootstrap_interval(VALUES, confidence=95)
    with pytest.raises(ValueError, match=r"must be \(N,\)"):
        bootstrap_interval(VALUES.reshape(3, 5))


@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
def test_paired_test_is_scipys_wilcoxon_on_the_pairs_both_define(alternative):
    other = VALUES[::-1] * 0.8 + 0.05
    a, b = np.append(VALUES, [np.nan, 0.3]), np.append(other, [0.2, np.nan])
    ours = paired_test(a, b, alternative=alternative)
    expected = stats.wilcoxon(VALUES, other, alternative=alternative)
    assert (ours.statistic, ours.pvalue) == pytest.approx((expected.statistic, expected.pvalue), abs=1e-12)
    assert ours.count == VALUES.size and ours.mean_difference == pytest.approx((VALUES - other).mean())


@pytest.mark.parametrize("zero_method", ["wilcox", "pratt", "zsplit"])
@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
def test_small_samples_with_ties_or_zeros_get_scipys_exact_sign_flip_pvalue(alternative, zero_method):
    generator = np.random.default_rng(0)
    for n in (3, 6, 8, 14):  # 14: above the exact range, the normal approximation
        # differences on a coarse grid: ties and zeros in most samples
        a = generator.integers(0, 4, n) / 4
        b = generator.integers(0, 4, n) / 4
        if np.all(a == b):
            continue
        ours = paired_test(a, b, alternative=alternative, zero_method=zero_method)
        expected = stats.wilcoxon(a, b, alternative=alternative, zero_method=zero_method)
        assert (ours.statistic, ours.pvalue) == pytest.approx((expected.statistic, expected.pvalue), abs=1e-12), n


def test_paired_test_without_any_difference_or_pair():
    assert paired_test(VALUES, VALUES.copy()) == (0.0, 1.0, VALUES.size, 0.0)
    empty = paired_test([np.nan, 1.0], [2.0, np.nan])
    assert empty.count == 0 and math.isnan(empty.pvalue)
    with pytest.raises(ValueError, match="same examples"):
        paired_test(VALUES, VALUES[:-1])


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 scaled by 3, 2, 1: 0.03, 0.06, 0.04 -> running max 0.03, 0.06, 0.06
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])
    np.testing.assert_allclose(holm([0.5, np.nan, 0.2]), [0.5, np.nan, 0.4])  # m = 2: NaN is no test
    np.testing.assert_allclose(holm([[0.4, 0.9]]), [[0.8, 0.9]])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=12))
def test_holm_never_lowers_a_pvalue_and_keeps_their_order(pvalues):
    raw = np.array(pvalues)
    adjusted = holm(raw)
    assert np.all(adjusted >= raw - 1e-15) and np.all(adjusted <= 1)
    order = np.argsort(raw, kind="stable")
    assert np.all(np.diff(adjusted[order]) >= -1e-15)


def test_clearly_separated_methods_get_distinct_ranks():
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.02, (3, 40))
    values = {"middle": 0.5 + noise[0], "low": 0.2 + noise[1], "high": 0.8 + noise[2]}
    up = rank_methods(values, n_resamples=199)
    assert up.names == ["high", "middle", "low"] and up.ranks == {"high": 1, "middle": 2, "low": 3}
    down = rank_methods(values, higher_is_better=False, n_resamples=199)
    assert down.names == ["low", "middle", "high"] and down.ranks == {"low": 1, "middle": 2, "high": 3}
    assert all(not down.not_different(name) for name in values)
    assert up.pvalues.shape == (3, 3) and np.isnan(np.diag(up.pvalues)).all()
    np.testing.assert_allclose(up.pvalues, up.pvalues.T, equal_nan=True)


def test_indistinguishable_methods_share_one_group():
    rng = np.random.default_rng(1)
    same = rng.normal(0.5, 0.1, 30)
    values = {"a": same, "b": same + rng.normal(0, 1e-3, 30), "c": same.copy()}
    ranking = rank_methods(values, n_resamples=199)
    assert set(ranking.groups.values()) == {"a"}
    assert sorted(ranking.not_different("a")) == ["b", "c"]
    table = ranking.to_markdown()
    assert "| rank | method | mean [CI] | group | examples | not significantly different from |" in table


def test_the_adjusted_pvalues_are_holms_of_the_pairwise_wilcoxon_tests():
    rng = np.random.default_rng(2)
    values = {name: rng.normal(mean, 0.1, 25) for name, mean in (("x", 0.5), ("y", 0.46), ("z", 0.4), ("w", 0.52))}
    ranking = rank_methods(values, n_resamples=99)
    pairs = [(i, j) for i in range(4) for j in range(i + 1, 4)]
    names = ranking.names
    raw = [stats.wilcoxon(values[names[i]], values[names[j]]).pvalue for i, j in pairs]
    expected = holm(raw)
    np.testing.assert_allclose([ranking.pvalues[i, j] for i, j in pairs], expected, rtol=1e-12)
    means = [ranking.intervals[name].mean for name in names]
    assert means == sorted(means, reverse=True) and [ranking.ranks[name] for name in names] == [1, 2, 3, 4]
    for i, j in pairs:  # a shared letter exactly where the adjusted test is not significant
        shared = bool(set(ranking.groups[names[i]]) & set(ranking.groups[names[j]]))
        assert shared == (expected[pairs.index((i, j))] >= 0.05)


def test_rank_methods_refuses_bad_input():
    with pytest.raises(TypeError, match="non-empty mapping"):
        rank_methods({})
    with pytest.raises(ValueError, match="the same N"):
        rank_methods({"a": [0.1, 0.2], "b": [0.3]})
    with pytest.raises(ValueError, match="alpha must be"):
        rank_methods({"a": [0.1, 0.2]}, alpha=5)


def test_the_order_is_by_mean_even_where_a_lower_mean_is_separated_from_fewer():
    # a and b differ by 0.05 on every example (separated); c is 0.08 below a on average but
    # with a spread no test can see through (separated from neither). Counting significant
    # wins ranked c above b; by mean c comes last, in a group with each of them.
    rng = np.random.default_rng(0)
    a = rng.normal(0.6, 0.05, 40)
    b = a - 0.05 + rng.normal(0, 0.005, 40)
    values = {"c": a - 0.08 + rng.normal(0, 0.6, 40), "b": b, "a": a}
    raw = {pair: stats.wilcoxon(values[pair[0]], values[pair[1]]).pvalue for pair in (("a", "b"), ("a", "c"), ("b", "c"))}
    assert raw[("a", "b")] < 0.05 / 3 and raw[("a", "c")] > 0.05 and raw[("b", "c")] > 0.05  # what the case is built on
    ranking = rank_methods(values, n_resamples=99)
    assert ranking.names == ["a", "b", "c"] and ranking.ranks == {"a": 1, "b": 2, "c": 3}
    assert ranking.groups == {"a": "a", "b": "b", "c": "ab"}
    rows = [line.split(" | ")[1] for line in ranking.to_markdown().splitlines()[4:]]
    assert rows == ["a", "b", "c"]


def test_groups_of_a_hand_made_separation_pattern():
    # 1 and 4 are separated from each other; 5 from everyone.
    names = ["1", "2", "3", "4", "5"]
    separated = np.zeros((5, 5), dtype=bool)
    separated[0, 3] = separated[3, 0] = True
    separated[4, :] = separated[:, 4] = True
    groups = not_separated_groups(names, separated)
    assert groups == [["1", "2", "3"], ["2", "3", "4"], ["5"]]
    assert group_letters(groups) == {"1": "a", "2": "ab", "3": "ab", "4": "b", "5": "c"}
    assert not_separated_groups(names, np.zeros((5, 5), dtype=bool)) == [names]
    with pytest.raises(ValueError, match="one row and column per name"):
        not_separated_groups(names, separated[:4, :4])


def test_more_groups_than_letters_are_numbered():
    names = [str(i) for i in range(60)]
    letters = group_letters([[name] for name in names])
    assert letters["0"] == "g1" and letters["59"] == "g60"
    assert group_letters([["x", "y"], ["y"]]) == {"x": "a", "y": "ab"}


@settings(max_examples=30, deadline=None)
@given(st.lists(st.booleans(), min_size=15, max_size=15))
def test_a_shared_group_is_exactly_a_pair_not_separated(bits):
    names = list("abcdef")
    separated = np.zeros((6, 6), dtype=bool)
    for bit, (i, j) in zip(bits, [(i, j) for i in range(6) for j in range(i + 1, 6)]):
        separated[i, j] = separated[j, i] = bit
    groups = not_separated_groups(names, separated)
    for i in range(6):
        for j in range(i + 1, 6):
            shared = any(names[i] in group and names[j] in group for group in groups)
            assert shared == (not separated[i, j])
    assert all(not any(set(g) < set(h) for h in groups) for g in groups)  # largest sets only
