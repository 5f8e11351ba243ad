"""The Python examples of README and of the documentation pages run as written and print what
they show (they are the first code a new user copies)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]


def _blocks(path: Path) -> list[tuple[str, str]]:
    """Each Python block, with the text block that follows it (the output shown), if any."""
    return re.findall(r"```python\n(.*?)```\s*(?:```text\n(.*?)```)?", path.read_text(), flags=re.DOTALL)


# The same example on two pages runs once.
BLOCKS = {code: (path.relative_to(ROOT), shown) for path in reversed(PAGES) for code, shown in _blocks(path)}


def test_readme_has_a_python_example():
    assert _blocks(README)


@pytest.mark.parametrize("code", list(BLOCKS), ids=[f"{path}:{i}" for i, (path, _) in enumerate(BLOCKS.values())])
def test_example_runs(code, capsys):
    path, shown = BLOCKS[code]
    exec(compile(code, f"{path} python block", "exec"), {})
    printed = capsys.readouterr().out.strip()
    assert printed, "every example prints something"
    assert not shown or printed == shown.strip(), f"{path} shows different output than the example prints"
