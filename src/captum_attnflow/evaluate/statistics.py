"""How sure the comparison is: bootstrap intervals of means, paired tests between methods on the
same examples, and a ranking that says which differences are not significant."""

from __future__ import annotations

import math
import string
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

import numpy as np

from captum_attnflow.evaluate.tables import markdown_table

N_RESAMPLES = 9999
# Up to this many pairs, scipy's Wilcoxon test with tied or zero differences is exact over all
# 2^N sign flips (2^13 < N_RESAMPLES); above, it takes the normal approximation.
EXACT_SIGN_FLIPS = 13


class Interval(NamedTuple):
    """A mean over the examples with defined values and its bootstrap confidence interval."""

    mean: float
    low: float
    high: float
    count: int


class PairedTest(NamedTuple):
    """A Wilcoxon signed-rank test of two methods on the same examples."""

    statistic: float
    pvalue: float
    count: int
    mean_difference: float


def bootstrap_interval(
    values: Any, confidence: float = 0.95, n_resamples: int = N_RESAMPLES, seed: int = 0, method: str = "BCa"
) -> Interval:
    """The mean of ``values`` and its bootstrap confidence interval (``scipy.stats.bootstrap``).

    NaN values (undefined for an example) are left out first. The interval is Efron's
    bias-corrected and accelerated one by default (scipy's default, ``method="BCa"``), drawn
    with ``numpy.random.default_rng(seed)``: the same seed gives the same interval.

    Args:
        values: (N,) per-example values, e.g. one method's AOPC on every example.
        confidence: the confidence level, in (0, 1).
        n_resamples: the number of bootstrap resamples.
        seed: the seed of the resampling.
        method: ``"BCa"``, ``"percentile"`` or ``"basic"``, as scipy takes it.

    Returns:
        Interval: ``(mean, low, high, count)``, count the number of defined values. With no
        value everything is NaN; with one value, or values all equal, the interval is the
        mean itself where all are equal and NaN for a single value (no spread to resample).

    Example::

        >>> from captum_attnflow.evaluate import bootstrap_interval
        >>> interval = bootstrap_interval([0.2, 0.4, 0.3, 0.5, 0.1, 0.35], n_resamples=999)
        >>> round(interval.mean, 3), interval.low < interval.mean < interval.high, interval.count
        (0.308, True, 6)
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}.")
    finite = _finite(values, "values")
    if finite.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(finite.mean())
    if finite.size == 1:
        return Interval(mean, math.nan, math.nan, 1)
    if np.all(finite == finite[0]):  # BCa would divide by zero: nothing varies, nothing to resample
        return Interval(mean, mean, mean, int(finite.size))
    from scipy import stats  # on first use: importing scipy.stats takes a while

    result = stats.bootstrap(
        (finite,), np.mean, confidence_level=confidence, n_resamples=n_resamples, method=method,
        random_state=np.random.default_rng(seed),
    )
    interval = result.confidence_interval
    return Interval(mean, float(interval.low), float(interval.high), int(finite.size))


def paired_test(a: Any, b: Any, alternative: str = "two-sided", zero_method: str = "wilcox") -> PairedTest:
    """Wilcoxon signed-rank test of the differences ``a - b`` on the same examples (``scipy.stats.wilcoxon``).

    Examples where either value is NaN are left out. With ``zero_method="wilcox"`` (scipy's
    default) examples on which the methods score the same are dropped before ranking; when
    every difference is zero there is no evidence of a difference: p = 1 (scipy refuses or
    warns there). With at most ``EXACT_SIGN_FLIPS`` pairs and tied or zero differences the
    p-value is exact, over all :math:`2^N` sign flips of the differences, as scipy's own
    ``method="auto"`` chooses there; scipy evaluates its statistic once per flip (about 1.6 s
    for 12 pairs), while the ranks of :math:`|a - b|` do not change under a flip, so here
    the statistic of every flip is one product with the fixed ranks.

    Args:
        a, b: (N,) per-example values of two methods, aligned by example.
        alternative: ``"two-sided"``, ``"greater"`` (a's values tend to be larger) or ``"less"``.
        zero_method: ``"wilcox"``, ``"pratt"`` or ``"zsplit"``, as scipy takes it.

    Returns:
        PairedTest: ``(statistic, pvalue, count, mean_difference)``, count the number of pairs
        with both values defined; statistic and p-value NaN when there is none.

    Example::

        >>> from captum_attnflow.evaluate import paired_test
        >>> test = paired_test([0.9, 0.8, 0.7, 0.9, 0.6, 0.8, 0.9], [0.1, 0.2, 0.3, 0.4, 0.2, 0.1, 0.3])
        >>> round(test.pvalue, 4), test.count
        (0.0156, 7)
    """
    a, b = _finite_pairs(a, b)
    if a.size == 0:
        return PairedTest(math.nan, math.nan, 0, math.nan)
    difference = a - b
    if np.all(difference == 0):
        return PairedTest(0.0, 1.0, int(a.size), 0.0)
    from scipy import stats

    if difference.size <= EXACT_SIGN_FLIPS and _has_ties_or_zeros(difference):
        statistic = stats.wilcoxon(a, b, zero_method=zero_method, alternative=alternative, method="asymptotic").statistic
        pvalue = _sign_flip_pvalue(difference, zero_method, alternative)
    else:
        result = stats.wilcoxon(a, b, zero_method=zero_method, alternative=alternative)
        statistic, pvalue = result.statistic, result.pvalue
    return PairedTest(float(statistic), float(pvalue), int(a.size), float(difference.mean()))


def _has_ties_or_zeros(difference: np.ndarray) -> bool:
    magnitudes = np.abs(difference[difference != 0])
    return magnitudes.size < difference.size or np.unique(magnitudes).size < magnitudes.size


def _sign_flip_pvalue(difference: np.ndarray, zero_method: str, alternative: str) -> float:
    """The exact p-value of the signed-rank sum :math:`R^+ = \\sum_{d_i > 0} r_i` over every sign flip of ``difference``.

    The ranks :math:`r_i` of :math:`|d_i|` (average ranks of ties; zeros left out for
    ``"wilcox"``, ranked but never positive for ``"pratt"``, half counted for ``"zsplit"``)
    are those of ``scipy.stats.wilcoxon``, and so is the p-value (``permutation_test``,
    samples permuted: signs flipped).
    """
    from scipy import stats

    nonzero = difference != 0
    ranks = np.zeros(difference.size)
    if zero_method == "wilcox":
        ranks[nonzero] = stats.rankdata(np.abs(difference[nonzero]))
    else:
        ranks = stats.rankdata(np.abs(difference))
    constant = ranks[~nonzero].sum() / 2 if zero_method == "zsplit" else 0.0

    def positive_rank_sum(flipped: np.ndarray, axis: int) -> np.ndarray:
        return np.sum((flipped > 0) * ranks, axis=axis) + constant

    result = stats.permutation_test(
        (difference,), positive_rank_sum, permutation_type="samples", vectorized=True, alternative=alternative,
        n_resamples=N_RESAMPLES, axis=-1,
    )
    return float(result.pvalue)


def holm(pvalues: Any) -> np.ndarray:
    """Holm's step-down adjustment of p-values for testing several hypotheses at once.

    The :math:`i`-th smallest of :math:`m` p-values becomes
    :math:`\\min(1, \\max_{j \\le i} (m - j + 1) p_{(j)})`; rejecting where the adjusted value is
    below :math:`\\alpha` keeps the chance of any false rejection below :math:`\\alpha` (Holm 1979).

    Args:
        pvalues: any shape; NaN entries are left out (and stay NaN), m counts the others.

    Returns:
        numpy.ndarray: float64, the shape of ``pvalues``.

    Example::

        >>> from captum_attnflow.evaluate.statistics import holm
        >>> holm([0.01, 0.04, 0.03]).round(2).tolist()
        [0.03, 0.06, 0.06]
    """
    values = np.asarray(pvalues, dtype=np.float64)
    flat = values.ravel()
    adjusted = np.full_like(flat, np.nan)
    defined = np.flatnonzero(~np.isnan(flat))
    order = defined[np.argsort(flat[defined], kind="stable")]
    m = order.size
    scaled = (m - np.arange(m)) * flat[order]
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate(scaled))
    return adjusted.reshape(values.shape)


@dataclass(frozen=True)
class Ranking:
    """Methods ranked by their mean on the same examples, with which differences are significant.

    Attributes:
        names: the methods, best mean first (undefined means last).
        intervals: ``{name: Interval}``, each mean with its bootstrap interval.
        pvalues: (M, M) float64, Holm-adjusted p-values of the Wilcoxon signed-rank test of
            every pair, rows and columns in the order of ``names``, NaN on the diagonal.
        ranks: ``{name: rank}``, 1 + the number of methods with a better mean: the order of
            ``names``, methods with equal means sharing a rank (and undefined ones last).
        groups: ``{name: letters}``, methods that share a letter are not significantly
            different; see :func:`not_separated_groups`. "" for a method with an undefined mean.
        higher_is_better: the direction the metric was ranked in.
        alpha: the significance level.
    """

    names: list
    intervals: dict
    pvalues: np.ndarray
    ranks: dict
    groups: dict
    higher_is_better: bool
    alpha: float

    def not_different(self, name: str) -> list[str]:
        """The methods whose difference from ``name`` is not significant (adjusted p >= alpha or
        undefined), best first."""
        row = self.pvalues[self.names.index(name)]
        return [other for other, p in zip(self.names, row) if other != name and not p < self.alpha]

    def rows(self) -> list[dict]:
        """One dict per method, best first: ``name``, ``mean``, ``low``, ``high``, ``count``,
        ``rank``, ``group`` (its letters) and ``not_different`` (a list of names)."""
        return [
            dict(name=name, **self.intervals[name]._asdict(), rank=self.ranks[name], group=self.groups[name],
                 not_different=self.not_different(name))
            for name in self.names
        ]

    def to_markdown(self, digits: int = 3, title: str | None = None) -> str:
        """A table, best mean first: rank, method, mean [interval], group letters, examples, and
        the methods it is not significantly different from."""
        direction = "higher" if self.higher_is_better else "lower"
        lines = [title] if title else []
        lines += [
            f"Ranked by mean ({direction} is better); {GROUPS_RULE.format(alpha=self.alpha)}",
            "",
        ]
        table = [
            [row["rank"], row["name"], format_interval(Interval(row["mean"], row["low"], row["high"], row["count"]), digits),
             row["group"], row["count"], ", ".join(row["not_different"])]
            for row in self.rows()
        ]
        header = ["rank", "method", "mean [CI]", "group", "examples", "not significantly different from"]
        return "\n".join(lines + markdown_table(header, table))


def rank_methods(
    per_example: Mapping[str, Any],
    higher_is_better: bool = True,
    alpha: float = 0.05,
    confidence: float = 0.95,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
) -> Ranking:
    """Rank methods by their mean over the same examples, with bootstrap intervals and paired tests.

    Every pair of methods is compared by :func:`paired_test` on the examples where both are
    defined; the :math:`M(M - 1)/2` p-values are adjusted together by :func:`holm`, so "not
    significantly different" holds for the whole table at level ``alpha``. The methods are
    ordered by mean, a method's rank is its place in that order, and the groups say which
    differences the tests cannot establish: two methods share a group letter exactly when
    their adjusted p-value is not below ``alpha`` (:func:`not_separated_groups`).

    Args:
        per_example: ``{method: (N,) values}``, all on the same N examples in the same order
            (NaN for an example where a method's value is undefined).
        higher_is_better: the direction of the metric (e.g. False for AOPC sufficiency).
        alpha: the significance level of the adjusted tests.
        confidence, n_resamples, seed: the bootstrap intervals', see :func:`bootstrap_interval`.

    Returns:
        Ranking: the order, intervals, adjusted p-values and ranks.

    Example::

        >>> import numpy as np
        >>> from captum_attnflow.evaluate import rank_methods
        >>> noise = np.random.default_rng(0).normal(0, 0.05, (3, 30))
        >>> ranking = rank_methods({"a": 0.3 + noise[0], "b": 0.29 + noise[1], "c": 0.1 + noise[2]}, n_resamples=999)
        >>> ranking.names, ranking.ranks
        (['b', 'a', 'c'], {'b': 1, 'a': 2, 'c': 3})
        >>> ranking.groups  # b and a are not separated by the tests; c is
        {'b': 'a', 'a': 'a', 'c': 'b'}
        >>> ranking.not_different("b")
        ['a']
    """
    if not isinstance(per_example, Mapping) or not per_example:
        raise TypeError("per_example must be a non-empty mapping {method: (N,) values}.")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}.")
    values = {name: _values(array, f"per_example[{name!r}]") for name, array in per_example.items()}
    sizes = {name: array.size for name, array in values.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(f"every method must have one value per example, the same N; got {sizes}.")
    intervals = {name: bootstrap_interval(array, confidence, n_resamples, seed) for name, array in values.items()}
    sign = 1.0 if higher_is_better else -1.0
    names = sorted(values, key=lambda name: (math.isnan(intervals[name].mean), -sign * _or_zero(intervals[name].mean)))
    size = len(names)
    raw = np.full((size, size), np.nan)
    for i in range(size):
        for j in range(i + 1, size):
            raw[i, j] = raw[j, i] = paired_test(values[names[i]], values[names[j]]).pvalue
    upper = np.triu_indices(size, 1)
    pvalues = np.full((size, size), np.nan)
    pvalues[upper] = holm(raw[upper])
    pvalues.T[upper] = pvalues[upper]
    ranks = {name: 1 + sum(1 for other in names if _better(intervals[other].mean, intervals[name].mean, sign)) for name in names}
    defined = sum(1 for name in names if not math.isnan(intervals[name].mean))  # undefined means are last
    letters = group_letters(not_separated_groups(names[:defined], (pvalues < alpha)[:defined, :defined]))
    groups = {name: letters.get(name, "") for name in names}
    return Ranking(names, intervals, pvalues, ranks, groups, higher_is_better, alpha)


GROUPS_RULE = (
    "methods sharing a group letter are not significantly different (Wilcoxon signed-rank, "
    "Holm-adjusted, alpha = {alpha:g}); each letter is a largest set of which no pair differs"
)


def not_separated_groups(names: list, separated: Any) -> list[list]:
    """The largest sets of methods of which no two are separated: the maximal cliques of the
    graph joining every pair that is not.

    Two methods share a group exactly when they are not separated (every pair of a clique is
    joined, and every joined pair lies in some maximal clique), and every pair inside a group
    is not separated. These are the bars of a critical-difference diagram and the letters of a
    compact letter display (Piepho, 2004).

    Args:
        names: the methods, best first.
        separated: (M, M) booleans, True where the pair's test is significant (the diagonal
            is ignored).

    Returns:
        list[list]: the groups, each in the order of ``names``, ordered by their members'
        places (the group of the best method first); a method separated from all others is
        a group of its own.

    Example::

        >>> import numpy as np
        >>> from captum_attnflow.evaluate.statistics import not_separated_groups
        >>> separated = np.array([[0, 0, 1], [0, 0, 0], [1, 0, 0]], dtype=bool)  # only a and c differ
        >>> not_separated_groups(["a", "b", "c"], separated)
        [['a', 'b'], ['b', 'c']]
    """
    import networkx as nx

    separated = np.asarray(separated, dtype=bool)
    if separated.shape != (len(names), len(names)):
        raise ValueError(f"separated must be ({len(names)}, {len(names)}), one row and column per name; got {separated.shape}.")
    graph = nx.Graph()
    graph.add_nodes_from(range(len(names)))
    graph.add_edges_from((i, j) for i in range(len(names)) for j in range(i + 1, len(names)) if not (separated[i, j] or separated[j, i]))
    cliques = sorted(sorted(clique) for clique in nx.find_cliques(graph))
    return [[names[i] for i in clique] for clique in cliques]


def group_letters(groups: list[list]) -> dict:
    """``{name: letters}``: the letters (a, b, ...) of the groups each name is in, in order;
    with more than 52 groups they are named g1, g2, ... and joined by commas.

    Example::

        >>> from captum_attnflow.evaluate.statistics import group_letters
        >>> group_letters([["a", "b"], ["b", "c"]])
        {'a': 'a', 'b': 'ab', 'c': 'b'}
    """
    alphabet = string.ascii_lowercase + string.ascii_uppercase
    labels = list(alphabet[: len(groups)]) if len(groups) <= len(alphabet) else [f"g{i + 1}" for i in range(len(groups))]
    joiner = "" if len(groups) <= len(alphabet) else ","
    letters: dict = {}
    for label, group in zip(labels, groups):
        for name in group:
            letters.setdefault(name, []).append(label)
    return {name: joiner.join(found) for name, found in letters.items()}


def format_interval(interval: Interval, digits: int = 3) -> str:
    """``"mean [low, high]"``; ``"-"`` for an undefined mean.

    Example::

        >>> from captum_attnflow.evaluate.statistics import Interval, format_interval
        >>> format_interval(Interval(0.25, 0.2, 0.31, 40), digits=2)
        '0.25 [0.20, 0.31]'
    """
    if math.isnan(interval.mean):
        return "-"
    return f"{interval.mean:.{digits}f} [{interval.low:.{digits}f}, {interval.high:.{digits}f}]"


def _or_zero(value: float) -> float:
    return 0.0 if math.isnan(value) else value


def _better(mean: float, than: float, sign: float) -> bool:
    """Whether ``mean`` comes before ``than`` in the ranking: larger in the direction, or
    defined where ``than`` is not."""
    if math.isnan(mean):
        return False
    return math.isnan(than) or sign * (mean - than) > 0


def _values(values: Any, name: str) -> np.ndarray:
    array = np.asarray(values.detach().cpu() if hasattr(values, "detach") else values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be (N,) per-example values, got shape {array.shape}.")
    return array


def _finite(values: Any, name: str) -> np.ndarray:
    array = _values(values, name)
    return array[~np.isnan(array)]


def _finite_pairs(a: Any, b: Any) -> tuple[np.ndarray, np.ndarray]:
    a, b = _values(a, "a"), _values(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"a and b must hold one value per example of the same examples, got {a.shape} and {b.shape}.")
    both = ~np.isnan(a) & ~np.isnan(b)
    return a[both], b[both]
