"""Finding the Hugging Face models inside what the user passed, their configs and device."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel


def owning_module(forward_func: Any) -> nn.Module | None:
    """``forward_func`` itself if it is a module, the module of a bound method, else None."""
    if isinstance(forward_func, nn.Module):
        return forward_func
    owner = getattr(forward_func, "__self__", None)
    return owner if isinstance(owner, nn.Module) else None


def hf_models(module: nn.Module) -> list[nn.Module]:
    """Every Hugging Face model in ``module`` (itself included), parents first."""
    return [m for m in module.modules() if isinstance(m, PreTrainedModel)]


def outermost(models: list[nn.Module]) -> list[nn.Module]:
    """Models not contained in another model of the list (``modules()`` lists parents first)."""
    inner: set[int] = set()
    outer = []
    for model in models:
        if id(model) not in inner:
            outer.append(model)
            inner.update(id(m) for m in model.modules() if m is not model)
    return outer


def main_model(forward_func: Any) -> nn.Module | None:
    """The Hugging Face model that ``forward_func`` is or wraps (the outermost one), else None."""
    module = owning_module(forward_func)
    models = outermost(hf_models(module)) if module is not None else []
    return models[0] if models else None


def configs(models: list[nn.Module]) -> dict[int, Any]:
    """The configs of ``models`` and, recursively, their sub-configs (keyed by id: configs are not hashable).

    ``set_attn_implementation`` also rewrites sub-configs that no sub-model owns.
    """
    found: dict[int, Any] = {}
    pending = [model.config for model in models]
    while pending:
        config = pending.pop()
        if id(config) not in found:
            found[id(config)] = config
            subs = (getattr(config, key, None) for key in getattr(config, "sub_configs", {}))
            pending.extend(sub for sub in subs if sub is not None)
    return found


def accelerate_hooks(module: nn.Module) -> list[Any]:
    """The hooks accelerate put on ``module`` (``module._hf_hook``, or the hooks of a ``SequentialHook``)."""
    hook = getattr(module, "_hf_hook", None)
    if hook is None:
        return []
    return list(getattr(hook, "hooks", [hook]))


def input_device(forward_func: Any) -> torch.device | None:
    """The device ``forward_func`` takes its inputs on: for a model dispatched by accelerate
    (``from_pretrained(..., device_map=...)``, ``cpu_offload``), the execution device of its first
    hook that has one (the model's own: where accelerate runs the first layers); else the device
    of its first parameter; None for a callable without parameters."""
    module = owning_module(forward_func)
    if module is None:
        return None
    for submodule in module.modules():
        for hook in accelerate_hooks(submodule):
            device = getattr(hook, "execution_device", None)
            if device is not None:
                return torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    parameter = next(module.parameters(), None)
    return parameter.device if parameter is not None else None


def check_device(forward_func: Any, inputs: Tensor) -> None:
    """Refuse inputs on another device than the model's (:func:`input_device`), naming the move."""
    device = input_device(forward_func)
    if device is not None and device != inputs.device:
        raise ValueError(
            f"inputs are on {inputs.device} but the model is on {device}; "
            f"move them with inputs.to({str(device)!r})."
        )


def encoder_of(model: PreTrainedModel, args: tuple) -> nn.Module:
    """The module to run for the attentions over the input tokens: the encoder of an
    encoder-decoder model (T5, BART, ...), else the model itself."""
    if not getattr(model.config, "is_encoder_decoder", False):
        return model
    if args:
        raise ValueError(
            f"{type(model).__name__} is an encoder-decoder model: the attention methods explain its input "
            "tokens through the encoder's self-attention and run the encoder alone, which takes no "
            "additional_forward_args; drop them (decoder inputs do not change the encoder's attentions)."
        )
    return model.get_encoder()
