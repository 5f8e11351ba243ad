"""The package's import graph has no cycle: every arrow between its modules runs one way.

The graph is read from the source (ast), not from an import: every ``import`` and ``from ...
import`` of the package's own modules counts, at module level, inside functions and under
``if TYPE_CHECKING``, so a circle cannot hide behind a late import. The same graph shows that no
package reaches into another's private modules or names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

import captum_attnflow

PACKAGE = Path(captum_attnflow.__file__).resolve().parent


def import_graph(package: Path) -> nx.DiGraph:
    """Modules of ``package`` (a source folder) as nodes, an edge from each module to every module
    of the package it imports, holding the names taken from it (``names``, empty when the module
    itself is imported). ``from a.b import c`` points to ``a.b.c`` when that is a module, else to
    ``a.b`` with the name ``c``; a package is its ``__init__.py``."""
    modules = {_name(path, package): path for path in package.rglob("*.py")}
    graph = nx.DiGraph()
    for module, path in modules.items():
        graph.add_node(module)
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, here)
                targets = [
                    (f"{base}.{alias.name}", None) if f"{base}.{alias.name}" in modules else (base, alias.name)
                    for alias in node.names
                ]
            else:
                continue
            for target, name in targets:
                while target and target not in modules:  # `import a.b.c` of a name inside a.b
                    target = target.rpartition(".")[0]
                if target and target != module:
                    graph.add_edge(module, target)
                    graph.edges[module, target].setdefault("names", set()).update([name] if name else [])
    return graph


def _top(module: str) -> str:
    """The top-level package of a module of the package (a module at the root is its own)."""
    return module.split(".")[1] if "." in module else module


def _name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(node: ast.ImportFrom, here: str) -> str:
    """The module a ``from`` import reads, with a relative one (``from . import x``) resolved."""
    if not node.level:
        return node.module or ""
    parent = here.split(".")[: len(here.split(".")) - node.level + 1]
    return ".".join(parent + ([node.module] if node.module else []))


def test_the_package_has_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert len(graph) > 100 and graph.number_of_edges() > 200  # the whole package was read
    cycles = [" -> ".join([*cycle, cycle[0]]) for cycle in nx.simple_cycles(graph)]
    assert not cycles, "modules that import each other (move what both need to the side that owns it):\n" + "\n".join(cycles)


def test_the_packages_import_one_way():
    """Collapsed to the top-level packages (a root module is its own), the graph still has no
    cycle: the layers of docs/layout.md, each importing only from the ones before it."""
    packages = nx.DiGraph()
    for module, target in import_graph(PACKAGE).edges:
        if _top(module) != _top(target):
            packages.add_edge(_top(module), _top(target))
    assert {"functional", "hf", "attr", "evaluate", "benchmark", "cli"} <= set(packages)
    cycles = [" -> ".join([*cycle, cycle[0]]) for cycle in nx.simple_cycles(packages)]
    assert not cycles, "packages that import each other:\n" + "\n".join(cycles)


def test_no_package_imports_another_packages_private_names():
    """A private module (``_base.py``) or name (``_helper``) serves its own package only; what two
    packages share moves to a public, named module."""
    private = [
        f"{module} -> {target} {sorted(names)}"
        for module, target, names in import_graph(PACKAGE).edges(data="names")
        if _top(module) != _top(target)
        and any(_private(name) for name in [*target.split("."), *names])
    ]
    assert not private, "imports of another package's private module or names:\n" + "\n".join(private)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")  # __version__ is public


def test_every_kind_of_import_is_an_edge(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    files = {
        "pkg/__init__.py": "from pkg.sub import helper\n",
        "pkg/sub/__init__.py": "from .helper import run\n",
        "pkg/sub/helper.py": "def run():\n    from pkg import late\n",
        "pkg/late.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.typed\n",
        "pkg/typed.py": "from . import late\nimport os\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path / "pkg")
    assert set(graph.edges) == {
        ("pkg", "pkg.sub.helper"),  # `from pkg.sub import helper`: the module helper
        ("pkg.sub", "pkg.sub.helper"),  # relative, the name run read from the module helper
        ("pkg.sub.helper", "pkg.late"),  # inside a function
        ("pkg.late", "pkg.typed"),  # under TYPE_CHECKING
        ("pkg.typed", "pkg.late"),  # relative `from . import late`
    }
    assert [sorted(cycle) for cycle in nx.simple_cycles(graph)] == [["pkg.late", "pkg.typed"]]
    assert graph.edges["pkg.sub", "pkg.sub.helper"]["names"] == {"run"}
    assert graph.edges["pkg", "pkg.sub.helper"]["names"] == set()
