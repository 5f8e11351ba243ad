"""AttnLRP's rules on the model's norms, element-wise activations and gated feed-forwards, as
forward hooks that return the module's own output with a modified gradient (the rules and their
equations are in :mod:`captum_attnflow.capture.lrp`, which installs them for one run).

* LayerNorm and RMSNorm: the identity rule on their division, :math:`1/\\sigma` held constant
  (:class:`_NormRule`);
* element-wise activations: the identity rule, gradient :math:`f(x)/x` (:class:`_IdentityRule`);
* the two factors of a gated unit: the uniform rule, the multiplied factor's gradient halved
  (:class:`_GradientScale`); the bilinear products of torch's own ``nn.MultiheadAttention``
  (SigLIP's pooling head), through the gradients of its inputs;
* an element-wise function between the model's last module and its logits (Gemma 2's final
  soft-capping): the identity rule, through hooks on that module and the model.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
import transformers.activations
from torch import Tensor, nn

from captum_attnflow.hf.architectures import ACTIVATIONS, RMS_NORMS, SCALED_RMS_NORMS, Architecture
from captum_attnflow.hf.dispatch import onloaded

# Element-wise activations of torch (transformers' own are every module of transformers.activations).
_TORCH_ACTIVATIONS = (
    nn.GELU, nn.SiLU, nn.Tanh, nn.ReLU, nn.Sigmoid, nn.Mish, nn.ELU, nn.LeakyReLU, nn.Softplus, nn.Hardswish,
)



class _GradientScale(torch.autograd.Function):
    """``x`` itself, its gradient multiplied by ``factor``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, factor: float) -> Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, gradient: Tensor) -> tuple[Tensor, None]:
        return gradient * ctx.factor, None


class _IdentityRule(torch.autograd.Function):
    """``y = f(x)`` of an element-wise f, with gradient ``factor * f(x) / x`` (0 where x = 0, where
    the relevance ``x * gradient`` is 0 whatever it is)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor, factor: float) -> Tensor:
        ratio = torch.where(x == 0, torch.zeros_like(y), y / torch.where(x == 0, torch.ones_like(x), x))
        ctx.save_for_backward(ratio * factor)
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, gradient: Tensor) -> tuple[Tensor, None, None]:
        (ratio,) = ctx.saved_tensors
        return gradient * ratio, None, None


class _NormRule(torch.autograd.Function):
    """The norm's output ``y``, with the gradient of :math:`x \\mapsto w \\odot P x / \\sigma` at
    :math:`\\sigma` held constant: P the centring :math:`I - \\tfrac1D 1 1^\\top` (LayerNorm) or
    the identity (RMSNorm). Saves only :math:`\\sigma` (..., 1) and w, less than the norm's own backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor, weight: Tensor | None, sigma: Tensor, centred: bool) -> Tensor:
        ctx.save_for_backward(weight, sigma)
        ctx.centred = centred
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, gradient: Tensor) -> tuple[Tensor | None, ...]:
        weight, sigma = ctx.saved_tensors
        scaled = (gradient if weight is None else gradient * weight) / sigma
        if ctx.centred:
            scaled = scaled - scaled.mean(-1, keepdim=True)
        return scaled.to(gradient.dtype), None, None, None, None


def _norm_weight(module: nn.Module) -> Tensor | None:
    """The norm's weight (None without one), read through accelerate's hooks: the rule runs after
    the norm's forward, when an offloaded norm's weight is back on ``meta``."""
    with onloaded(module, [module]):
        return None if module.weight is None else module.weight.detach()


def _layer_norm_rule(module: nn.LayerNorm, args: tuple, output: Tensor) -> Tensor:
    x = args[0].detach()
    sigma = (x.var(-1, unbiased=False, keepdim=True) + module.eps).sqrt()
    return _NormRule.apply(args[0], output.detach(), _norm_weight(module), sigma, True)


