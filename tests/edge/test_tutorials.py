"""The tutorials are committed as valid notebooks without outputs (``pytest --nbmake`` executes them).

Outputs stay out of git: they would go stale against the code that made them and bloat diffs.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import nbformat
import pytest

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"
NOTEBOOKS = [
    "01_quickstart.ipynb",
    "02_comparing_methods.ipynb",
    "03_pretrained_minilm.ipynb",
    "04_gpu_batching_long_inputs.ipynb",
    "05_generation.ipynb",
    "06_adversarial_attention.ipynb",
    "07_which_explanation_to_trust.ipynb",
    "08_which_document.ipynb",
]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_committed_without_outputs(name):
    notebook = json.loads((TUTORIALS / name).read_text())
    assert notebook["nbformat"] == 4
    assert notebook["metadata"]["kernelspec"]["name"] == "python3"
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert code, f"{name} has no code cells"
    for index, cell in enumerate(code):
        assert cell["outputs"] == [], f"{name}: code cell {index} has outputs; strip them before committing"
        assert cell["execution_count"] is None, f"{name}: code cell {index} has an execution count"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_validates_without_a_warning(name):
    # a cell without an id is a MissingIDFieldWarning now and, nbformat says, an error later
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nbformat.validate(nbformat.read(TUTORIALS / name, as_version=4))


def test_every_notebook_is_listed():
    assert sorted(path.name for path in TUTORIALS.glob("*.ipynb")) == NOTEBOOKS
