"""Every method gives on CUDA what it gives on CPU (skipped without a CUDA device).

Each test runs a method on a model and a padded batch on the CPU, then on a copy of the model
and the batch moved to CUDA, and compares. Tolerances are those of float32 kernels computing
the same sums in a different order (TF32 off, torch's default for matmuls): attention maps and
the maths on them agree to ~1e-6; gradients pass through a full backward and agree relatively.
"""

from __future__ import annotations

import copy

import pytest
import torch

from helpers import FirstTokenClassifier, make_classifier, padded_batch
from captum_attnflow import AttentionFlow, AttentionRollout, AttnLRP, RawAttention
from captum_attnflow.baselines import BlankOut, TokenInputXGradient, TokenIntegratedGradients, TokenSaliency
from captum_attnflow.evaluate import aopc_comprehensiveness
from helpers import make_tiny_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DEVICE = torch.device("cuda")
ATTENTION_METHODS = {"raw": RawAttention, "rollout": AttentionRollout, "flow": AttentionFlow}
GRADIENT_METHODS = {
    "saliency": TokenSaliency,
    "input x gradient": TokenInputXGradient,
    "integrated gradients": TokenIntegratedGradients,
    "attnlrp": AttnLRP,
}


def on_cpu_and_gpu(model, attribute):
    """``attribute(model, device)`` on the CPU model and on a CUDA copy; both results on the CPU."""
    on_cpu = attribute(model, torch.device("cpu"))
    on_gpu = attribute(copy.deepcopy(model).to(DEVICE), DEVICE)
    assert on_gpu.device.type == "cuda", "the attribution must come back on the inputs' device"
    return on_cpu, on_gpu.cpu()


@pytest.mark.parametrize("method", sorted(ATTENTION_METHODS))
@pytest.mark.parametrize("position", [0, -1])
def test_attention_methods_agree(arch, method, position):
    model = make_tiny_model(arch)
    ids, mask = padded_batch(seed=1)
    position = position if position == 0 else mask.sum(-1) - 1  # the last real token of each row

    def attribute(model, device):
        explainer = ATTENTION_METHODS[method](model)
        positions = position.to(device) if isinstance(position, torch.Tensor) else position
        return explainer.attribute(ids.to(device), position=positions, layer=None, attention_mask=mask.to(device))

    on_cpu, on_gpu = on_cpu_and_gpu(model, attribute)
    assert on_cpu.shape == (3, 4, 9)
    torch.testing.assert_close(on_gpu, on_cpu, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("method", sorted(GRADIENT_METHODS))
@pytest.mark.parametrize("wrapped", [False, True], ids=["hf-classifier", "wrapper-module"])
def test_gradient_methods_agree(method, wrapped):
    model = FirstTokenClassifier("bert") if wrapped else make_classifier()
    ids, mask = padded_batch(seed=2)
    target = torch.tensor([0, 1, 1, 0])

    def attribute(model, device):
        device_mask = mask.to(device)
        kwargs = dict(target=target.to(device), attention_mask=device_mask)
        if wrapped:
            kwargs["additional_forward_args"] = (device_mask,)
        if method == "integrated gradients":
            kwargs["baselines"] = 0  # the pad id: the wrapper has no config to look it up on
        return GRADIENT_METHODS[method](model).attribute(ids.to(device), **kwargs)

    on_cpu, on_gpu = on_cpu_and_gpu(model, attribute)
    assert on_cpu.abs().sum() > 0
    torch.testing.assert_close(on_gpu, on_cpu, atol=1e-5, rtol=1e-3)


def test_blank_out_agrees():
    model = make_classifier()
    ids, mask = padded_batch(seed=3)

    def attribute(model, device):
        return BlankOut(model, token=3).attribute(ids.to(device), attention_mask=mask.to(device))

    on_cpu, on_gpu = on_cpu_and_gpu(model, attribute)
    assert on_cpu.abs().sum() > 0
    torch.testing.assert_close(on_gpu, on_cpu, atol=1e-5, rtol=1e-4)


def test_aopc_agrees():
    model = make_classifier()
    ids, mask = padded_batch(seed=4)
    scores = torch.rand(ids.shape, generator=torch.Generator().manual_seed(0))

    def attribute(model, device):
        return aopc_comprehensiveness(model, ids.to(device), scores.to(device), attention_mask=mask.to(device))

    on_cpu, on_gpu = on_cpu_and_gpu(model, attribute)
    torch.testing.assert_close(on_gpu, on_cpu, atol=1e-5, rtol=1e-4)
