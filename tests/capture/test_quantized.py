"""dequantized_gradients: a quantized layer's input gradient is the output gradient times its
dequantized weight, also where the library's kernel has no backward (as bitsandbytes' CPU-packed
4-bit kernel has none); outputs untouched, hooks removed."""

from __future__ import annotations

import pytest
import torch

from captum_attnflow.capture.quantized import dequantized_gradients
from captum_attnflow.hf.weights import linear_weight


@pytest.fixture
def four_bit():
    bnb = pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)
    source = torch.nn.Linear(64, 96)
    layer = bnb.nn.Linear4bit(64, 96, quant_type="nf4")
    layer.load_state_dict(source.state_dict())
    return bnb, torch.nn.Sequential(layer.to("cpu").eval(), torch.nn.Tanh())


def test_gradient_through_a_kernel_without_backward(four_bit, monkeypatch):
    bnb, model = four_bit
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected_output = model(x)
    matmul = bnb.matmul_4bit
    monkeypatch.setattr(bnb, "matmul_4bit", lambda *args, **kwargs: matmul(*args, **kwargs).detach())
    leaf = x.clone().requires_grad_()
    assert not model(leaf).requires_grad  # the kernel's output carries no graph
    seed = torch.randn(2, 5, 96, generator=torch.Generator().manual_seed(2))
    with dequantized_gradients(model) as layers:
        output = model(leaf)
        (gradient,) = torch.autograd.grad(output, leaf, seed)
    assert layers == [model[0]]
    torch.testing.assert_close(output, expected_output, atol=0, rtol=0)
    weight, _ = linear_weight(model[0])
    torch.testing.assert_close(gradient, (seed * (1 - expected_output**2)) @ weight, atol=1e-6, rtol=1e-6)
    assert not model[0]._forward_hooks


def test_no_gradient_no_rule_and_hooks_removed_after_an_error(four_bit):
    _, model = four_bit
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    with dequantized_gradients(model), torch.no_grad():
        assert model[0](x).grad_fn is None
    with pytest.raises(RuntimeError, match="boom"), dequantized_gradients(model):
        raise RuntimeError("boom")
    assert not model[0]._forward_hooks