def _rms_norm_rule(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
    x = args[0].detach().float()
    sigma = (x.pow(2).mean(-1, keepdim=True) + module.variance_epsilon).sqrt()
    return _NormRule.apply(args[0], output.detach(), _norm_weight(module), sigma, False)


def _activation_rule(factor: float) -> Callable[[nn.Module, tuple, Tensor], Tensor]:
    def rule(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        return _IdentityRule.apply(args[0], output.detach(), factor)

    return rule


def _halved(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
    return _GradientScale.apply(output, 0.5)


def _second_half_halved(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
    """A fused gate-and-up projection: the gradient of its second half (the multiplied factor) halved."""
    factor = torch.ones(output.shape[-1], dtype=output.dtype, device=output.device)
    factor[output.shape[-1] // 2 :] = 0.5
    return _GradientScale.apply(output, factor)


def _held(module: nn.Module, args: tuple, output: Any) -> Any:
    """The module's outputs as constants of the backward pass (tensors of a tuple detached)."""
    if isinstance(output, Tensor):
        return output.detach()
    return type(output)(o.detach() if isinstance(o, Tensor) else o for o in output)


def _function_activation_hooks(model: nn.Module, architecture: Architecture) -> list[Any]:
    """The identity rule on each element-wise function the architecture lists between two modules,
    ``consumer(f(producer(x)))``: the consumer's input becomes ``f(z)`` with gradient ``f(z) / z``
    with respect to the producer's output z."""
    if architecture.function_activations is None:
        return []
    handles = []
    for producer, consumer, function in architecture.function_activations(model):
        produced: list[Tensor] = []

        def keep(module: nn.Module, args: tuple, output: Tensor, produced: list[Tensor] = produced) -> None:
            produced[:] = [output]

        def rule(module: nn.Module, args: tuple, produced: list[Tensor] = produced, function: Callable = function) -> tuple:
            z, y = produced[0], args[0]
            if y.shape != z.shape or not torch.equal(function(z.detach()), y.detach()):
                raise ValueError(
                    f"AttnLRP expected {type(module).__name__}'s input to be {function.__name__} of the previous "
                    "layer's output (the architecture table's function_activations); it is not, so the rule "
                    "cannot be applied."
                )
            return (_IdentityRule.apply(z, y.detach(), 1.0), *args[1:])

        handles += [producer.register_forward_hook(keep), consumer.register_forward_pre_hook(rule)]
    return handles


def _output_activation_hooks(model: nn.Module, architecture: Architecture) -> list[Any]:
    """The identity rule on the element-wise function the architecture lists between the model's
    last module and its logits, ``logits = f(producer(x))`` (Gemma 2's final soft-capping): the
    output's logits become ``f(z)`` with gradient ``f(z) / z`` with respect to the producer's
    output z."""
    found = architecture.output_activation(model) if architecture.output_activation is not None else None
    if found is None:
        return []
    producer, function = found
    produced: list[Tensor] = []

    def keep(module: nn.Module, args: tuple, output: Tensor) -> None:
        produced[:] = [output]

    def rule(module: nn.Module, args: tuple, output: Any) -> Any:
        z, y = produced[0], getattr(output, "logits", None)
        if y is None or y.shape != z.shape or not torch.equal(function(z.detach()), y.detach()):
            raise ValueError(
                f"AttnLRP expected {type(module).__name__}'s logits to be {function.__name__} of its "
                f"{type(producer).__name__}'s output (the architecture table's output_activation); they are not, "
                "so the rule cannot be applied."
            )
        output.logits = _IdentityRule.apply(z, y.detach(), 1.0)
        return output

    return [producer.register_forward_hook(keep), model.register_forward_hook(rule)]


def _multihead_attention_hooks(model: nn.Module) -> list[Any]:
    """The uniform rule on the bilinear products of each ``nn.MultiheadAttention`` (SigLIP's
    pooling head): its query, key and value inputs' gradients scaled by 1/4, 1/4, 1/2, its
    projections of them being linear (as the attention function does to the projected ones)."""

    def rule(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
        for name, factor in (("query", 0.25), ("key", 0.25), ("value", 0.5)):
            bound.arguments[name] = _GradientScale.apply(bound.arguments[name], factor)
        return bound.args, bound.kwargs

    return [m.register_forward_pre_hook(rule, with_kwargs=True) for m in model.modules() if isinstance(m, nn.MultiheadAttention)]


def _is_activation(module: nn.Module) -> bool:
    return (isinstance(module, _TORCH_ACTIVATIONS) or type(module).__module__ == transformers.activations.__name__
            or type(module).__name__ in ACTIVATIONS)


def _rule_hooks(model: nn.Module, architecture: Architecture, blocks: list[nn.Module]) -> list[tuple[nn.Module, Callable]]:
    """``(module, forward hook)`` for every norm, activation and gated factor of ``model``.

    Raises:
        ValueError: a norm the rules do not know (its identity rule needs its formula).
    """
    unique = list(dict.fromkeys(blocks))  # a shared block (ALBERT) is listed once per call
    gated = [architecture.gated_unit(block) for block in unique] if architecture.gated_unit is not None else []
    gated = [unit for unit in gated if unit is not None]
    gates = {id(activation) for activation, _ in gated}
    halved = _second_half_halved if architecture.fused_gate else _halved
    hooks: list[tuple[nn.Module, Callable]] = [(up, halved) for _, up in gated]
    experts = [architecture.gated_experts(block) for block in unique] if architecture.gated_experts is not None else []
    hooks += [(module, _halved) for unit in experts if unit is not None for module in unit[1:]]
    held = [m for block in unique for m in architecture.held_constant(block)] if architecture.held_constant else []
    hooks += [(module, _held) for module in held]
    for module in model.modules():
        name = type(module).__name__
        if any(module is m for m in held):
            continue
        if isinstance(module, nn.LayerNorm):
            hooks.append((module, _layer_norm_rule))
        elif name in RMS_NORMS:
            hooks.append((module, _rms_norm_rule))
        elif name in SCALED_RMS_NORMS:  # y = w' x / sigma: the gradient at sigma held is y / x
            hooks.append((module, _activation_rule(1.0)))
        elif "Norm" in name:
            raise ValueError(
                f"AttnLRP knows LayerNorm and the RMS norms {RMS_NORMS + SCALED_RMS_NORMS}; the model has a {name}, whose "
                "identity rule needs its formula: add it to captum_attnflow.hf.architectures."
            )
        elif _is_activation(module):
            hooks.append((module, _activation_rule(0.5 if id(module) in gates else 1.0)))
    return hooks
