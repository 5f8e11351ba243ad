"""The documentation site builds with warnings as errors: a broken link or a public object without
a docstring fails the build (mkdocs.yml, scripts/docs_hooks.py); its equations are MathML written
at build time (scripts/docs_math.py), laid out by Chromium with the network off."""

from __future__ import annotations

import logging
import re
import sys
import types
from pathlib import Path

import pytest
from helpers import browser, needs_browser

ROOT = Path(__file__).resolve().parents[1]
mkdocs_config = pytest.importorskip("mkdocs.config")
from mkdocs.commands.build import build  # noqa: E402
from mkdocs.exceptions import Abort  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
import docs_hooks  # noqa: E402
import docs_math  # noqa: E402

# Pages with each source of equations: Markdown, docstrings (reStructuredText roles), a tutorial.
MATH_PAGES = ("methods/attnlrp", "api/functional", "notebooks/01_quickstart")
# Laid out by the browser: a subscript below its base's top, a fraction's numerator above its
# denominator (an unknown element would put both on one line); no LaTeX left in the prose (code
# and scripts may hold LaTeX as it is).
PROBE = r"""<script>addEventListener("load", () => {
  const top = (element) => element.getBoundingClientRect().top;
  const subscripts = [...document.querySelectorAll("msub")];
  const fractions = [...document.querySelectorAll("mfrac")];
  const lowered = subscripts.filter((s) => top(s.children[1]) > top(s.children[0]) + 1).length;
  const stacked = fractions.filter((f) => f.children[0].getBoundingClientRect().bottom <= top(f.children[1]) + 1).length;
  const prose = document.querySelector("article").cloneNode(true);
  prose.querySelectorAll("pre, code, script, style").forEach((code) => code.remove());
  const raw = /\\\(|\\\[|\$\$|\\frac|\\alpha|:math:/.test(prose.textContent);
  document.body.dataset.math = [document.querySelectorAll("math").length, subscripts.length, lowered,
                                fractions.length, stacked, raw].join(" ");
});</script>"""


def _build(config_file: Path, site_dir: Path) -> None:
    build(mkdocs_config.load_config(str(config_file), strict=True, site_dir=str(site_dir)))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for this module's tests."""
    folder = tmp_path_factory.mktemp("docs") / "site"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(ROOT)  # the notebooks' conversion cache is kept in .cache/ between runs
        _build(ROOT / "mkdocs.yml", folder)
    return folder


def test_site_builds_strictly(site):
    assert (site / "api" / "attributions" / "index.html").read_text().count("attribute") > 7
    assert (site / "notebooks" / "01_quickstart" / "index.html").exists()


@pytest.mark.parametrize("page", MATH_PAGES)
def test_equations_are_mathml_and_the_pages_load_nothing_from_the_network(site, page):
    text = (site / page / "index.html").read_text()
    assert text.count("<math ") > 5 and 'class="arithmatex"' not in text and ":math:<code>" not in text
    assert re.findall(r'<(?:script|link|img)\b[^>]*\b(?:src|href)="(?:https?:)?//', text) == []


@needs_browser
def test_chromium_lays_the_equations_out_offline(site):
    for page in MATH_PAGES:
        probe = site / page / "probe.html"  # beside the page: its relative links still resolve
        probe.write_text((site / page / "index.html").read_text().replace("</body>", PROBE + "</body>"))
        dom = browser("--virtual-time-budget=5000", "--dump-dom", probe.as_uri())
        maths, subscripts, lowered, fractions, stacked, raw = re.search(r'data-math="([^"]+)"', dom).group(1).split()
        assert int(maths) > 5 and raw == "false", page
        assert int(subscripts) > 3 and lowered == subscripts and stacked == fractions, page


def test_rst_maths_become_arithmatex_and_a_bad_formula_names_its_page():
    docstring = "Rows :math:`A_l`, then\n\n    .. math::\n        c = \\frac{a}\n            {b}\n\n    done."
    assert docs_math.rst_math(docstring) == "Rows \\(A_l\\), then\n\n\n    $$\n    c = \\frac{a} {b}\n    $$\n\n    done."
    page = types.SimpleNamespace(file=types.SimpleNamespace(src_uri="x.md"))
    html = '<p>a <span class="arithmatex">\\(x_1 &lt; y\\)</span></p><div class="arithmatex">\\[\\frac{1}{2}\\]</div>'
    out = docs_math.on_page_content(html, page=page)
    assert '<math xmlns="http://www.w3.org/1998/Math/MathML" display="inline">' in out and "<mfrac>" in out
    assert out.count('display="block"') == 1 and re.search(r"<mo>(&lt;|&#x0003C;)</mo>", out)  # the escaped "<" read back
    with pytest.raises(docs_math.MathError, match="x.md: cannot convert the formula 'x\\^'"):
        docs_math.on_page_content('<span class="arithmatex">\\(x^\\)</span>', page=page)
    with pytest.raises(docs_math.MathError, match=r"does not know \\unknown"):
        docs_math.on_page_content('<span class="arithmatex">\\(\\unknown x\\)</span>', page=page)


def test_a_tutorials_dollars_become_mathml_outside_code():
    page = types.SimpleNamespace(file=types.SimpleNamespace(src_uri="notebooks/x.ipynb"))
    html = ('<div class="jp-RenderedMarkdown"><p>weights $W_l$ cost $5 and $$A = B$$</p><pre><code>$x$</code></pre>'
            '<div>$y$</div></div><div class="jp-OutputArea">$z$</div><script>var a = "$w$";</script>')
    out = docs_math.on_page_content(html, page=page)
    assert out.count("<math ") == 3 and "cost $5 and" in out  # W_l, A = B and y; a lone dollar stays
    assert "<code>$x$</code>" in out and ">$z$<" in out and '"$w$"' in out


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
