"""Many methods over many blocks (tasks, metrics): Friedman's test of the methods' ranks, the
Nemenyi test of every pair, and the groups a critical-difference diagram draws (Demšar, JMLR 2006)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from captum_attnflow.evaluate.statistics import group_letters, not_separated_groups
from captum_attnflow.evaluate.tables import markdown_table


@dataclass(frozen=True)
class CriticalDifference:
    """Methods ranked in every block, their average ranks, and which the tests cannot tell apart.

    Attributes:
        names: the methods, best (lowest) average rank first.
        blocks: the block names, in the order of the rows of ``scores``.
        scores: (N, k) float64, each method's score in each block, columns in the order of
            ``names``.
        ranks: (N, k) float64, the ranks within each block, 1 for the best score in the
            block's direction, ties sharing their average rank.
        average_ranks: ``{name: mean rank over the blocks}``.
        statistic, pvalue: Friedman's chi-square and its p-value
            (``scipy.stats.friedmanchisquare``).
        pvalues: (k, k) float64, the Nemenyi test's p-values
            (``scikit_posthocs.posthoc_nemenyi_friedman``), 1 on the diagonal.
        critical_difference: Nemenyi's critical difference of average ranks at ``alpha``,
            :math:`q_\\alpha \\sqrt{k (k + 1) / (6 N)}`: average ranks further apart than it
            differ significantly.
        left_out: methods without a score in some block, not compared.
        alpha: the significance level.
    """

    names: list
    blocks: list
    scores: np.ndarray
    ranks: np.ndarray
    average_ranks: dict
    statistic: float
    pvalue: float
    pvalues: np.ndarray
    critical_difference: float
    left_out: list
    alpha: float

    @property
    def groups(self) -> list[list[str]]:
        """The largest sets of methods of which no pair is :meth:`separated`, best first (see
        :func:`~captum_attnflow.evaluate.statistics.not_separated_groups`): the diagram's bars."""
        return not_separated_groups(self.names, self.separated())

    def separated(self) -> np.ndarray:
        """(k, k) booleans, True where the pair differs significantly: Friedman's test rejects
        and the pair's Nemenyi p-value is below ``alpha`` (Demšar's procedure: no post-hoc
        conclusion without the omnibus test)."""
        return (self.pvalue < self.alpha) & (self.pvalues < self.alpha)

    def to_markdown(self, digits: int = 2) -> str:
        """The average ranks, best first, with each method's groups (letters, as in the
        diagram's bars), then the tests.

        Example::

            >>> from captum_attnflow.evaluate.friedman import critical_difference
            >>> table = {f"task {i}": {"a": 0.9 - 0.01 * i, "b": 0.5, "c": 0.1 + 0.01 * i} for i in range(6)}
            >>> print(critical_difference(table).to_markdown())
            | average rank | method | group |
            |---|---|---|
            | 1.00 | a | a |
            | 2.00 | b | ab |
            | 3.00 | c | b |
            <BLANKLINE>
            6 blocks, 3 methods: Friedman chi-square 12.00, p = 0.0025; Nemenyi critical difference 1.35 (alpha = 0.05)
        """
        letters = group_letters(self.groups)
        table = [[f"{self.average_ranks[name]:.{digits}f}", name, letters[name]] for name in self.names]
        lines = markdown_table(["average rank", "method", "group"], table)
        lines += ["", f"{len(self.blocks)} blocks, {len(self.names)} methods: Friedman chi-square {self.statistic:.{digits}f}, "
                  f"p = {self.pvalue:.2g}; Nemenyi critical difference {self.critical_difference:.{digits}f} (alpha = {self.alpha:g})"]
        if self.left_out:
            lines.append("Left out (no score in some block): " + ", ".join(self.left_out))
        return "\n".join(lines)

    def plot(self, floor: str | None = "random", ax: Any = None, title: str | None = None):
        """The critical-difference diagram, see
        :func:`~captum_attnflow.visualize.critical_difference.plot_critical_difference`."""
        from captum_attnflow.visualize.critical_difference import plot_critical_difference

        return plot_critical_difference(self, floor, ax, title)


