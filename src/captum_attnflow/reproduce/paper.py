"""The paper's side of the reproduction: its Tables 1 and 2 (the values printed beside ours), their
numbers, and the names of the references of both protocols."""

from __future__ import annotations

from captum_attnflow.methods import METHODS

# Reference names: ours (the tables' titles in the registry) and the authors' definitions.
BLANK_OUT, GRADIENTS = METHODS["blankout"].title, METHODS["saliency"].title
OURS_REFERENCES = (BLANK_OUT, GRADIENTS)
PAPER_REFERENCES = ("|blank-out|", "gradient sum", "gradient sum, float64")
DENSE = ", dense ranks"

# The paper's Tables 1 and 2 (2000 test examples of its verb-number model): per method, the
# mean and std of Spearman's rho for layers L1-L6. Reference values, printed beside ours.
PAPER_TABLES: dict[str, dict[str, tuple[tuple[float, float], ...]]] = {
    "blank-out": {
        "raw": ((0.69, 0.27), (0.10, 0.43), (-0.11, 0.49), (-0.09, 0.52), (0.20, 0.45), (0.29, 0.39)),
        "rollout": ((0.32, 0.26), (0.38, 0.27), (0.51, 0.26), (0.62, 0.26), (0.70, 0.25), (0.71, 0.24)),
        "flow": ((0.32, 0.26), (0.44, 0.29), (0.70, 0.25), (0.70, 0.22), (0.71, 0.22), (0.70, 0.22)),
    },
    "input gradients": {
        "raw": ((0.53, 0.33), (0.16, 0.38), (-0.06, 0.42), (0.00, 0.47), (0.24, 0.40), (0.46, 0.35)),
        "rollout": ((0.22, 0.31), (0.27, 0.32), (0.39, 0.32), (0.47, 0.32), (0.53, 0.32), (0.54, 0.31)),
        "flow": ((0.22, 0.31), (0.31, 0.34), (0.54, 0.32), (0.61, 0.28), (0.60, 0.28), (0.61, 0.28)),
    },
}
TABLE_NUMBERS = {"blank-out": 1, "input gradients": 2}


def paper_table(reference: str) -> str:
    """The paper's table a reference name belongs to: ``"blank-out"`` (Table 1) for the
    blank-out references, ``"input gradients"`` (Table 2) for the gradient ones.

    Args:
        reference: a reference name of a :class:`Reproduction`, e.g. ``"gradient sum, float64"``.

    Returns:
        str: a key of :data:`PAPER_TABLES`.

    Example::

        >>> paper_table("|blank-out|, dense ranks"), paper_table("gradient sum")
        ('blank-out', 'input gradients')
    """
    return "blank-out" if "blank-out" in reference else "input gradients"
