"""Docstrings built from shared pieces, so arguments common to several methods are written once (used by every package).

A piece is spliced in where the docstring says ``{name}``; the result is a plain ``__doc__``,
so ``help()``, IDEs and doctest see the complete text.
"""

from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def fill_docstring(**pieces: str) -> Callable[[F], F]:
    """Decorator: replace each ``{name}`` in the function's docstring by ``pieces[name]``.

    Plain replacement rather than ``str.format``, because docstrings hold LaTeX braces.

    Args:
        **pieces: the text for each placeholder name.

    Returns:
        A decorator that rewrites ``__doc__`` in place and returns the function itself.

    Raises:
        ValueError: the docstring lacks one of the placeholders (a piece would silently go missing).

    Example::

        >>> @fill_docstring(unit="metres")
        ... def height(x):
        ...     '''Height in {unit}.'''
        ...     return x
        >>> height.__doc__
        'Height in metres.'
    """

    def decorate(function: F) -> F:
        doc = function.__doc__ or ""
        for name, text in pieces.items():
            placeholder = "{" + name + "}"
            if placeholder not in doc:
                raise ValueError(f"the docstring of {function.__qualname__} has no {placeholder} to fill.")
            doc = doc.replace(placeholder, text)
        function.__doc__ = doc
        return function

    return decorate
