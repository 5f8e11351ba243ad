"""Leaving the user's model exactly as it was: eager attention for one call, mode and hooks
restored, and one call at a time per model.

Asking a transformers 5 model for attentions changes it for the duration of the call: its
attention implementation (sdpa computes no weights), its mode (dropout would make the maps
random), its forward hooks (transformers installs output-capturing hooks on first use) and
``config.output_attentions``. Two threads doing that to one model at once would undo each
other's changes, so every call that touches a model holds that model's lock (:func:`exclusive`).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import weakref
from typing import Any, Callable, Iterator

from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from captum_attnflow.hf.dispatch import offloading_kept
from captum_attnflow.hf.models import configs, hf_models, owning_module


@contextlib.contextmanager
def eager_attention(module: nn.Module) -> Iterator[Callable[[nn.Module], str]]:
    """Context manager: every Hugging Face model inside ``module`` uses eager attention.

    Transformers 5 defaults to ``sdpa`` attention, which computes no attention weights, so
    ``output_attentions=True`` gives an empty tuple. Each model's own attention implementation
    is restored on exit, also after an exception; an attention put in by
    :func:`~captum_attnflow.capture.inject_attention` is kept (it returns the weights it applies). :func:`~captum_attnflow.extract_attentions` uses it; call it
    yourself to get attentions from a model you run directly.

    Args:
        module: a Hugging Face model, or any ``nn.Module`` containing some.

    Yields:
        ``own(model)``, the implementation a model inside ``module`` had on entry
        (see :func:`implementation`); inside the block the models compute eager attention.

    Example::

        >>> import torch
        >>> from transformers import BertConfig, BertModel
        >>> from captum_attnflow import eager_attention
        >>> model = BertModel(BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
        ...     intermediate_size=64, attn_implementation="sdpa")).eval()
        >>> ids = torch.tensor([[101, 7592, 102]])
        >>> len(model(ids, output_attentions=True).attentions)  # sdpa computes no weights
        0
        >>> with eager_attention(model):
        ...     output = model(ids, output_attentions=True)
        >>> len(output.attentions), model.config._attn_implementation  # restored afterwards
        (2, 'sdpa')
    """
    # An attention put in by inject_attention returns its weights already: it stays.
    with implementation(module, "eager", keep=frozenset(SUBSTITUTED_ATTENTION)) as own:
        yield own


# Attention implementations whose weights are not softmax(q k^T s + M) of the layer's own queries
# and keys (captum_attnflow's inject_attention adds its own): a model running one is explained
# with the weights it returns, never switched to eager nor recomputed from queries and keys.
SUBSTITUTED_ATTENTION: set[str] = set()


def uses_substituted_attention(module: nn.Module) -> bool:
    """Whether a Hugging Face model inside ``module`` runs an attention of :data:`SUBSTITUTED_ATTENTION`."""
    found = configs(hf_models(module)).values()
    return any(config._attn_implementation_internal in SUBSTITUTED_ATTENTION for config in found)


_REGISTERED = threading.Lock()


def register_attention(name: str, function: Callable[..., Any], mask_function: Callable[..., Any]) -> None:
    """Register ``function`` under ``name`` with transformers' attention-function interface, and
    ``mask_function`` to build its masks, once per process (the first of concurrent callers)."""
    with _REGISTERED:
        if name not in ALL_ATTENTION_FUNCTIONS:
            AttentionInterface.register(name, function)
            AttentionMaskInterface.register(name, mask_function)


@contextlib.contextmanager
def implementation(
    module: nn.Module, name: str, keep: frozenset[str] = frozenset()
) -> Iterator[Callable[[nn.Module], str]]:
    """Every Hugging Face model inside ``module`` uses the attention implementation ``name``
    (a built-in one or one registered with ``transformers.AttentionInterface``) for the block,
    except configs whose implementation is in ``keep``; the model is locked against other
    threads for the block (:func:`exclusive`).

    Written into every config and sub-config (models read ``config._attn_implementation`` at
    each forward) and restored to each one's own value on exit, also when the block raises.
    Yields ``own(model)``: the implementation a Hugging Face model inside ``module`` had on
    entry, the one an attention function registered under ``name`` delegates to. Read anywhere
    else, a model's config may hold another thread's function (whose own delegates back to it).
    """
    with exclusive(module):
        # Read under the lock: another thread's call may have switched the model a moment ago.
        found = configs(hf_models(module))
        saved = {key: config._attn_implementation for key, config in found.items()}
        internal = {key: config._attn_implementation_internal for key, config in found.items()}
        try:
            for config in found.values():
                if config._attn_implementation_internal not in keep:
                    config._attn_implementation_internal = name
            yield lambda model: saved[id(model.config)]
        finally:
            for key, config in found.items():
                config._attn_implementation_internal = internal[key]


_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
)
_HOOKS_INSTALLED = "_output_capturing_hooks_installed"


@contextlib.contextmanager
def unchanged(module: nn.Module) -> Iterator[None]:
    """Run the block with ``module`` in eval mode, alone; restore modes, forward hooks and the
    output-capturing flag on exit (:func:`hooks_restored`), and offload again the weights of a
    model dispatched by accelerate that a raising forward left loaded
    (:func:`~captum_attnflow.hf.dispatch.offloading_kept`)."""
    with exclusive(module), hooks_restored(module), offloading_kept(module):
        modules = list(module.modules())
        modes = [m.training for m in modules]
        module.eval()
        try:
            yield
        finally:
            for m, mode in zip(modules, modes):
                m.training = mode


@contextlib.contextmanager
def hooks_restored(module: nn.Module) -> Iterator[None]:
    """On exit, every submodule of ``module`` has exactly the forward hooks and output-capturing
    flag it had on entry, also when the block raises.

    The first time a transformers 5 model is asked for attentions it installs output-capturing
    hooks on its layers and keeps them (flagged by ``_output_capturing_hooks_installed``); the
    user's model must come back with exactly the hooks it had.
    """
    modules = list(module.modules())
    hooks = [{name: set(getattr(m, name, {})) for name in _HOOK_DICTS} for m in modules]
    flags = [m.__dict__.get(_HOOKS_INSTALLED) for m in modules]
    try:
        yield
    finally:
        for m, before, flag in zip(modules, hooks, flags):
            for name, keys in before.items():
                added = getattr(m, name, {})
                for key in [key for key in added if key not in keys]:
                    del added[key]
            if flag is None:
                m.__dict__.pop(_HOOKS_INSTALLED, None)
            else:
                m.__dict__[_HOOKS_INSTALLED] = flag


_LOCKS: "weakref.WeakKeyDictionary[nn.Module, threading.RLock]" = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def exclusive(module: nn.Module) -> Iterator[None]:
    """Hold the locks of ``module`` and of every Hugging Face model in it for the block.

    Re-entrant, so nested calls of one thread (an evaluator calling a method) go through; locks
    are taken in one global order (by id), so two threads locking overlapping sets of models
    cannot deadlock. Calls on different models still run in parallel.
    """
    targets = {id(m): m for m in [module, *hf_models(module)]}
    with _LOCKS_GUARD:
        locks = [_LOCKS.setdefault(targets[key], threading.RLock()) for key in sorted(targets)]
    with contextlib.ExitStack() as stack:
        for lock in locks:
            stack.enter_context(lock)
        yield


@contextlib.contextmanager
def model_call(forward_func: Any) -> Iterator[None]:
    """A call on ``forward_func`` as the baselines and evaluators make it: its module (if it has
    one) alone and in eval mode for the block, modes and hooks restored afterwards (:func:`unchanged`)."""
    module = owning_module(forward_func)
    if module is None:
        yield
        return
    with unchanged(module):
        yield


# Whether relevance rules (AttnLRP's) run in this context: a thread's or task's own, so a call
# on another thread is not affected.
_RELEVANCE_RULES: contextvars.ContextVar[bool] = contextvars.ContextVar("captum_attnflow_relevance_rules", default=False)


@contextlib.contextmanager
def relevance_rules() -> Iterator[None]:
    """Context manager: relevance rules run in this context for the block (:func:`held_in_lrp` holds its values)."""
    token = _RELEVANCE_RULES.set(True)
    try:
        yield
    finally:
        _RELEVANCE_RULES.reset(token)


def held_in_lrp(value: Tensor) -> Tensor:
    """``value`` itself, held constant (detached) while AttnLRP's rules run: a norm or scale that a
    module around the model divides by (a cosine similarity's :math:`\\lVert u \\rVert`), given the
    identity rule on its division as the rules give the model's own norms; outside a run the plain
    ``value``, its gradient kept.

    Example::

        >>> import torch
        >>> x = torch.ones(2, requires_grad=True)
        >>> held_in_lrp(x.norm()).requires_grad  # no AttnLRP run here: the plain gradient
        True
    """
    return value.detach() if _RELEVANCE_RULES.get() else value
