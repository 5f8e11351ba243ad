"""The tutorials run top to bottom, and are committed as valid notebooks without outputs.

Outputs stay out of git: they would go stale against the code that made them and bloat diffs.
This file is collected first (pyproject's ``testpaths``), so that its worker starts on the
notebooks while the other workers take the many short files.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import nbformat
import pytest
from notebooks import run_notebook

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
def test_notebook_runs_top_to_bottom(name):
    failure = run_notebook(TUTORIALS / name)
    assert failure is None, failure


def test_a_failing_cell_ends_the_run_and_is_reported(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("%matplotlib inline\nvalue = 41"),
        nbformat.v4.new_markdown_cell("text"),
        nbformat.v4.new_code_cell("print('before')\nassert value == 42, 'the answer'"),
        nbformat.v4.new_code_cell("raise SystemExit('never reached')"),
    ]
    nbformat.write(notebook, tmp_path / "failing.ipynb")
    failure = run_notebook(tmp_path / "failing.ipynb")
    assert "failing.ipynb, cell 2:" in failure
    assert "AssertionError: the answer" in failure and "before" in failure
    assert "never reached" not in failure.split("Traceback")[1]


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
