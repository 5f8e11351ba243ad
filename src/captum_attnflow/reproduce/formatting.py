"""The tables of a :class:`~captum_attnflow.reproduce.Reproduction` as markdown and CSV files: ours
beside the paper's, one table per reference, and the ground-truth score."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from captum_attnflow.evaluate import ComparisonResult
from captum_attnflow.reproduce.paper import DENSE, OURS_REFERENCES, TABLE_NUMBERS, paper_table
from captum_attnflow.reproduce.scoring import TIE_ATOL

if TYPE_CHECKING:
    from captum_attnflow.reproduce.result import Reproduction


def reproduction_markdown(result: Reproduction) -> str:
    """The markdown of :meth:`Reproduction.to_markdown`."""
    accuracy = result.correct.mean()
    with_attractors = result.correct[result.has_attractors].mean() if result.has_attractors.any() else np.nan
    blocks = [
        f"Held-out accuracy of the model: {accuracy:.3f} ({result.num_samples} examples), "
        f"{with_attractors:.3f} on the {int(result.has_attractors.sum())} with attractors. "
        f"Seed {result.seed}, {result.seconds:.0f} s."
    ]
    blocks += [_spearman_markdown(result, reference) for reference in references_in_order(result)]
    blocks.append(_ground_truth_markdown(result))
    return "\n\n".join(blocks)


def references_in_order(result: Reproduction) -> list[str]:
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


def write_tables(result: Reproduction, directory: str | Path) -> list[Path]:
    """The CSV files of :meth:`Reproduction.to_csv`, written into ``directory``."""
    directory = Path(directory)
    paths = []
    for reference in references_in_order(result):
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
