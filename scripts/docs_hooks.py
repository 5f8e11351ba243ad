"""MkDocs hook: every public object of the documented packages has a docstring.

Run by ``mkdocs build`` (``hooks:`` in mkdocs.yml). A missing docstring is logged as a warning,
which ``--strict`` (the build in the test command) turns into a failed build.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from typing import Any, Iterator

log = logging.getLogger("mkdocs.hooks.docstrings")

# The packages whose ``__all__`` is the public API the reference documents.
PUBLIC_MODULES = (
    "captum_attnflow",
    "captum_attnflow.attr",
    "captum_attnflow.attr.llm",
    "captum_attnflow.functional",
    "captum_attnflow.baselines",
    "captum_attnflow.evaluate",
    "captum_attnflow.adversarial",
    "captum_attnflow.benchmark",
    "captum_attnflow.data",
    "captum_attnflow.models",
    "captum_attnflow.capture.maps",
    "captum_attnflow.hf.state",
    "captum_attnflow.visualize",
    "captum_attnflow.visualize.html",
    "captum_attnflow.visualize.forest",
    "captum_attnflow.visualize.critical_difference",
    "captum_attnflow.explanation",
    "captum_attnflow.words",
    "captum_attnflow.saving",
)


def undocumented(module_names: tuple[str, ...] | None = None) -> list[str]:
    """Qualified names of public objects (``__all__``, or the module's public functions and
    classes) and of their public methods and properties without a docstring of their own, in
    ``module_names`` (default: :data:`PUBLIC_MODULES`)."""
    missing = []
    for module_name in module_names or PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name, value in _public(module):
            if _is_data(value):
                continue
            if not inspect.getdoc(value):
                missing.append(f"{module_name}.{name}")
            if inspect.isclass(value):
                for member, attribute in vars(value).items():
                    if member.startswith("_") or not (inspect.isfunction(attribute) or isinstance(attribute, property)):
                        continue
                    if not (attribute.__doc__ or "").strip():
                        missing.append(f"{module_name}.{name}.{member}")
    return sorted(set(missing))


def _public(module: Any) -> Iterator[tuple[str, Any]]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [
            name for name, value in vars(module).items()
            if not name.startswith("_") and (inspect.isfunction(value) or inspect.isclass(value))
            and getattr(value, "__module__", None) == module.__name__
        ]
    for name in names:
        yield name, getattr(module, name)


def _is_data(value: Any) -> bool:
    return not (inspect.isclass(value) or inspect.isfunction(value) or inspect.ismethod(value) or callable(value))


def on_config(config: Any) -> Any:
    for name in undocumented():
        log.warning(f"{name} has no docstring: document it (the API reference is generated from docstrings).")
    return config
