"""The figure of a :class:`~captum_attnflow.reproduce.Reproduction`: Spearman per layer against each
reference beside the paper's, and the ground-truth score per layer."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from matplotlib.figure import Figure

from captum_attnflow.reproduce.formatting import references_in_order
from captum_attnflow.reproduce.paper import OURS_REFERENCES, TABLE_NUMBERS, paper_table

if TYPE_CHECKING:
    from captum_attnflow.reproduce.result import Reproduction


def reproduction_figure(result: Reproduction) -> Figure:
    """The figure of :meth:`Reproduction.plot`."""
    references = references_in_order(result)
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
