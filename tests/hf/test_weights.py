"""linear_weight: the weight a linear layer applies, for nn.Linear, GPT-2's Conv1D, bitsandbytes'
4-bit layers (both layouts) and 8-bit layers, and torchao's int8 weights, each against the
quantizing library's own dequantization and the layer's own output."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.pytorch_utils import Conv1D

from captum_attnflow.hf.weights import is_quantized, linear_weight


def _float_layer(seed: int = 0, features: int = 64, outputs: int = 96) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(features, outputs)


def _inputs(features: int = 64) -> torch.Tensor:
    return torch.randn(3, 5, features, generator=torch.Generator().manual_seed(1))


def test_float_layers_are_read_as_they_are():
    linear, conv = _float_layer(), Conv1D(96, 64)
    x = _inputs()
    for layer in (linear, conv):
        weight, bias = linear_weight(layer)
        assert weight.shape == (96, 64) and not weight.requires_grad and not is_quantized(layer)
        torch.testing.assert_close(layer(x), F.linear(x, weight, bias), atol=1e-6, rtol=1e-6)
    with pytest.raises(TypeError, match="expected a linear layer"):
        linear_weight(torch.nn.LayerNorm(4))


def _four_bit(quant_type: str, nested: bool):
    bnb = pytest.importorskip("bitsandbytes")
    source = _float_layer()
    layer = bnb.nn.Linear4bit(64, 96, quant_type=quant_type, compress_statistics=nested)
    layer.load_state_dict(source.state_dict())
    return bnb, layer.to("cpu").eval()  # quantized on the move to a device


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("nested", [False, True])
def test_bitsandbytes_4bit_weight_is_its_dequantized_weight(quant_type, nested):
    bnb, layer = _four_bit(quant_type, nested)
    assert is_quantized(layer) and layer.weight.dtype == torch.uint8
    canonical = bnb.functional.dequantize_4bit(layer.weight.data, layer.weight.quant_state)
    weight, bias = linear_weight(layer)
    assert torch.equal(weight, canonical)
    x = _inputs()
    with torch.no_grad():
        output = layer(x)  # on an AVX512-BF16 CPU this call repacks the weight (and runs in bfloat16)
    weight, bias = linear_weight(layer)
    if getattr(layer.weight.quant_state, "packing_format_for_cpu", False):
        # the fused kernel rounds its input and output to bfloat16 (8 significant bits each)
        bound = 2 * 2**-8 * (x.abs() @ weight.abs().T) + 2**-8 * output.abs()
        assert ((output - F.linear(x, weight, bias)).abs() <= bound).all()
    else:  # the layer dequantizes and calls F.linear, as here
        torch.testing.assert_close(output, F.linear(x, weight, bias), atol=0, rtol=0)


@pytest.mark.parametrize("nested", [False, True])
def test_bitsandbytes_4bit_cpu_packed_layout(nested):
    """The layout bitsandbytes converts a 4-bit weight to at its first call without gradients on an
    AVX512-BF16 CPU, made here with its own conversion: the weight read is the codes times the
    bfloat16 block maxima that its kernel multiplies, where ``dequantize_4bit`` on the packed data
    reads garbage and bitsandbytes' inverse conversion misplaces the maxima of unnested weights."""
    bnb, layer = _four_bit("nf4", nested)
    functional = bnb.functional
    state = layer.weight.quant_state
    maxima = state.absmax if not nested else functional.dequantize_blockwise(state.absmax, state.state2) + state.offset
    rounded = functional.QuantState(
        absmax=maxima.bfloat16().float(), shape=state.shape, code=state.code, blocksize=state.blocksize,
        quant_type=state.quant_type, dtype=state.dtype,
    )
    expected = functional.dequantize_4bit(layer.weight.data, rounded)
    layer.weight.data, layer.weight.quant_state = functional._convert_weight_packed_for_cpu(layer.weight.data, state)
    assert layer.weight.quant_state.packing_format_for_cpu and layer.weight.shape == (96, 32)
    packed_data, packed_state = layer.weight.data.clone(), layer.weight.quant_state.absmax.clone()
    weight, _ = linear_weight(layer)
    assert torch.equal(weight, expected)
    assert torch.equal(layer.weight.data, packed_data) and torch.equal(layer.weight.quant_state.absmax, packed_state)
    assert layer.weight.quant_state.packing_format_for_cpu  # the layer is left packed
    naive = functional.dequantize_4bit(layer.weight.data, layer.weight.quant_state)
    assert (naive.float() - expected).abs().max() > 0.1


def test_bitsandbytes_8bit_weight_before_and_after_its_first_call():
    """An 8-bit layer keeps its scales on the weight until its first call, then on its matmul state;
    its output differs from F.linear by no more than the int8 rounding of each input row (half a
    step of max|x_i| / 127) and the float16 rounding of its input and output."""
    bnb = pytest.importorskip("bitsandbytes")
    source = _float_layer()
    layer = bnb.nn.Linear8bitLt(64, 96, has_fp16_weights=False, threshold=6.0)
    layer.load_state_dict(source.state_dict())
    layer = layer.to("cpu").eval()
    assert is_quantized(layer) and layer.weight.SCB is not None
    expected = bnb.functional.int8_vectorwise_dequant(layer.weight.data, layer.weight.SCB)
    before, bias = linear_weight(layer)
    assert torch.equal(before, expected)
    # the int8 weight is the float one, rounded to float16 (11 significant bits), to half a step
    # of its row's scale
    weight = source.weight.detach()
    steps = weight.abs().amax(1, keepdim=True) / 127
    assert ((before - weight).abs() <= steps / 2 + 2**-10 * weight.abs()).all()
    x = _inputs() * 3  # some inputs beyond the outlier threshold, computed in float16
    with torch.no_grad():
        output = layer(x)
    assert layer.weight.SCB is None and layer.state.SCB is not None
    after, _ = linear_weight(layer)
    assert torch.equal(after, before)
    half_step = x.abs().amax(-1, keepdim=True) / 254
    bound = (half_step + 2**-11 * x.abs()) @ after.abs().T + 2**-11 * output.abs()
    assert ((output - F.linear(x, after, bias)).abs() <= bound).all()


def test_torchao_int8_weight_only():
    quantization = pytest.importorskip("torchao.quantization")
    layer = torch.nn.Sequential(_float_layer())
    quantization.quantize_(layer, quantization.Int8WeightOnlyConfig())
    layer = layer[0]
    assert is_quantized(layer) and type(layer.weight) is not torch.nn.Parameter
    weight, bias = linear_weight(layer)
    assert type(weight) is torch.Tensor and not weight.requires_grad
    torch.testing.assert_close(weight, layer.weight.dequantize(), atol=0, rtol=0)
    x = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
