"""The README's Python examples run as written and print what the README shows (they are the
first code a new user copies)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
# Each Python block, with the text block that follows it (the output shown), if any.
BLOCKS = re.findall(r"```python\n(.*?)```\s*(?:```text\n(.*?)```)?", README.read_text(), flags=re.DOTALL)


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, capsys):
    code, shown = BLOCKS[index]
    exec(compile(code, f"README.md python block {index}", "exec"), {})
    printed = capsys.readouterr().out.strip()
    assert printed, "every README example prints something"
    assert not shown or printed == shown.strip(), "the README shows different output than the example prints"
