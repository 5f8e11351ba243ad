"""The documentation site builds with warnings as errors: a broken link or a public object without
a docstring fails the build (mkdocs.yml, scripts/docs_hooks.py)."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
mkdocs_config = pytest.importorskip("mkdocs.config")
from mkdocs.commands.build import build  # noqa: E402
from mkdocs.exceptions import Abort  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
import docs_hooks  # noqa: E402


def _build(config_file: Path, site_dir: Path) -> None:
    build(mkdocs_config.load_config(str(config_file), strict=True, site_dir=str(site_dir)))


def test_site_builds_strictly(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the notebooks' conversion cache is kept in .cache/ between runs
    _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert (tmp_path / "site" / "api" / "attributions" / "index.html").read_text().count("attribute") > 7
    assert (tmp_path / "site" / "notebooks" / "01_quickstart" / "index.html").exists()


def test_a_broken_link_fails_the_build(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [the missing page](missing.md).\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: t\nvalidation:\n  unrecognized_links: warn\n")
    with pytest.raises(Abort, match="strict mode"):
        _build(tmp_path / "mkdocs.yml", tmp_path / "site")


def test_a_public_object_without_docstring_is_reported(monkeypatch, caplog):
    module = types.ModuleType("documented_elsewhere")
    module.__all__ = ["Thing", "helper"]

    class Thing:
        """A documented class."""

        def run(self):
            pass

    def helper():
        """Documented."""

    module.Thing, module.helper = Thing, helper
    monkeypatch.setitem(sys.modules, "documented_elsewhere", module)
    assert docs_hooks.undocumented(("documented_elsewhere",)) == ["documented_elsewhere.Thing.run"]
    with caplog.at_level(logging.WARNING):
        monkeypatch.setattr(docs_hooks, "PUBLIC_MODULES", ("documented_elsewhere",))
        docs_hooks.on_config(None)
    assert "documented_elsewhere.Thing.run has no docstring" in caplog.text
