"""Per-example comparison scores and faithfulness values: summaries, save / load / merge (the tables,
CSV files and figures of the summaries are drawn by :mod:`~captum_attnflow.evaluate.comparison_tables`)."""

from __future__ import annotations

import json
import math
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from captum_attnflow.evaluate.comparison_tables import Beside, comparison_markdown, plot_comparison, write_comparison_csv
from captum_attnflow.evaluate.leaderboard import Leaderboard
from captum_attnflow.evaluate.metrics import higher_is_better as metric_direction
from captum_attnflow.evaluate.statistics import N_RESAMPLES


@dataclass
class ComparisonResult:
    """Spearman correlations per example for every (method, reference, layer), and faithfulness
    values per example for every (method, metric, layer).

    Attributes:
        example_ids: (N,) int64, the index of each example in the data (what makes results of
            interrupted or sharded runs mergeable).
        scores: ``{(method, reference, layer): (N,) float64}``, aligned with ``example_ids``;
            ``layer`` is 1..L for per-layer methods and None for one-map methods. NaN marks an
            undefined correlation (constant scores, fewer than 2 tokens, NaN attributions).
        metrics: ``{(method, metric, layer): (N,) float64}``, the faithfulness values of the
            Evaluator's ``faithfulness=`` option (e.g. AOPC comprehensiveness per example),
            NaN where undefined; tabulated by :meth:`leaderboard`.
        higher_is_better: ``{metric: bool}``, the direction of each metric in ``metrics``;
            filled in for the Evaluator's metric names.

        methods, references: the method and reference names in ``scores`` (and ``metrics``),
            in order (properties).

    Summaries ignore NaN and report how many there were: mean, std (population, ddof=0),
    count (defined correlations) and nan_count, per key. :class:`~captum_attnflow.evaluate.Evaluator`
    returns one; build one yourself from per-example correlations (e.g. of
    :func:`~captum_attnflow.evaluate.compare`) to get the same tables.

    Example::

        >>> import numpy as np
        >>> from captum_attnflow.evaluate import ComparisonResult
        >>> first = ComparisonResult([0, 1], {("rollout", "blank-out", 1): [0.5, 0.7],
        ...                                   ("rollout", "blank-out", 2): [0.1, np.nan]})
        >>> second = ComparisonResult([2], {("rollout", "blank-out", 1): [0.9], ("rollout", "blank-out", 2): [0.3]})
        >>> result = ComparisonResult.merge([first, second])  # e.g. two shards of one run
        >>> len(result), result.methods, result.references
        (3, ['rollout'], ['blank-out'])
        >>> print(result.to_markdown())
        Spearman correlation with blank-out (3 examples, mean ± std)
        <BLANKLINE>
        | method | L1 | L2 |
        |---|---|---|
        | rollout | 0.70 ± 0.16 | 0.20 ± 0.10 |
        <BLANKLINE>
        Left out as undefined (constant scores, < 2 tokens or NaN; examples, most in any layer): rollout: 1
    """

    example_ids: np.ndarray
    scores: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    higher_is_better: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.example_ids = np.asarray(self.example_ids, dtype=np.int64)
        for name in ("scores", "metrics"):
            values = {key: np.asarray(value, dtype=np.float64) for key, value in getattr(self, name).items()}
            for key, value in values.items():
                if value.shape != self.example_ids.shape:
                    raise ValueError(f"{name} {key} have shape {value.shape}, example_ids {self.example_ids.shape}.")
            setattr(self, name, values)
        given = dict(self.higher_is_better)
        names = dict.fromkeys(key[1] for key in self.metrics)
        self.higher_is_better = {name: bool(given[name]) if name in given else metric_direction(name) for name in names}

    def __len__(self) -> int:
        return len(self.example_ids)

    @property
    def methods(self) -> list[str]:
        """The method names, in the order of ``scores``, then of ``metrics``."""
        return list(dict.fromkeys(key[0] for key in [*self.scores, *self.metrics]))

    @property
    def references(self) -> list[str]:
        """The reference names, in the order of ``scores``."""
        return list(dict.fromkeys(key[1] for key in self.scores))

    def summary(self) -> list[dict]:
        """One row per (method, reference, layer) over the examples, NaN left out.

        Returns:
            list[dict]: rows with keys ``method``, ``reference``, ``layer`` (None for one-map
            methods), ``mean``, ``std`` (ddof=0), ``count`` (defined correlations) and
            ``nan_count``; mean and std are NaN when no correlation is defined.

        Example::

            >>> result = ComparisonResult([0, 1, 2], {("raw", "grad", 1): [0.2, 0.4, float("nan")]})
            >>> row = result.summary()[0]
            >>> round(row["mean"], 6), row["count"], row["nan_count"]
            (0.3, 2, 1)
        """
        rows = []
        for (method, reference, layer), values in self.scores.items():
            finite = values[~np.isnan(values)]
            rows.append(
                dict(
                    method=method,
                    reference=reference,
                    layer=layer,
                    mean=float(finite.mean()) if finite.size else math.nan,
                    std=float(finite.std()) if finite.size else math.nan,
                    count=int(finite.size),
                    nan_count=int(values.size - finite.size),
                )
            )
        return rows

    def leaderboard(
        self, alpha: float = 0.05, confidence: float = 0.95, n_resamples: int = N_RESAMPLES, seed: int = 0
    ) -> Leaderboard:
        """The faithfulness values as a :class:`~captum_attnflow.evaluate.Leaderboard`: per
        metric, every (method, layer) with its mean and bootstrap interval, ranked with paired
        Wilcoxon tests (Holm-adjusted); its ``to_markdown``, ``to_csv`` and ``plot`` give the
        tables, file and figure.

        Args:
            alpha: the significance level of the adjusted tests.
            confidence, n_resamples, seed: the bootstrap intervals', see
                :func:`~captum_attnflow.evaluate.bootstrap_interval`.

        Returns:
            Leaderboard: over the examples of this result.

        Raises:
            ValueError: the result holds no faithfulness values (run the Evaluator with
                ``faithfulness=``).

        Example::

            >>> result = ComparisonResult([0, 1, 2], metrics={("raw", "sufficiency", 1): [0.2, 0.4, 0.3],
            ...                                               ("rollout", "sufficiency", 1): [0.1, 0.2, 0.1]})
            >>> result.leaderboard(n_resamples=99).ranking("sufficiency").names  # lower is better
            ['rollout L1', 'raw L1']
        """
        if not self.metrics:
            raise ValueError("this result holds no faithfulness values; run the Evaluator with faithfulness=[...].")
        return Leaderboard(self.metrics, self.higher_is_better, alpha, confidence, n_resamples, seed)

    def to_markdown(self, digits: int = 2, beside: Beside | None = None, names: tuple[str, str] = ("ours", "paper")) -> str:
        """The paper's table layout, one table per reference: methods as rows, layers L1..Ln
        as columns (a ``score`` column for methods without layers), cells "mean ± std".
        Undefined correlations are left out of the means and counted under the table.

        Args:
            digits: decimals of the means and standard deviations.
            beside: published values to print under each method's row,
                ``{(method, reference, layer): (mean, std)}``, e.g. a paper's table.
            names: the labels of the two rows, ``method (ours)`` and ``method (paper)``,
                when ``beside`` is given.

        Returns:
            str: markdown, the tables separated by blank lines (see the class example).

        Example::

            >>> result = ComparisonResult([0, 1], {("raw", "grad", 1): [0.2, 0.4]})
            >>> print(result.to_markdown(beside={("raw", "grad", 1): (0.53, 0.33)}))
            Spearman correlation with grad (2 examples, mean ± std)
            <BLANKLINE>
            | method | L1 |
            |---|---|
            | raw (ours) | 0.30 ± 0.10 |
            | raw (paper) | 0.53 ± 0.33 |
        """
        return comparison_markdown(self.summary(), len(self), digits, beside, names)

    def to_csv(self, path: str | Path, beside: Beside | None = None, names: tuple[str, str] = ("ours", "paper")) -> None:
        """Write the summary, one row per (method, reference, layer); layer is empty for one-map methods.

        Args:
            path: the CSV file to write, with columns method, reference, layer, mean, std,
                count, nan_count (the keys of :meth:`summary`).
            beside, names: published values as in :meth:`to_markdown`, written as two more
                columns ``<names[1]>_mean`` and ``<names[1]>_std`` (empty where absent).

        Example::

            >>> import tempfile
            >>> result = ComparisonResult([0, 1], {("raw", "grad", 1): [0.2, 0.4]})
            >>> with tempfile.TemporaryDirectory() as folder:
            ...     result.to_csv(f"{folder}/table.csv")
            ...     print(open(f"{folder}/table.csv").read().splitlines()[0])
            method,reference,layer,mean,std,count,nan_count
        """
        write_comparison_csv(self.summary(), path, beside, names)

    def plot(self, ax=None, beside: Beside | None = None, names: tuple[str, str] = ("ours", "paper")):
        """Matplotlib figure, one panel per reference: layers on x, one line per method with a
        ±std band; methods without layers as a dashed horizontal line and band.

        Args:
            ax: matplotlib axes to draw on, one per reference (an array of them, or one axes
                for one reference); None (default) makes a new figure.
            beside, names: published means as in :meth:`to_markdown`, drawn as dotted lines
                in each method's colour.

        Returns:
            matplotlib.figure.Figure: the figure drawn on; a new one is not registered with
            pyplot (nothing to close; a notebook shows it once, as the cell's value).

        Example::

            >>> result = ComparisonResult([0, 1], {("raw", "grad", 1): [0.2, 0.4], ("raw", "grad", 2): [0.3, 0.5]})
            >>> figure = result.plot()
            >>> len(figure.axes)  # one panel per reference
            1
        """
        return plot_comparison(self.summary(), ax, beside, names)

    def save(self, path: str | Path, compress: bool = False) -> list[Path]:
        """Save the per-example scores and faithfulness values, to merge, resume or look at later
        with :meth:`load`: JSON (keys, directions) + safetensors (the values) beside it, or one
        zip with ``compress=True`` (see :mod:`captum_attnflow.saving`); a path ending in
        ``.npz`` writes the numpy archive of :meth:`arrays` instead.

        Args:
            path: the file to write (``.json`` or ``.zip`` added when missing).
            compress: one deflated zip.

        Returns:
            list[Path]: the files written.

        Example::

            >>> import tempfile
            >>> result = ComparisonResult([3, 4], {("raw", "grad", 1): [0.2, 0.4]})
            >>> with tempfile.TemporaryDirectory() as folder:
            ...     written = result.save(f"{folder}/scores.json")
            ...     loaded = ComparisonResult.load(written[0])
            >>> loaded.example_ids.tolist(), loaded.scores[("raw", "grad", 1)].tolist(), loaded == result
            ([3, 4], [0.2, 0.4], True)
        """
        if str(path).endswith(".npz"):
            np.savez(path, **self.arrays())
            return [Path(path)]
        from captum_attnflow.saving import save_result

        keys, metric_keys = list(self.scores), list(self.metrics)
        fields = dict(keys=keys, metric_keys=metric_keys, higher_is_better=self.higher_is_better)
        arrays = dict(
            example_ids=self.example_ids,
            **{f"score/{index}": self.scores[key] for index, key in enumerate(keys)},
            **{f"metric/{index}": self.metrics[key] for index, key in enumerate(metric_keys)},
        )
        return save_result(path, "ComparisonResult", fields, arrays, compress)

    @classmethod
    def load(cls, path: str | Path) -> "ComparisonResult":
        """Read a result written by :meth:`save` (example there).

        Args:
            path: the path given to :meth:`save` (with or without its suffix, compressed or
                not), or one it returned (or a ``.npz`` archive).

        Returns:
            ComparisonResult: the same example ids, scores and values.

        Raises:
            ValueError: not such a file (a damaged one included), or one of a newer format version.
        """
        if str(path).endswith(".npz"):
            try:
                with np.load(path) as data:
                    return cls.from_arrays(data)
            except (ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error):
                # not chained: np.load's own message for a file that is no archive suggests unpickling it
                raise ValueError(
                    f"{path} is not a numpy archive that ComparisonResult.save wrote (damaged, or another file): "
                    "save the result again."
                ) from None
        from captum_attnflow.saving import load_result

        fields, arrays = load_result(path, "ComparisonResult")
        return cls(
            arrays["example_ids"],
            {tuple(key): arrays[f"score/{index}"] for index, key in enumerate(fields["keys"])},
            {tuple(key): arrays[f"metric/{index}"] for index, key in enumerate(fields["metric_keys"])},
            fields["higher_is_better"],
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ComparisonResult):
            return NotImplemented
        return (
            np.array_equal(self.example_ids, other.example_ids) and _same_arrays(self.scores, other.scores)
            and _same_arrays(self.metrics, other.metrics) and self.higher_is_better == other.higher_is_better
        )

    def arrays(self) -> dict[str, np.ndarray]:
        """The result as the named arrays :meth:`save` writes: ``example_ids``, ``keys`` and
        ``metric_keys`` (JSON lists of keys), ``score_<i>`` and ``metric_<i>`` (one per key,
        in order), ``higher_is_better`` (JSON)."""
        keys, metric_keys = list(self.scores), list(self.metrics)
        return dict(
            example_ids=self.example_ids,
            keys=np.array(json.dumps(keys)),
            metric_keys=np.array(json.dumps(metric_keys)),
            higher_is_better=np.array(json.dumps(self.higher_is_better)),
            **{f"score_{index}": self.scores[key] for index, key in enumerate(keys)},
            **{f"metric_{index}": self.metrics[key] for index, key in enumerate(metric_keys)},
        )

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> "ComparisonResult":
        """The result from the arrays of :meth:`arrays` (a file written before metrics existed
        has none).

        Raises:
            KeyError, ValueError: arrays are missing or malformed.
        """
        keys = [tuple(key) for key in json.loads(str(arrays["keys"]))]
        metric_keys = [tuple(key) for key in json.loads(str(arrays["metric_keys"]))] if "metric_keys" in arrays else []
        return cls(
            arrays["example_ids"],
            {key: arrays[f"score_{index}"] for index, key in enumerate(keys)},
            {key: arrays[f"metric_{index}"] for index, key in enumerate(metric_keys)},
            json.loads(str(arrays["higher_is_better"])) if "higher_is_better" in arrays else {},
        )

    @classmethod
    def merge(cls, results: Iterable["ComparisonResult"]) -> "ComparisonResult":
        """Join results over disjoint or overlapping example sets (the first one wins on overlap),
        sorted by example id. All must hold the same (method, reference, layer) keys.

        Args:
            results: the results to join; empty ones are skipped.

        Returns:
            ComparisonResult: one entry per distinct example id (empty if all are).

        Raises:
            ValueError: the results hold different keys.

        Example: see the class docstring.
        """
        results = [result for result in results if len(result)]
        if not results:
            return cls(np.zeros(0, dtype=np.int64), {})
        keys, metric_keys = list(results[0].scores), list(results[0].metrics)
        for result in results[1:]:
            different = (set(result.scores) ^ set(keys)) | (set(result.metrics) ^ set(metric_keys))
            if different:
                raise ValueError(
                    f"cannot merge results of different comparisons: keys {sorted(map(str, different))} are in one result only."
                )
            if result.higher_is_better != results[0].higher_is_better:
                raise ValueError(
                    "cannot merge results whose metrics go in different directions: "
                    f"{results[0].higher_is_better} and {result.higher_is_better}."
                )
        ids = np.concatenate([result.example_ids for result in results])
        unique, first = np.unique(ids, return_index=True)
        return cls(
            unique,
            {key: np.concatenate([r.scores[key] for r in results])[first] for key in keys},
            {key: np.concatenate([r.metrics[key] for r in results])[first] for key in metric_keys},
            results[0].higher_is_better,
        )


def _same_arrays(first: Mapping, second: Mapping) -> bool:
    """The same keys in the same order, and equal values (NaN equal to NaN)."""
    return list(first) == list(second) and all(np.array_equal(first[key], second[key], equal_nan=True) for key in first)