def critical_difference(
    scores: Mapping[str, Mapping[str, float]],
    higher_is_better: bool | Mapping[str, bool] = True,
    alpha: float = 0.05,
) -> CriticalDifference:
    """Compare methods over blocks by their ranks: Friedman's test, then the Nemenyi test of every pair.

    In each block the methods are ranked, 1 for the best score, ties sharing their average
    rank; :math:`R_j` is method :math:`j`'s mean rank over the :math:`N` blocks. Friedman's
    statistic :math:`\\chi^2_F = \\frac{12 N}{k (k + 1)} \\left[\\sum_j R_j^2 - \\frac{k (k + 1)^2}{4}\\right]`
    tests whether the :math:`k` methods' ranks differ at all; where it rejects at ``alpha``,
    the Nemenyi test separates two methods whose average ranks differ by more than the
    critical difference :math:`q_\\alpha \\sqrt{k (k + 1) / (6 N)}` (Demšar, JMLR 2006, Sec. 3.2.2).
    The groups are the largest sets of methods of which no pair is separated, the bars of
    the diagram. The tests are scipy's and scikit-posthocs'.

    A block is one setting every method was scored in, e.g. one (task, metric) pair of the
    benchmark with each method's mean over the examples, as Demšar's data sets; blocks should
    be independent, so metrics measured on the same examples make the tests optimistic.

    Args:
        scores: ``{block: {method: score}}``. Methods missing (or NaN) in some block are left
            out and listed in ``left_out``.
        higher_is_better: one direction for every block, or ``{block: bool}``.
        alpha: the significance level of both tests.

    Returns:
        CriticalDifference: the ranks, tests and groups.

    Raises:
        ValueError: fewer than 2 blocks or 3 methods scored in every block, a block without a
            direction, or ``alpha`` outside (0, 1).

    Example::

        >>> from captum_attnflow.evaluate.friedman import critical_difference
        >>> table = {f"task {i}": {"a": 0.9 - 0.01 * i, "b": 0.5, "c": 0.1 + 0.01 * i} for i in range(6)}
        >>> result = critical_difference(table)
        >>> result.average_ranks, result.groups  # a and c differ; b is not separated from either
        ({'a': 1.0, 'b': 2.0, 'c': 3.0}, [['a', 'b'], ['b', 'c']])
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}.")
    if not isinstance(scores, Mapping) or not all(isinstance(row, Mapping) for row in scores.values()):
        raise TypeError("scores must be a mapping {block: {method: score}}.")
    blocks = list(scores)
    directions = {block: higher_is_better for block in blocks} if isinstance(higher_is_better, bool) else dict(higher_is_better)
    if missing := [block for block in blocks if block not in directions]:
        raise ValueError(f"no direction for blocks {missing}: pass higher_is_better={{block: bool}} for every block.")
    methods = list(dict.fromkeys(name for row in scores.values() for name in row))
    kept = [name for name in methods if all(_finite(scores[block].get(name)) for block in blocks)]
    if len(blocks) < 2 or len(kept) < 3:
        raise ValueError(
            f"the diagram needs at least 2 blocks and 3 methods scored in every block; got {len(blocks)} blocks and "
            f"{len(kept)} such methods ({', '.join(kept) or 'none'})."
        )
    from scipy import stats
    import pandas as pd
    import scikit_posthocs

    table = np.array([[float(scores[block][name]) for name in kept] for block in blocks])
    # rank 1 for the best: negate the blocks where higher is better, since ranks ascend
    loss = table * np.array([[-1.0 if directions[block] else 1.0] for block in blocks])
    ranks = stats.rankdata(loss, axis=1, method="average")
    mean = ranks.mean(axis=0)
    order = sorted(range(len(kept)), key=lambda j: (mean[j], j))
    names = [kept[j] for j in order]
    statistic, pvalue = stats.friedmanchisquare(*loss.T)
    nemenyi = scikit_posthocs.posthoc_nemenyi_friedman(pd.DataFrame(loss[:, order], columns=names))
    pvalues = nemenyi.loc[names, names].to_numpy(dtype=np.float64)
    k, n = len(names), len(blocks)
    q = stats.studentized_range.ppf(1 - alpha, k, np.inf) / math.sqrt(2)
    return CriticalDifference(
        names=names, blocks=blocks, scores=table[:, order], ranks=ranks[:, order],
        average_ranks={name: float(mean[j]) for name, j in zip(names, order)}, statistic=float(statistic),
        pvalue=float(pvalue), pvalues=pvalues, critical_difference=float(q * math.sqrt(k * (k + 1) / (6 * n))),
        left_out=[name for name in methods if name not in kept], alpha=alpha,
    )


def _finite(value: Any) -> bool:
    return value is not None and math.isfinite(float(value))
