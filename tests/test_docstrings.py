import doctest
import importlib
import inspect
import pkgutil
import re

import pytest

import captum_attnflow

from captum_attnflow.attr import AttentionFlow, AttentionRollout, AttnLRP, RawAttention
from captum_attnflow.baselines import BlankOut, TokenInputXGradient, TokenIntegratedGradients, TokenSaliency
from captum_attnflow.docstrings import fill_docstring
from captum_attnflow.evaluate import aopc_comprehensiveness, aopc_sufficiency, deletion_area, log_odds


def test_fills_every_placeholder_and_keeps_latex_braces():
    @fill_docstring(args="Args:\n    x: a number.", returns="Returns:\n    2x.")
    def double(x):
        """Twice x, :math:`\\frac{a}{b}` untouched.

        {args}

        {returns}
        """
        return 2 * x

    assert double.__doc__.count("{") == 2  # only the LaTeX braces remain
    assert "Args:\n    x: a number." in double.__doc__ and "Returns:\n    2x." in double.__doc__
    assert double(3) == 6


def test_missing_placeholder_is_an_error():
    with pytest.raises(ValueError, match=r"has no \{returns\} to fill"):

        @fill_docstring(returns="Returns: nothing.")
        def undocumented():
            """No placeholder here."""


@pytest.mark.parametrize(
    "method",
    [
        RawAttention.attribute,
        AttentionRollout.attribute,
        AttentionFlow.attribute,
        AttnLRP.attribute,
        TokenSaliency.attribute,
        TokenInputXGradient.attribute,
        TokenIntegratedGradients.attribute,
        BlankOut.attribute,
        aopc_comprehensiveness,
        aopc_sufficiency,
        log_odds,
        deletion_area,
    ],
)
def test_shared_pieces_reach_help(method):
    """Docstrings built from shared pieces document every argument of the signature, with Returns
    and an example, and keep no placeholder."""
    doc = method.__doc__
    assert "{" + "args}" not in doc and "{" + "returns}" not in doc
    assert "Args:" in doc and "Returns:" in doc and ">>> " in doc
    arguments = [name for name in inspect.signature(method).parameters if name != "self"]
    # An argument is documented where a line of the Args section starts with its name.
    undocumented = [name for name in arguments if not re.search(rf"\n\s+(\w+, )*{name}\b[ (:,]", doc)]
    assert not undocumented


@pytest.mark.parametrize(
    "cls",
    [RawAttention, AttentionRollout, AttentionFlow, AttnLRP, TokenSaliency, TokenInputXGradient, TokenIntegratedGradients],
)
def test_class_docstrings_document_the_constructor(cls):
    arguments = [name for name in inspect.signature(cls).parameters]
    assert "{" + "init}" not in cls.__doc__ and "Args:" in cls.__doc__
    assert all(f"\n        {name}: " in cls.__doc__ for name in arguments), arguments


def _modules_with_examples() -> list[str]:
    """Every module of the package whose docstrings hold examples (found, not listed by hand)."""
    names = []
    for info in pkgutil.walk_packages(captum_attnflow.__path__, "captum_attnflow."):
        module = importlib.import_module(info.name)
        if any(test.examples for test in doctest.DocTestFinder().find(module)):
            names.append(info.name)
    return names


MODULES_WITH_EXAMPLES = _modules_with_examples()


def test_public_modules_have_examples():
    expected = {"captum_attnflow.functional.rollout", "captum_attnflow.attr.flow", "captum_attnflow.capture.maps",
                "captum_attnflow.evaluate.evaluator", "captum_attnflow.baselines.blank_out", "captum_attnflow.cli"}
    assert expected <= set(MODULES_WITH_EXAMPLES)


@pytest.mark.parametrize("module", MODULES_WITH_EXAMPLES)
def test_docstring_examples_run(module):
    """One runner for the examples of every module: they are the documentation users copy."""
    results = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert results.attempted > 0 and results.failed == 0
