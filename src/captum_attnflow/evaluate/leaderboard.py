"""Faithfulness per method and layer as tables and plots: means with bootstrap intervals and
rankings with paired tests, from per-example values; across metrics, a critical-difference
diagram."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from captum_attnflow.evaluate.metrics import higher_is_better as metric_direction
from captum_attnflow.evaluate.panels import draw_method, label_panel, method_rows, panel_axes
from captum_attnflow.evaluate.statistics import GROUPS_RULE, N_RESAMPLES, Ranking, format_interval, rank_methods
from captum_attnflow.evaluate.tables import layer_column, layer_columns, layer_row, markdown_table, undefined_counts

if TYPE_CHECKING:
    from captum_attnflow.evaluate.friedman import CriticalDifference

Key = tuple  # (method, metric, layer): layer 1..L, or None for a method without layers


class Leaderboard:
    """Every method's faithfulness, per metric and layer, with how sure the differences are.

    For each metric all its (method, layer) entries are ranked together by
    :func:`~captum_attnflow.evaluate.rank_methods`: ordered by mean, with bootstrap intervals,
    Wilcoxon signed-rank tests of every pair on the same examples, Holm-adjusted over the
    metric's pairs, and group letters shared by the entries no test separates. An entry is
    named ``method`` for a method without layers and ``method L3`` for layer 3 of a per-layer
    one. Across metrics, :meth:`critical_difference` ranks the methods in every metric and
    tests the average ranks (Friedman, then Nemenyi; Demšar 2006).

    Args:
        values: ``{(method, metric, layer): (N,) values}``, all on the same N examples in the
            same order, NaN where undefined (what
            :meth:`~captum_attnflow.evaluate.ComparisonResult.leaderboard` passes).
        higher_is_better: ``{metric: bool}`` for metric names other than those of the
            Evaluator (``"comprehensiveness"``, ``"sufficiency"``, ``"log-odds"``,
            ``"deletion-area"``, ``"subject-first"``, ``"positive-perturbation"``,
            ``"negative-perturbation"``) and the context metrics (``"top-3-drop"``, ``"lds"``,
            ``"precision@1"``, ``"recall@5"``), whose direction is known.
        alpha: the significance level of the adjusted tests.
        confidence, n_resamples, seed: the bootstrap intervals', see
            :func:`~captum_attnflow.evaluate.bootstrap_interval`.

    Example::

        >>> import numpy as np
        >>> from captum_attnflow.evaluate import Leaderboard
        >>> noise = np.random.default_rng(0).normal(0, 0.05, (3, 30))
        >>> board = Leaderboard.from_values({"comprehensiveness": {
        ...     "rollout": 0.3 + noise[0], "raw": 0.29 + noise[1], "random": 0.1 + noise[2]}}, n_resamples=999)
        >>> board.ranking("comprehensiveness").groups
        {'raw': 'a', 'rollout': 'a', 'random': 'b'}
        >>> print(board.to_markdown(digits=2))
        comprehensiveness (higher is better; 30 examples; mean [95% CI] and group, best mean first)
        <BLANKLINE>
        | method | score |
        |---|---|
        | raw | 0.30 [0.29, 0.32] a |
        | rollout | 0.29 [0.28, 0.31] a |
        | random | 0.11 [0.09, 0.13] b |
        <BLANKLINE>
        Best: raw; not significantly different from it: rollout
        Groups: methods sharing a group letter are not significantly different (Wilcoxon signed-rank, Holm-adjusted, alpha = 0.05); each letter is a largest set of which no pair differs
    """

    def __init__(
        self,
        values: Mapping[Key, Any],
        higher_is_better: Mapping[str, bool] | None = None,
        alpha: float = 0.05,
        confidence: float = 0.95,
        n_resamples: int = N_RESAMPLES,
        seed: int = 0,
    ) -> None:
        if not isinstance(values, Mapping) or not values:
            raise TypeError("values must be a non-empty mapping {(method, metric, layer): (N,) values}.")
        for key in values:
            if not isinstance(key, tuple) or len(key) != 3:
                raise TypeError(f"values must be keyed by (method, metric, layer) tuples, got {key!r}.")
        self.values = {key: np.asarray(value, dtype=np.float64) for key, value in values.items()}
        given = dict(higher_is_better or {})
        self.higher_is_better = {metric: given[metric] if metric in given else metric_direction(metric) for metric in self.metrics}
        self.alpha, self.confidence, self.n_resamples, self.seed = alpha, confidence, n_resamples, seed
        self._rankings: dict[str, Ranking] = {}

    @classmethod
    def from_values(cls, values: Mapping[str, Mapping[str, Any]], **kwargs: Any) -> "Leaderboard":
        """A leaderboard of methods without layers from ``{metric: {method: (N,) values}}``
        (e.g. one benchmark run per method); ``kwargs`` as the constructor's."""
        return cls({(method, metric, None): array for metric, by_method in values.items() for method, array in by_method.items()}, **kwargs)

    @property
    def metrics(self) -> list[str]:
        """The metric names, in the order of ``values``."""
        return list(dict.fromkeys(key[1] for key in self.values))

    def ranking(self, metric: str) -> Ranking:
        """The ranking of every (method, layer) entry of ``metric`` (computed once).

        Returns:
            Ranking: entries named ``method`` or ``method L<layer>``; see
            :func:`~captum_attnflow.evaluate.rank_methods`.
        """
        if metric not in self.higher_is_better:
            raise ValueError(f"no metric {metric!r}; the leaderboard holds {self.metrics}.")
        if metric not in self._rankings:
            entries = {_entry(method, layer): value for (method, name, layer), value in self.values.items() if name == metric}
            self._rankings[metric] = rank_methods(
                entries, self.higher_is_better[metric], self.alpha, self.confidence, self.n_resamples, self.seed
            )
        return self._rankings[metric]

    def critical_difference(
        self, metrics: Sequence[str] | None = None, names: Callable[[str], str] | None = None, alpha: float | None = None
    ) -> CriticalDifference:
        """Every entry ranked within each metric by its mean, the average ranks compared across
        the metrics: Friedman's test, then Nemenyi's (see
        :func:`~captum_attnflow.evaluate.friedman.critical_difference`).

        Each metric is one block (Demšar's data set), each entry's score there its mean over
        the examples, ranked in the metric's direction.

        Args:
            metrics: the blocks, default every metric.
            names: maps an entry's name to the method it stands for in every metric (e.g. the
                benchmark's ``rollout L6`` and ``rollout L4``, the last layers of two models, to
                one ``rollout (last layer)``); default the names as they are.
            alpha: the tests' level; default the leaderboard's.

        Returns:
            CriticalDifference: its ``plot()`` draws the diagram.

        Raises:
            ValueError: an unknown metric, two entries of one metric given the same name, or
                too few blocks or methods for the tests.

        Example::

            >>> import numpy as np
            >>> noise = np.random.default_rng(0).normal(0, 0.05, (6, 3, 20))
            >>> board = Leaderboard.from_values({f"task {t}: comprehensiveness": {"rollout": 0.3 + noise[t, 0],
            ...     "raw": 0.25 + noise[t, 1], "random": 0.1 + noise[t, 2]} for t in range(6)},
            ...     higher_is_better={f"task {t}: comprehensiveness": True for t in range(6)}, n_resamples=99)
            >>> board.critical_difference().names
            ['rollout', 'raw', 'random']
        """
        from captum_attnflow.evaluate.friedman import critical_difference

        metrics = self.metrics if metrics is None else list(metrics)
        if unknown := [metric for metric in metrics if metric not in self.higher_is_better]:
            raise ValueError(f"no metrics {unknown}; the leaderboard holds {self.metrics}.")
        rename = names or str
        scores = {}
        for metric in metrics:
            means = self.ranking(metric).intervals
            scores[metric] = {rename(entry): interval.mean for entry, interval in means.items()}
            if len(scores[metric]) < len(means):
                raise ValueError(f"names gives two entries of {metric!r} the same name: {sorted(map(rename, means))}.")
        return critical_difference(scores, {metric: self.higher_is_better[metric] for metric in metrics},
                                   self.alpha if alpha is None else alpha)

    def summary(self) -> list[dict]:
        """One row per (method, metric, layer): ``method``, ``metric``, ``layer`` (None for
        methods without layers), ``mean``, ``low``, ``high`` (the bootstrap interval),
        ``count`` (defined values), ``nan_count``, ``rank`` (the place by mean), ``group``
        (the letters it shares with the entries no test separates from it) and
        ``not_different`` (the entries of the same metric whose difference from this one is
        not significant)."""
        rows = []
        for (method, metric, layer), value in self.values.items():
            ranking = self.ranking(metric)
            entry = _entry(method, layer)
            interval = ranking.intervals[entry]
            rows.append(dict(
                method=method, metric=metric, layer=layer, mean=interval.mean, low=interval.low, high=interval.high,
                count=interval.count, nan_count=int(value.size - interval.count), rank=ranking.ranks[entry],
                group=ranking.groups[entry], not_different=ranking.not_different(entry),
            ))
        return rows

    def to_markdown(self, digits: int = 3) -> str:
        """One table per metric, methods as rows sorted by mean (a method by its best entry),
        best first, and layers L1..Ln as columns (a ``score`` column for methods without
        layers), cells "mean [low, high] letters"; under it the best entry, those not
        significantly different from it, and what the group letters mean (see the class
        example)."""
        blocks = []
        for metric in self.metrics:
            ranking = self.ranking(metric)
            rows = [row for row in self.summary() if row["metric"] == metric]
            columns = layer_columns(rows)
            direction = "higher" if self.higher_is_better[metric] else "lower"
            count = max(row["count"] + row["nan_count"] for row in rows)
            methods = sorted(dict.fromkeys(row["method"] for row in rows), key=lambda method: min(
                ranking.names.index(_entry(method, row["layer"])) for row in rows if row["method"] == method))
            table = []
            for method in methods:
                cells = {
                    layer_column(row["layer"]): format_interval(ranking.intervals[_entry(method, row["layer"])], digits) + f" {row['group']}"
                    for row in rows if row["method"] == method
                }
                table.append(layer_row(method, cells, columns))
            best = ranking.names[0]
            lines = [
                f"{metric} ({direction} is better; {count} examples; mean [{self.confidence:.0%} CI] and group, best mean first)",
                "",
                *markdown_table(["method", *columns], table),
                "",
                f"Best: {best}; not significantly different from it: " + (", ".join(ranking.not_different(best)) or "none"),
                "Groups: " + GROUPS_RULE.format(alpha=self.alpha),
            ]
            if undefined := undefined_counts(rows):
                lines.append("Undefined, left out (examples, most in any layer): " + undefined)
            blocks.append("\n".join(lines))
        return "\n\n".join(blocks)

    def to_csv(self, path: str | Path) -> None:
        """Write :meth:`summary`, one row per (method, metric, layer); layer empty for methods
        without layers, ``not_different`` joined by "; ".

        Example::

            >>> import tempfile
            >>> board = Leaderboard({("raw", "sufficiency", 1): [0.2, 0.4, 0.3]}, n_resamples=99)
            >>> with tempfile.TemporaryDirectory() as folder:
            ...     board.to_csv(f"{folder}/faithfulness.csv")
            ...     print(open(f"{folder}/faithfulness.csv").read().splitlines()[0])
            method,metric,layer,mean,low,high,count,nan_count,rank,group,not_different
        """
        fields = ["method", "metric", "layer", "mean", "low", "high", "count", "nan_count", "rank", "group", "not_different"]
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fields)
            writer.writeheader()
            for row in self.summary():
                writer.writerow({
                    **row, "layer": "" if row["layer"] is None else row["layer"], "not_different": "; ".join(row["not_different"]),
                })

    def save(self, path: str | Path, compress: bool = False) -> list[Path]:
        """Write the per-example values, directions and settings as JSON + safetensors (one
        zip with ``compress=True``), see :mod:`captum_attnflow.saving`; the rankings are
        computed again on load. Returns the files written.

        Example::

            >>> import tempfile
            >>> board = Leaderboard({("raw", "sufficiency", 1): [0.2, 0.4, 0.3]}, n_resamples=99)
            >>> with tempfile.TemporaryDirectory() as folder:
            ...     loaded = Leaderboard.load(board.save(f"{folder}/board.json")[0])
            >>> loaded == board
            True
        """
        from captum_attnflow.saving import save_result

        keys = list(self.values)
        fields = dict(keys=keys, higher_is_better=self.higher_is_better, alpha=self.alpha, confidence=self.confidence,
                      n_resamples=self.n_resamples, seed=self.seed)
        return save_result(path, "Leaderboard", fields, {f"values/{i}": self.values[key] for i, key in enumerate(keys)}, compress)

    @classmethod
    def load(cls, path: str | Path) -> "Leaderboard":
        """Read a leaderboard written by :meth:`save` (example there).

        Raises:
            ValueError: not such a file (a damaged one included), or one of a newer format version.
        """
        from captum_attnflow.saving import load_result

        fields, arrays = load_result(path, "Leaderboard")
        values = {tuple(key): arrays[f"values/{i}"] for i, key in enumerate(fields["keys"])}
        return cls(values, fields["higher_is_better"], fields["alpha"], fields["confidence"], fields["n_resamples"], fields["seed"])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Leaderboard):
            return NotImplemented
        settings = (self.higher_is_better, self.alpha, self.confidence, self.n_resamples, self.seed)
        return settings == (other.higher_is_better, other.alpha, other.confidence, other.n_resamples, other.seed) and (
            list(self.values) == list(other.values)
            and all(np.array_equal(self.values[key], other.values[key], equal_nan=True) for key in self.values)
        )

    def plot(self, ax=None, kind: str | None = None, **kwargs):
        """Matplotlib figure, one panel per metric: forest plots (methods by mean, best on
        top, intervals as bars, see :func:`~captum_attnflow.visualize.forest.plot_forest`),
        or, for per-layer methods, layers on x with one line and confidence band per method
        (methods without layers as a dashed line and band).

        Args:
            ax: one matplotlib axes per metric (an array of them, or one axes for one metric);
                None (default) makes a new figure, not registered with pyplot.
            kind: ``"forest"`` or ``"layers"``; None (default) draws layers when some method
                has several layers, else forest plots.
            kwargs: passed on to :func:`~captum_attnflow.visualize.forest.plot_forest`
                (``floor``, ``columns``, ``title``, ``metrics``).

        Returns:
            matplotlib.figure.Figure: the figure drawn on.

        Example::

            >>> board = Leaderboard({("raw", "log-odds", 1): [-0.2, -0.4, -0.3], ("raw", "log-odds", 2): [-0.5, -0.1, -0.3]},
            ...     n_resamples=99)
            >>> len(board.plot().axes), board.plot().axes[0].get_xlabel()  # one panel per metric, over layers
            (1, 'layer')
            >>> board.plot(kind="forest").axes[0].get_yticklabels()[0].get_text()  # the best entry on top (a tie here)
            'raw L1'
        """
        if kind not in (None, "forest", "layers"):
            raise ValueError(f"kind must be 'forest', 'layers' or None, got {kind!r}.")
        layered = any(sum(1 for key in self.values if key[:2] == (method, metric)) > 1 for method, metric, _ in self.values)
        if kind == "forest" or (kind is None and not layered):
            from captum_attnflow.visualize.forest import plot_forest

            return plot_forest(self, ax=ax, **kwargs)
        if kwargs:
            raise ValueError(f"{sorted(kwargs)} are options of the forest plot: pass kind='forest' with them.")
        metrics = self.metrics
        figure, axes = panel_axes(ax, len(metrics), "metric")
        rows = self.summary()
        for axes_, metric in zip(axes, metrics):
            for color, method, points in method_rows(row for row in rows if row["metric"] == metric):
                mean, low, high = (np.array([row[name] for row in points]) for name in ("mean", "low", "high"))
                draw_method(axes_, points, mean, low, high, color, method)
            label_panel(axes_, f"{metric} ({'higher' if self.higher_is_better[metric] else 'lower'} is better)", metric)
        return figure


def _entry(method: str, layer: int | None) -> str:
    return method if layer is None else f"{method} L{layer}"

