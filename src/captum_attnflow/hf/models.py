"""Finding the Hugging Face models inside what the user passed, their configs and device."""

from __future__ import annotations

from typing import Any

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


def check_device(forward_func: Any, inputs: Tensor) -> None:
    """Refuse inputs on another device than the model's parameters, naming the move."""
    module = owning_module(forward_func)
    parameter = next(module.parameters(), None) if module is not None else None
    if parameter is not None and parameter.device != inputs.device:
        raise ValueError(
            f"inputs are on {inputs.device} but the model is on {parameter.device}; "
            f"move them with inputs.to({str(parameter.device)!r})."
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
