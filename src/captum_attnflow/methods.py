"""The attribution methods the ``captum-attnflow`` command and :mod:`captum_attnflow.reproduce` run, by name.

One registry serves both: ``explain --method NAME`` looks a method up here, and the paper's
tables are made of the same entries (the attention methods as rows, the output-based
methods as references). Each entry builds the attribution object for a model, so a new
method added here appears in both places: :data:`METHODS`, name -> :class:`Method`, in the
order the command prints them.

Example::

    >>> from captum_attnflow import load_agreement_model
    >>> from captum_attnflow.methods import METHODS, attention_methods
    >>> attention_methods()
    ('raw', 'rollout', 'flow', 'gradient_rollout', 'value_zeroing', 'alti', 'norm')
    >>> paper_methods(), [method.title for method in METHODS.values() if not method.per_layer]
    (('raw', 'rollout', 'flow'), ['input gradients', 'blank-out', 'AttnLRP'])
    >>> model, tokenizer = load_agreement_model()
    >>> ids = tokenizer(["the keys to the cabinet"], return_tensors="pt")["input_ids"]
    >>> METHODS["rollout"].build(model, tokenizer).attribute(ids, layer=None).shape  # (L, B, n)
    torch.Size([6, 1, 6])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from captum_attnflow.attr import (
    ALTI,
    AttnLRP,
    AttentionFlow,
    AttentionNorm,
    AttentionRollout,
    GradientWeightedRollout,
    RawAttention,
    ValueZeroing,
)
from captum_attnflow.baselines import BlankOut, TokenInputXGradient, TokenIntegratedGradients, TokenSaliency


@dataclass(frozen=True)
class Method:
    """One attribution method of the registry.

    Attributes:
        name: its name on the command line (``explain --method NAME``).
        title: its name in tables and figures (the paper's: "blank-out", "input gradients").
        per_layer: True for the attention methods, which score the input tokens for the
            representation of a position after each layer ((L, B, n) with ``layer=None``);
            False for the methods explaining the model's output ((B, n), one map).
        build: ``build(model, tokenizer, **options)`` returns the Captum attribution object,
            ``options`` passed on to its constructor (e.g. ``softmax=False`` for blank-out); the
            methods with ``from_attentions`` also accept a callable returning attentions as ``model``.
        from_attentions: True for the methods computed from the attention weights alone (the
            paper's three, which also give per-head results, ``head=``); False for those reading
            gradients or the model's internals, which need the model itself.
        class_specific: True when ``target`` chooses what is explained (gradients, blank-out).
        display: keyword arguments of ``attribute`` for maps shown to a person (``explain``,
            ``figures``, the HTML view), as ``(name, value)`` pairs: gradient-weighted rollout
            shows the row of R - I, its explained token's own 1 removed.
        on_scores: ``options`` of ``build`` when the model gives one score rather than class
            logits (a difference, a regression output), as ``(name, value)`` pairs: blank-out
            then measures the drop of the score itself, not of its softmax.
        signed: True when the scores, as ``build`` makes the method, can be negative (a
            relevance or a change of the output that can speak against the explained class:
            AttnLRP, blank-out); the heatmaps draw these on a scale centred at 0. False for
            weights, shares, norms and clamped gradients, which are never below 0, and for
            input x gradient and integrated gradients, which ``build`` reduces per token by
            the norm (their ``reduce="sum"`` option gives signed scores).
    """

    name: str
    title: str
    per_layer: bool
    build: Callable[..., Any]
    from_attentions: bool = False
    class_specific: bool = False
    display: tuple = ()
    on_scores: tuple = ()
    signed: bool = False


def _on_model(attribution_class: type) -> Callable[..., Any]:
    """``build`` of a method constructed from the model alone (and its options)."""
    return lambda model, tokenizer, **options: attribution_class(model, **options)


def _blank_out(model: Any, tokenizer: Any, **options: Any) -> BlankOut:
    # The paper's blank: the unknown token, looked up on the tokenizer.
    return BlankOut(model, tokenizer=tokenizer, **options)


METHODS: dict[str, Method] = {
    method.name: method
    for method in (
        Method("raw", "raw", True, _on_model(RawAttention), from_attentions=True),
        Method("rollout", "rollout", True, _on_model(AttentionRollout), from_attentions=True),
        Method("flow", "flow", True, _on_model(AttentionFlow), from_attentions=True),
        Method(
            "gradient_rollout", "gradient-weighted rollout", True,
            _on_model(GradientWeightedRollout), class_specific=True,
            display=(("remove_identity", True),),
        ),
        Method("value_zeroing", "value zeroing", True, _on_model(ValueZeroing)),
        Method("alti", "ALTI", True, _on_model(ALTI)),
        Method("norm", "attention norm", True, _on_model(AttentionNorm)),
        Method("saliency", "input gradients", False, _on_model(TokenSaliency), class_specific=True),
        Method(
            "blankout", "blank-out", False, _blank_out, class_specific=True, on_scores=(("softmax", False),), signed=True,
        ),
        Method("attnlrp", "AttnLRP", False, _on_model(AttnLRP), class_specific=True, signed=True),
    )
}


def attention_methods() -> tuple[str, ...]:
    """The names of the per-layer (attention) methods, in registry order; example in the module docstring."""
    return tuple(name for name, method in METHODS.items() if method.per_layer)


def generated_text_methods() -> tuple[str, ...]:
    """The names of the methods :class:`~captum_attnflow.LLMAttentionAttribution` wraps, which
    explain generated text: the attention methods and AttnLRP."""
    return (*attention_methods(), "attnlrp")


def paper_methods() -> tuple[str, ...]:
    """The paper's three methods, computed from attention weights alone: ``("raw", "rollout", "flow")``."""
    return tuple(name for name, method in METHODS.items() if method.from_attentions)


# Built by name like the registry's methods (Evaluator, benchmark), but not in METHODS: the
# paper's tables take METHODS' output-based methods as their references.
EXTRA_METHODS: dict[str, Method] = {
    method.name: method
    for method in (
        Method(
            "input_x_gradient", "input x gradient", False,
            _on_model(TokenInputXGradient), class_specific=True,
        ),
        Method(
            "integrated_gradients", "integrated gradients", False,
            lambda model, tokenizer, **options: TokenIntegratedGradients(model, tokenizer=tokenizer, **options), class_specific=True,
        ),
    )
}


def method_entry(name: str) -> Method:
    """The :class:`Method` named ``name`` in :data:`METHODS` or :data:`EXTRA_METHODS`.

    Raises:
        ValueError: an unknown name; the message lists the known ones.

    Example::

        >>> method_entry("integrated_gradients").title
        'integrated gradients'
    """
    entry = METHODS.get(name, EXTRA_METHODS.get(name))
    if entry is None:
        known = ", ".join([*METHODS, *EXTRA_METHODS])
        raise ValueError(f"unknown method {name!r}; the methods built by name are {known}.")
    return entry
