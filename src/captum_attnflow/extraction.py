"""Getting attention maps out of Hugging Face models or user callables, leaving the model unchanged.

Transformers 5 loads models with ``sdpa`` attention, which returns an empty ``attentions``
tuple for ``output_attentions=True``. :func:`eager_attention` switches every Hugging Face
model inside a module to eager attention for one call and restores each one's own setting
afterwards, also when the call raises.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn

try:  # transformers is a dependency, but keep the callable path usable without it
    from transformers import PreTrainedModel
except ImportError:  # pragma: no cover
    PreTrainedModel = ()  # type: ignore[assignment,misc]


def extract_attentions(
    forward_func: Callable[..., Any],
    inputs: Tensor,
    additional_forward_args: Any = None,
    attention_mask: Tensor | None = None,
) -> tuple[Tensor, ...]:
    """Run ``forward_func`` once without gradients and return its attentions, L tensors (B, H, n, n).

    ``forward_func`` may be

    * a Hugging Face model: called as ``model(inputs, *additional_forward_args,
      attention_mask=attention_mask, output_attentions=True)`` with eager attention;
    * any ``nn.Module`` (or bound method of one) that contains a Hugging Face model, e.g. a
      classifier or sentence-embedding wrapper: called as
      ``forward_func(inputs, *additional_forward_args)`` while the attentions of its outermost
      Hugging Face model are captured;
    * any other callable ``forward_func(inputs, *additional_forward_args)`` that returns the
      attentions: a sequence of (B, H, n, n) tensors, an (L, B, H, n, n) tensor, or an object
      with an ``attentions`` attribute.

    Raises:
        ValueError: the inputs are not on the model's device, or no attentions come back.
    """
    args = _as_tuple(additional_forward_args)
    module = _owning_module(forward_func)
    if module is not None:
        _check_device(module, inputs)
    with torch.no_grad():
        if isinstance(forward_func, PreTrainedModel):
            with eager_attention(forward_func):
                kwargs = {"output_attentions": True}
                if attention_mask is not None:
                    kwargs["attention_mask"] = attention_mask
                output = forward_func(inputs, *args, **kwargs)
        elif module is not None and _hf_models(module):
            output = _captured_attentions(module, lambda: forward_func(inputs, *args))
        else:
            output = forward_func(inputs, *args)
    return _attentions_of(output)


@contextlib.contextmanager
def eager_attention(module: nn.Module) -> Iterator[None]:
    """Context manager: every Hugging Face model inside ``module`` uses eager attention.

    Each model's own attention implementation is restored on exit, also after an exception.
    """
    configs = {id(model.config): model.config for model in _hf_models(module)}
    saved = {key: config._attn_implementation for key, config in configs.items()}
    try:
        for model in _outermost(_hf_models(module)):
            if model.config._attn_implementation != "eager":
                model.set_attn_implementation("eager")
        yield
    finally:
        # set_attn_implementation re-resolves sub-configs from the top-level request, which
        # could differ from what each sub-model had; writing back each config's own value
        # restores exactly what was there.
        for key, config in configs.items():
            config._attn_implementation_internal = saved[key]


def _captured_attentions(module: nn.Module, call: Callable[[], Any]) -> tuple[Tensor, ...]:
    """Call ``call()`` and return the attentions of the outermost Hugging Face model in ``module``."""
    captured: list[Any] = []
    targets = _outermost(_hf_models(module))
    saved = [model.config.output_attentions for model in targets]

    def keep_output(_module: nn.Module, _args: Any, output: Any) -> None:
        captured.append(output)

    handles = [model.register_forward_hook(keep_output) for model in targets]
    try:
        with eager_attention(module):
            for model in targets:
                model.config.output_attentions = True
            call()
    finally:
        for handle in handles:
            handle.remove()
        for model, value in zip(targets, saved):
            model.config.output_attentions = value
    if not captured:
        raise ValueError(
            f"{type(module).__name__} never called its Hugging Face model, so no attentions were captured; "
            "pass the Hugging Face model itself as forward_func."
        )
    return _attentions_of(captured[0])


def _attentions_of(output: Any) -> tuple[Tensor, ...]:
    attentions = getattr(output, "attentions", output)
    if isinstance(attentions, Tensor):
        attentions = tuple(attentions) if attentions.dim() == 5 else None
    if isinstance(attentions, (tuple, list)) and attentions and all(isinstance(a, Tensor) for a in attentions):
        return tuple(attentions)
    raise ValueError(
        "the model returned no attentions. A Hugging Face model must support output_attentions=True "
        "(eager attention is switched on automatically); a custom forward_func must return a sequence "
        f"of (B, H, n, n) attention tensors, an (L, B, H, n, n) tensor or an object with .attentions; got {type(output).__name__}."
    )


def _owning_module(forward_func: Any) -> nn.Module | None:
    if isinstance(forward_func, nn.Module):
        return forward_func
    owner = getattr(forward_func, "__self__", None)
    return owner if isinstance(owner, nn.Module) else None


def _hf_models(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, PreTrainedModel)] if PreTrainedModel else []


def _outermost(models: list[nn.Module]) -> list[nn.Module]:
    """Models not contained in another model of the list (``modules()`` lists parents first)."""
    inner: set[int] = set()
    outer = []
    for model in models:
        if id(model) not in inner:
            outer.append(model)
            inner.update(id(m) for m in model.modules() if m is not model)
    return outer


def _check_device(module: nn.Module, inputs: Tensor) -> None:
    parameter = next(module.parameters(), None)
    if parameter is not None and parameter.device != inputs.device:
        raise ValueError(
            f"inputs are on {inputs.device} but the model is on {parameter.device}; "
            f"move them with inputs.to({str(parameter.device)!r})."
        )


def _as_tuple(args: Any) -> tuple:
    if args is None:
        return ()
    return args if isinstance(args, tuple) else (args,)
