"""The floating-point weight of a linear layer, whatever stores it: ``nn.Linear``, GPT-2's
``Conv1D``, and the quantized layers a model loaded through transformers' quantization configs
holds (bitsandbytes' 4-bit and 8-bit layers, torchao's quantized weight tensors).

ALTI, the attention norms and value zeroing multiply by the attention's output projection, and
the gradient methods differentiate through every projection; on a quantized model both read the
weight the layer applies, dequantized by the quantizing library's own functions:

* bitsandbytes ``Linear4bit`` (nf4, fp4, with or without the nested statistics):
  ``dequantize_4bit``. On a CPU with AVX512-BF16 bitsandbytes repacks the weight at the layer's
  first call without gradients, into a layout of its fused kernel whose block maxima are
  bfloat16 and transposed: the codes are unpacked by its inverse conversion (on copies) and the
  weight is dequantized with those bfloat16 maxima, the weight that kernel applies.
* bitsandbytes ``Linear8bitLt``: the int8 rows times their scales over 127
  (``int8_vectorwise_dequant``), the scales read where the layer keeps them (on the weight until
  its first call, then on the layer's matmul state).
* torchao: a weight tensor that quantizes itself (``Int8Tensor`` and the other subclasses of
  ``quantize_``) gives ``weight.dequantize()``.

Nothing here imports bitsandbytes: a model holding its layers has it installed.
"""

from __future__ import annotations

import copy
import sys
from types import ModuleType

import torch
from torch import Tensor, nn
from transformers.pytorch_utils import Conv1D


def linear_weight(layer: nn.Module) -> tuple[Tensor, Tensor | None]:
    """``(W (D_out, D_in), b (D_out,) or None)`` that ``layer`` applies, :math:`y = x W^\\top + b`,
    as floating-point tensors detached from autograd (see the module docstring for the quantized
    layers; a quantized layer's output differs from ``F.linear(x, W, b)`` by the rounding of its
    own kernel, and for 8-bit layers by the int8 rounding of the input).

    Raises:
        TypeError: a layer other than an ``nn.Linear`` (or a subclass, as the quantized layers
            are) or a ``Conv1D``.

    Example::

        >>> import torch
        >>> from captum_attnflow.hf.weights import linear_weight
        >>> layer = torch.nn.Linear(3, 2)
        >>> weight, bias = linear_weight(layer)
        >>> x = torch.randn(4, 3)
        >>> torch.allclose(layer(x), x @ weight.T + bias)
        True
    """
    if isinstance(layer, Conv1D):
        return layer.weight.detach().t(), _detached(layer.bias)
    if not isinstance(layer, nn.Linear):
        raise TypeError(f"expected a linear layer (nn.Linear, a quantized subclass, or Conv1D), got {type(layer).__name__}.")
    bias = _detached(layer.bias)
    kind = _quantization(layer)
    if kind == "bitsandbytes 4-bit":
        return _four_bit(sys.modules["bitsandbytes"], layer.weight), bias
    if kind == "bitsandbytes 8-bit":
        scales = layer.weight.SCB if getattr(layer.weight, "SCB", None) is not None else layer.state.SCB
        return sys.modules["bitsandbytes"].functional.int8_vectorwise_dequant(layer.weight.data, scales), bias
    weight = layer.weight
    if kind == "dequantize":
        with torch.no_grad():
            return weight.dequantize(), bias
    if not weight.is_floating_point():
        raise TypeError(
            f"{type(layer).__name__} holds {weight.dtype} weights in a form this library cannot dequantize; it reads "
            "bitsandbytes' 4-bit and 8-bit layers and weight tensors with a dequantize() method (torchao)."
        )
    return weight.detach(), bias


def is_quantized(layer: nn.Module) -> bool:
    """Whether ``layer`` is a linear layer whose weight is stored quantized (see the module docstring)."""
    return _quantization(layer) is not None


def _quantization(layer: nn.Module) -> str | None:
    """How a linear layer's weight is stored quantized, or None for a float weight. A bitsandbytes
    4-bit weight may be stored in a float dtype (``bnb_4bit_quant_storage``), so its flag is read."""
    if not isinstance(layer, nn.Linear):
        return None
    bnb = sys.modules.get("bitsandbytes")
    if bnb is not None and isinstance(layer, bnb.nn.Linear4bit) and getattr(layer.weight, "bnb_quantized", False):
        return "bitsandbytes 4-bit"
    if bnb is not None and isinstance(layer, bnb.nn.Linear8bitLt) and layer.weight.dtype == torch.int8:
        return "bitsandbytes 8-bit"
    if type(layer.weight) not in (Tensor, nn.Parameter) and callable(getattr(layer.weight, "dequantize", None)):
        return "dequantize"
    return None


def _detached(tensor: Tensor | None) -> Tensor | None:
    return None if tensor is None else tensor.detach()


def _four_bit(bnb: ModuleType, weight: Tensor) -> Tensor:
    """(D_out, D_in) the weight of a bitsandbytes ``Params4bit``, in its canonical or CPU-packed layout."""
    functional = bnb.functional
    state = weight.quant_state
    if not getattr(state, "packing_format_for_cpu", False):
        return functional.dequantize_4bit(weight.data, state)
    # The inverse conversion restores the codes; on a copy, since it rewrites the state it is given,
    # and told the maxima were not nested, since re-nesting them would round them again (and
    # without nesting it leaves them transposed: put back in block order here).
    unpacking = copy.copy(state)
    unpacking.original_nested = False
    codes, _ = functional._convert_weight_packed_for_cpu_inverse(weight.data.clone(), unpacking)
    maxima = state.absmax.t().reshape(-1).float()
    canonical = functional.QuantState(
        absmax=maxima, shape=state.shape, code=state.code, blocksize=state.blocksize, quant_type=state.quant_type,
        dtype=state.original_dtype,
    )
    return functional.dequantize_4bit(codes, canonical)
