"""Layer-wise recomputation: a model's transformer blocks keep only their inputs for the backward
pass, and each block runs again, alone, when the backward pass reaches it.

A backward pass through a transformer keeps, per block, every tensor its operations saved: at
Llama geometry about 16 numbers per token and hidden unit (queries, keys and values, the norms'
inputs, the feed-forward's gate, up and activated products, ...), so the activations outgrow the
weights from a few thousand tokens on. With :func:`layerwise_recomputation` each block's call is
wrapped in ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` for the block: its
forward saves only its inputs, and the backward pass recomputes the block's forward when it
reaches it, with the same forward hooks (AttnLRP's rules, a capture's attention function), so
its saved tensors are the ones the first forward made. One block's activations are alive at a
time; the price is one more forward pass per backward pass.

A hook that records something (a capture appending each layer's call) reads
:func:`recomputing` and records only in the first forward. The recomputation runs in the
context variables of the block's first call (the backward pass may run on another thread, a
GPU's autograd thread), so a run's state held in a context variable is found there too.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from transformers.cache_utils import Cache

from captum_attnflow.hf.architectures import architecture_of
from captum_attnflow.hf.models import main_model

# A block keeps about this many numbers per token and hidden unit for a backward pass: AttnLRP
# 15.6, gradient-weighted rollout and Captum's gradients 19.5, measured at Llama geometry (hidden
# 1024, intermediate 2816, float32: benchmarks/depth.py).
ACTIVATION_WIDTHS = 16
# Nor below this many bytes of a block's activations: there the memory saved is small in absolute
# terms and the recomputation still costs a forward pass (a 2-layer model of width 128 holds 2 MB
# a block at 260 tokens, and recomputing made its AttnLRP call 1.8x Captum's gradient call).
RECOMPUTE_FLOOR_BYTES = 32 * 2**20

_RECOMPUTING: contextvars.ContextVar[bool] = contextvars.ContextVar("captum_attnflow_recomputing", default=False)


def recomputing() -> bool:
    """Whether the forward running now is a block's recomputation during a backward pass
    (:func:`layerwise_recomputation`): a hook that records what a forward computed records only
    when this is False."""
    return _RECOMPUTING.get()


@contextlib.contextmanager
def layerwise_recomputation(blocks: list[nn.Module]) -> Iterator[None]:
    """Context manager: each call of one of ``blocks`` inside the block, with autograd on, keeps
    only its inputs for the backward pass, which runs the block's forward again when it reaches it.

    Each block's ``forward`` is wrapped for the block (its own, or the one accelerate's hooks put
    on the instance) and restored exactly on exit, also when the block raises. The backward
    passes must run inside the block, where the recomputation finds the hooks and attention
    implementation of the first forward. A block's call is given no key-value cache (a cache
    filled twice would be wrong), as transformers' own gradient checkpointing does; the model's
    mode is not changed (transformers' checkpointing needs training mode).

    Example::

        >>> import torch, transformers
        >>> from captum_attnflow.capture.recompute import layerwise_recomputation
        >>> model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_head=4, n_layer=2)).eval()
        >>> ids = torch.tensor([[5, 6, 7]])
        >>> expected = torch.autograd.grad(model(ids).logits[0, -1, 9], model.lm_head.weight)[0]
        >>> with layerwise_recomputation(list(model.transformer.h)):
        ...     gradient = torch.autograd.grad(model(ids).logits[0, -1, 9], model.lm_head.weight)[0]
        >>> torch.equal(gradient, expected), "forward" in vars(model.transformer.h[0])
        (True, False)
    """
    unique = list(dict.fromkeys(blocks))  # a shared block (ALBERT) is listed once per call
    own = [block.__dict__.get("forward") for block in unique]
    try:
        for block in unique:
            block.__dict__["forward"] = _checkpointed(block.forward)
        yield
    finally:
        for block, forward in zip(unique, own):
            if forward is None:
                block.__dict__.pop("forward", None)
            else:
                block.__dict__["forward"] = forward


def recomputes(recompute: bool | None, forward_func: Any, inputs: Tensor, method: str) -> bool:
    """Whether a call of ``method`` on ``inputs`` recomputes its blocks: ``recompute`` if given
    (True checked: the model's blocks must be known); for None, on token ids (B, n) whose
    activations outweigh a block's weights and take at least :data:`RECOMPUTE_FLOOR_BYTES`,

    .. math::
        B\\, n\\, D\\, w \\ge P_{block}, \\qquad B\\, n\\, D\\, w\\, s \\ge 32\\ \\mathrm{MiB},

    D the hidden size, w = :data:`ACTIVATION_WIDTHS`, :math:`P_{block}` the parameters of one
    block and s the bytes of a number of the model's dtype: from 689 tokens at the geometry of
    ``benchmarks/depth.py``, 1 857 at Llama-3.2-1B's, 3 329 at Llama-3.1-8B's, 683 at
    GPT-2-small's in float32. Below that the weights dominate a backward pass's memory, or the
    activations are small anyway, and recomputation costs time (a forward pass per backward
    pass) for little.

    Raises:
        ValueError: ``recompute=True`` on a model whose transformer blocks the architecture table does not list.
    """
    if recompute is False:
        return False
    blocks = recomputed_blocks(forward_func)
    if recompute:
        if not blocks:
            raise ValueError(
                f"recompute=True: {method} recomputes the transformer blocks of the model types of "
                "captum_attnflow.hf.architectures, and found none in this model; use recompute=None or False."
            )
        return True
    if not blocks or inputs.dim() != 2 or inputs.dtype.is_floating_point:
        return False
    model = main_model(forward_func)
    hidden = getattr(model.config.get_text_config(), "hidden_size", None)
    if hidden is None:
        return False
    weights = sum(p.numel() for p in blocks[0].parameters())
    activations = inputs.numel() * hidden * ACTIVATION_WIDTHS
    return activations >= weights and activations * model.dtype.itemsize >= RECOMPUTE_FLOOR_BYTES


def recomputed_blocks(forward_func: Any) -> list[nn.Module]:
    """The transformer blocks :func:`layerwise_recomputation` wraps for ``forward_func``, in
    order; empty for a model the architecture table does not know."""
    try:
        return architecture_of(forward_func, "layer-wise recomputation")[1]
    except ValueError:
        return []


def _checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` called through ``torch.utils.checkpoint``, its recomputations in the context
    of its first call with :func:`recomputing` True."""

    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        args = tuple(None if isinstance(a, Cache) else a for a in args)
        kwargs = {key: None if isinstance(v, Cache) else v for key, v in kwargs.items()}
        if "use_cache" in kwargs:
            kwargs["use_cache"] = False
        context = contextvars.copy_context()
        runs = []

        def run(*args: Any, **kwargs: Any) -> Any:
            if not runs:
                runs.append(None)
                return forward(*args, **kwargs)
            return context.copy().run(_recomputed, forward, args, kwargs)

        return checkpoint(run, *args, use_reentrant=False, **kwargs)

    return checkpointed


def _recomputed(forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    _RECOMPUTING.set(True)  # in a copied context: gone when the recomputation returns
    return forward(*args, **kwargs)
