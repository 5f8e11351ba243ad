"""Gradients through the quantized linear layers of a model, taken with their dequantized weights.

A quantized layer (bitsandbytes' 4-bit and 8-bit layers, torchao's quantized weights) computes
its output :math:`y` with its own kernel; its gradient with respect to the input is
:math:`\\nabla_x = \\nabla_y W`, W the dequantized weight
(:func:`~captum_attnflow.hf.weights.linear_weight`), as bitsandbytes' own backward computes it.
The gradient methods take it here rather than from the library's autograd, which not every
layout has: bitsandbytes' CPU-packed 4-bit kernel (see :mod:`captum_attnflow.hf.weights`) has
no backward at all. The layer's output is its own; W is read again in the backward pass, so no
more than one layer's dequantized weight exists at a time.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import Tensor, nn

from captum_attnflow.hf.weights import is_quantized, linear_weight


class _DequantizedLinear(torch.autograd.Function):
    """``y`` itself (the layer's output), with the gradient of :math:`x \\mapsto x W^\\top`, W the
    layer's dequantized weight."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor, layer: nn.Module) -> Tensor:
        ctx.layer = layer
        return y.view_as(y)

    @staticmethod
    def backward(ctx: Any, gradient: Tensor) -> tuple[Tensor, None, None]:
        weight, _ = linear_weight(ctx.layer)
        return gradient @ weight.to(gradient.dtype), None, None


def _dequantized_gradient(layer: nn.Module, args: tuple, output: Tensor) -> Tensor | None:
    x = args[0]
    if not (torch.is_grad_enabled() and isinstance(x, Tensor) and x.requires_grad):
        return None
    return _DequantizedLinear.apply(x, output.detach(), layer)


@contextlib.contextmanager
def dequantized_gradients(model: nn.Module) -> Iterator[list[nn.Module]]:
    """Context manager: inside the block every quantized linear layer of ``model`` returns its own
    output with the gradient :math:`\\nabla_y W` (see the module docstring); yields those layers.

    The hooks run before any other forward hook of the layer (those see the output carrying this
    gradient) and are removed on exit, also after an exception. A layer called without
    gradients, or on an input that needs none, runs untouched.

    Example::

        >>> import torch
        >>> from captum_attnflow.capture.quantized import dequantized_gradients
        >>> with dequantized_gradients(torch.nn.Sequential(torch.nn.Linear(2, 2))) as layers:
        ...     len(layers)  # a float model has none
        0
    """
    layers = [module for module in model.modules() if is_quantized(module)]
    handles = [layer.register_forward_hook(_dequantized_gradient, prepend=True) for layer in layers]
    try:
        yield layers
    finally:
        for handle in handles:
            handle.remove()
