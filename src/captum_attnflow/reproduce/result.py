"""What :func:`~captum_attnflow.reproduce.reproduce` measured, as a :class:`Reproduction`: the
per-example correlations and ground-truth scores, the fractions and tables derived from them,
and how they are written: markdown and CSV tables (ours beside the paper's, one per reference,
and the ground-truth score) and a figure (Spearman per layer against each reference beside the
paper's, and the ground-truth score per layer)."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from captum_attnflow.evaluate import ComparisonResult
from captum_attnflow.reproduce.paper import DENSE, OURS_REFERENCES, PAPER_TABLES, TABLE_NUMBERS, paper_table
from captum_attnflow.reproduce.scoring import TIE_ATOL


@dataclass
class Reproduction:
    """What :func:`reproduce` measured.

    Attributes:
        correlations: per-example Spearman correlations of each attention method (layers
            1..L) with each reference, see :class:`captum_attnflow.evaluate.ComparisonResult`:
            ``"blank-out"`` and ``"input gradients"`` (our protocol), with ``protocol="paper"``
            also ``"|blank-out|"``, ``"gradient sum"`` and ``"gradient sum, float64"`` (the
            authors'), and with ``ranking="dense"`` those three again with ``", dense ranks"``.
        subject_first: method -> bool (L, M) for attention methods, (1, M) for the references:
            whether the method scores the subject strictly above every attractor, on the M
            examples with at least one attractor.
        subject_tied: the same shapes: whether the subject's score equals the highest
            attractor score within ``TIE_ATOL`` (1e-6), so neither above nor below it.
        num_attractors: (M,) the number of attractors of those examples.
        correct: (N,) bool, whether the model predicts the verb's number of each example.
        has_attractors: (N,) bool.
        seed: the seed of the generated held-out examples.
        seconds: wall-clock time of the run.
        protocol, data, ranking, include_cls, methods: the arguments of :func:`reproduce`.
        num_samples: N, the number of examples (property).

    Example::

        >>> from captum_attnflow.reproduce import reproduce
        >>> result = reproduce(num_samples=20, progress=False)
        >>> result.num_samples, result.subject_first["rollout"].shape  # (L, M): M examples with attractors
        (20, (6, 13))
        >>> [round(float(value), 3) for value in result.ground_truth()["rollout"]]
        [0.462, 0.769, 0.923, 1.0, 0.923, 0.923]
    """

    correlations: ComparisonResult
    subject_first: dict[str, np.ndarray]
    subject_tied: dict[str, np.ndarray]
    num_attractors: np.ndarray
    correct: np.ndarray
    has_attractors: np.ndarray
    seed: int
    seconds: float
    protocol: str = "ours"
    data: str = "generated"
    ranking: str = "average"
    include_cls: bool = False
    methods: tuple[str, ...] = ("raw", "rollout", "flow")

    @property
    def num_samples(self) -> int:
        """N, the number of held-out examples."""
        return len(self.correct)

    def ground_truth(self) -> dict[str, np.ndarray]:
        """Method -> fraction of examples with attractors whose subject it ranks first, per layer
        ((L,) for attention methods, (1,) for the references), plus ``"chance"``: the expected
        fraction for scores in random order, the mean of 1 / (1 + attractors).

        Returns:
            dict[str, numpy.ndarray]: ``{"raw", "rollout", "flow"}`` (L,), ``{"blank-out",
            "input gradients", "chance"}`` (1,); example in the class docstring.
        """
        fractions = {name: _fraction(first) for name, first in self.subject_first.items()}
        fractions["chance"] = _fraction(1.0 / (1.0 + self.num_attractors[None]))
        return fractions

    def ground_truth_ties(self) -> dict[str, np.ndarray]:
        """Method -> fraction of examples with attractors where the subject's score ties with the
        highest attractor score (within 1e-6), per layer: neither a success nor a failure in
        :meth:`ground_truth`. Flow ties often: it gives every token that can absorb it the
        source's whole unit of flow.

        Returns:
            dict[str, numpy.ndarray]: ``{"raw", "rollout", "flow"}`` (L,), ``{"blank-out",
            "input gradients"}`` (1,).

        Example::

            >>> from captum_attnflow.reproduce import reproduce
            >>> result = reproduce(num_samples=20, progress=False)
            >>> [round(float(value), 3) for value in result.ground_truth_ties()["flow"]]
            [0.0, 0.0, 0.0, 0.538, 0.538, 0.538]
        """
        return {name: _fraction(tied) for name, tied in self.subject_tied.items()}

    def paper_values(self) -> dict[tuple, tuple[float, float]]:
        """The paper's (mean, std) for every (method, reference, layer) of :attr:`correlations`
        within its 6 layers: Table 1 for the blank-out references, Table 2 for the gradient ones.

        Returns:
            dict: ``{(method, reference, layer): (mean, std)}``, what the tables print beside ours.
        """
        values = {}
        for method, reference, layer in self.correlations.scores:
            paper = PAPER_TABLES[paper_table(reference)].get(method, ())
            if layer is not None and layer <= len(paper):
                values[(method, reference, layer)] = paper[layer - 1]
        return values

    def table(self, reference: str) -> list[dict]:
        """Rows (method, layer, ours mean / std / count, paper mean / std) for one reference.

        Args:
            reference: one of ``correlations.references``: ``"blank-out"`` (Table 1),
                ``"input gradients"`` (Table 2), and the authors' references of
                ``protocol="paper"``.

        Returns:
            list[dict]: one row per (attention method, layer), the keys of
            :meth:`ComparisonResult.summary` plus ``paper_mean`` and ``paper_std`` (NaN
            beyond the paper's 6 layers).

        Example::

            >>> from captum_attnflow.reproduce import reproduce
            >>> result = reproduce(num_samples=20, progress=False)
            >>> row = result.table("blank-out")[0]
            >>> row["method"], row["layer"], row["count"], row["paper_mean"]
            ('raw', 1, 20, 0.69)
        """
        if reference not in self.correlations.references:
            raise ValueError(f"no reference {reference!r} in this reproduction; it has {self.correlations.references}.")
        paper = self.paper_values()
        rows = []
        for row in self.correlations.summary():
            if row["reference"] == reference:
                mean, std = paper.get((row["method"], reference, row["layer"]), (np.nan, np.nan))
                rows.append(dict(row, paper_mean=mean, paper_std=std))
        return rows

    def to_markdown(self) -> str:
        """Tables 1 and 2 (ours and the paper's) of each protocol, the ground-truth score and the
        model's accuracy.

        Returns:
            str: markdown, as written to ``reproduction.md`` by :meth:`save`; example in
            :func:`reproduce`.
        """
        return _markdown(self)

    def to_csv(self, directory: str | Path) -> list[Path]:
        """Write one table per reference, ``table1_blank_out.csv``, ``table2_input_gradients.csv``
        (and the authors' protocol's, e.g. ``table1_abs_blank_out.csv``), and ``ground_truth.csv``.

        Args:
            directory: an existing directory.

        Returns:
            list[Path]: the files, tables first (rows as :meth:`table`), ground truth last.
        """
        return _write_tables(self, directory)

    def plot(self) -> Figure:
        """One panel per reference (Spearman per layer: ours as lines with a ±std band, the
        paper's as dotted lines) and one for the ground-truth score per layer, three panels a row.

        Returns:
            matplotlib.figure.Figure: a figure not registered with pyplot (nothing to close).
        """
        return _figure(self)

    def save(self, directory: str | Path) -> list[Path]:
        """Write ``reproduction.md``, the CSV files, ``reproduction.png`` and the per-example
        correlations ``correlations.npz`` into ``directory`` (created if needed).

        Args:
            directory: where to write; ``captum-attnflow reproduce --out DIR`` uses this.

        Returns:
            list[Path]: the files written.

        Example::

            >>> import tempfile
            >>> from captum_attnflow.reproduce import reproduce
            >>> result = reproduce(num_samples=20, progress=False)
            >>> with tempfile.TemporaryDirectory() as folder:
            ...     print([path.name for path in result.save(folder)])
            ['reproduction.md', 'table1_blank_out.csv', 'table2_input_gradients.csv', 'ground_truth.csv', 'reproduction.png', 'correlations.npz']
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        markdown = directory / "reproduction.md"
        markdown.write_text(self.to_markdown() + "\n")
        figure_path = directory / "reproduction.png"
        self.plot().savefig(figure_path, dpi=120)
        correlations = directory / "correlations.npz"
        self.correlations.save(correlations)
        return [markdown, *self.to_csv(directory), figure_path, correlations]


def _fraction(values: np.ndarray) -> np.ndarray:
    """Row means of (K, M) values; NaN when no example has attractors (M = 0), e.g. a few short inputs."""
    return values.mean(1) if values.shape[1] else np.full(values.shape[0], np.nan)


def _markdown(result: Reproduction) -> str:
    accuracy = result.correct.mean()
    with_attractors = result.correct[result.has_attractors].mean() if result.has_attractors.any() else np.nan
    blocks = [
        f"Held-out accuracy of the model: {accuracy:.3f} ({result.num_samples} examples), "
        f"{with_attractors:.3f} on the {int(result.has_attractors.sum())} with attractors. "
        f"Seed {result.seed}, {result.seconds:.0f} s."
    ]
    blocks += [_spearman_markdown(result, reference) for reference in _references_in_order(result)]
    blocks.append(_ground_truth_markdown(result))
    return "\n\n".join(blocks)


def _references_in_order(result: Reproduction) -> list[str]:
    """The references of ``result`` in the order its tables and panels show them: the authors'
    protocol first when it was asked for, then ours."""
    references = result.correlations.references
    return sorted(references, key=lambda reference: reference in OURS_REFERENCES) if result.protocol == "paper" else references


def _heading(result: Reproduction, reference: str) -> str:
    number = TABLE_NUMBERS[paper_table(reference)]
    if reference in OURS_REFERENCES:
        ranked = "words ranked, [CLS] too" if result.include_cls else "words ranked, [CLS] left out"
        return f"Table {number}, our protocol ({ranked}), CLS token after each layer; paper: 2000 examples"
    spearman = "their dense-rank formula, NaN as 0" if reference.endswith(DENSE) else "average ranks"
    return f"Table {number}, the authors' protocol (every token ranked, [CLS] included; {spearman}), CLS token after each layer; paper: 2000 examples"


def _select(result: Reproduction, reference: str) -> ComparisonResult:
    scores = {key: values for key, values in result.correlations.scores.items() if key[1] == reference}
    return ComparisonResult(result.correlations.example_ids, scores)


def _spearman_markdown(result: Reproduction, reference: str) -> str:
    return _heading(result, reference) + "\n\n" + _select(result, reference).to_markdown(beside=result.paper_values())


def _ground_truth_markdown(result: Reproduction) -> str:
    fractions = result.ground_truth()
    count = len(result.num_attractors)
    layers = len(fractions[result.methods[0]])
    lines = [
        f"Ground truth: fraction of the {count} examples with attractors where the method scores "
        "the subject above every attractor",
        "",
        "| method | " + " | ".join(f"L{layer}" for layer in range(1, layers + 1)) + " |",
        "|---|" + "---|" * layers,
    ]
    for method in result.methods:
        lines.append(f"| {method} | " + " | ".join(f"{value:.3f}" for value in fractions[method]) + " |")
    lines += ["", "| reference | model output |", "|---|---|"]
    for name in (*OURS_REFERENCES, "chance"):
        lines.append(f"| {name} | {fractions[name][0]:.3f} |")
    tied = {name: values for name, values in result.ground_truth_ties().items() if values.any()}
    if tied:
        listed = "; ".join(f"{name} " + ", ".join(f"{value:.3f}" for value in values) for name, values in tied.items())
        lines += ["", f"Tied with the highest-scored attractor (within {TIE_ATOL:g}), neither above nor below: {listed}."]
    return "\n".join(lines)


def _write_tables(result: Reproduction, directory: str | Path) -> list[Path]:
    directory = Path(directory)
    paths = []
    for reference in _references_in_order(result):
        slug = re.sub(r"[^a-z0-9]+", "_", reference.replace("|blank-out|", "abs blank-out")).strip("_")
        path = directory / f"table{TABLE_NUMBERS[paper_table(reference)]}_{slug}.csv"
        _select(result, reference).to_csv(path, beside=result.paper_values())
        paths.append(path)
    path = directory / "ground_truth.csv"
    ties = result.ground_truth_ties()
    rows = [
        dict(method=name, layer=index + 1 if name in result.methods else "", fraction=value,
             tied_fraction=ties[name][index] if name in ties else "", examples=len(result.num_attractors))
        for name, values in result.ground_truth().items()
        for index, value in enumerate(values)
    ]
    _write_csv(path, ["method", "layer", "fraction", "tied_fraction", "examples"], rows)
    paths.append(path)
    return paths


def _write_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fields)
        writer.writeheader()
        writer.writerows(rows)


def _figure(result: Reproduction) -> Figure:
    references = _references_in_order(result)
    panels = len(references) + 1
    columns = min(panels, 3)
    rows = -(-panels // columns)
    figure = Figure(figsize=(5.2 * columns, 4.2 * rows), layout="constrained")
    axes = list(figure.subplots(rows, columns, squeeze=False).ravel())
    for ax in axes[panels:]:
        ax.set_visible(False)
    result.correlations.plot(ax=[axes[references.index(r)] for r in result.correlations.references],
                             beside=result.paper_values())
    for ax, reference in zip(axes, references):
        ax.set_ylim(-1.05, 1.05)
        protocol = "ours" if reference in OURS_REFERENCES else "authors'"
        ax.set_title(f"Table {TABLE_NUMBERS[paper_table(reference)]} ({protocol}): {reference}")
        ax.set_ylabel(f"Spearman's rho with {reference}")
        ax.legend(fontsize="small", ncols=2, loc="lower right")
    ax = axes[len(references)]
    fractions = result.ground_truth()
    ties = result.ground_truth_ties()
    for index, method in enumerate(result.methods):
        layers = np.arange(1, len(fractions[method]) + 1)
        ax.plot(layers, fractions[method], marker="o", color=f"C{index}", label=method)
        if ties[method].any():
            ax.plot(layers, fractions[method] + ties[method], linestyle=":", color=f"C{index}",
                    label=f"{method}, above or tied")
    for index, name in enumerate((*OURS_REFERENCES, "chance"), start=len(result.methods)):
        ax.axhline(fractions[name][0], linestyle="--", color=f"C{index}", label=name)
    ax.set_xticks(layers, [f"L{layer}" for layer in layers])
    # Fractions reach exactly 1 (flow above or tied): a margin keeps those lines visible.
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("layer")
    ax.set_ylabel("fraction of examples with attractors")
    ax.set_title("subject scored above every attractor")
    ax.legend(fontsize="x-small", ncols=2, loc="lower right")
    return figure
