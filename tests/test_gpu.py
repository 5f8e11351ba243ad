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
import transformers

from helpers import FirstTokenClassifier, make_classifier, padded_batch
from captum_attnflow import AttentionFlow, AttentionRollout, AttnLRP, RawAttention
from captum_attnflow.baselines import BlankOut, TokenInputXGradient, TokenIntegratedGradients, TokenSaliency
from captum_attnflow.evaluate import aopc_comprehensiveness
from helpers import CONFIGS, TOKEN_METHODS, make_tiny_model

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


def agrees_on_gpu(model, attribute, rtol=1e-4):
    """``attribute(model, device)`` on the CPU model and on a CUDA copy agree to ``rtol`` (atol
    1e-5) and the CUDA one comes back on CUDA; returns the CPU result."""
    on_cpu = attribute(model, torch.device("cpu"))
    on_gpu = attribute(copy.deepcopy(model).to(DEVICE), DEVICE)
    assert on_gpu.device.type == "cuda", "the attribution must come back on the inputs' device"
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, atol=1e-5, rtol=rtol)
    return on_cpu


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

    on_cpu = agrees_on_gpu(model, attribute)
    assert on_cpu.shape == (3, 4, 9)


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

    on_cpu = agrees_on_gpu(model, attribute, rtol=1e-3)
    assert on_cpu.abs().sum() > 0


def test_blank_out_agrees():
    model = make_classifier()
    ids, mask = padded_batch(seed=3)

    def attribute(model, device):
        return BlankOut(model, token=3).attribute(ids.to(device), attention_mask=mask.to(device))

    on_cpu = agrees_on_gpu(model, attribute)
    assert on_cpu.abs().sum() > 0


def test_aopc_agrees():
    model = make_classifier()
    ids, mask = padded_batch(seed=4)
    scores = torch.rand(ids.shape, generator=torch.Generator().manual_seed(0))

    def attribute(model, device):
        return aopc_comprehensiveness(model, ids.to(device), scores.to(device), attention_mask=mask.to(device))

    agrees_on_gpu(model, attribute)


# A device map over two devices: the GPUs 0 and 1 (or GPU 0 twice when only one is lent), one
# block offloaded to the CPU and one to disk (both run on GPU 0, their weights moved in by
# accelerate's hooks at each forward).
TWO_DEVICES = [0, 1] if torch.cuda.device_count() > 1 else [0, 0]
FIRST_GPU = torch.device("cuda", 0)
OFFLOADED = {"gpt2": ("transformer.h.1.", "transformer.h.2."), "llama": ("model.layers.1.", "model.layers.2.")}


def two_device_map(arch: str, devices: list) -> dict:
    if arch == "gpt2":
        return {"transformer.wte": devices[0], "transformer.wpe": devices[0], "transformer.drop": devices[0],
                "transformer.h.0": devices[1], "transformer.h.1": "cpu", "transformer.h.2": "disk",
                "transformer.ln_f": devices[1], "lm_head": devices[0]}
    return {"model.embed_tokens": devices[0], "model.rotary_emb": devices[0], "model.layers.0": devices[1],
            "model.layers.1": "cpu", "model.layers.2": "disk", "model.norm": devices[1], "lm_head": devices[1]}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_every_method_on_a_model_dispatched_over_two_devices(arch, dtype, tmp_path):
    from captum_attnflow import GradientWeightedRollout
    from captum_attnflow.hf import input_device

    torch.manual_seed(0)
    config = CONFIGS[arch]()
    config.initializer_range = 0.2
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(tmp_path)
    dispatched = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, device_map=two_device_map(arch, TWO_DEVICES), offload_folder=tmp_path / "offload", dtype=dtype
    ).eval()
    assert input_device(dispatched) == FIRST_GPU
    ids, mask = padded_batch(seed=5, batch=3, n=7)
    last = mask.sum(1) - 1
    for method in TOKEN_METHODS:
        options = {"target": 7} if method in (GradientWeightedRollout, AttnLRP) else {}
        expected = method(model).attribute(ids, attention_mask=mask, position=last, layer=None, **options)
        ours = method(dispatched).attribute(
            ids.to(FIRST_GPU), attention_mask=mask.to(FIRST_GPU), position=last.to(FIRST_GPU), layer=None, **options
        )
        assert ours.device == FIRST_GPU and ours.dtype == torch.float32
        if dtype == torch.float32:
            torch.testing.assert_close(ours.cpu(), expected, atol=1e-5, rtol=1e-4, msg=method.__name__)
        else:  # the half-precision distance of tests/attr/test_half_precision.py
            assert float((ours.cpu() - expected).abs().max() / expected.abs().max()) < 5e-2, method.__name__
    offloaded = [p.device.type for name, p in dispatched.named_parameters() if name.startswith(OFFLOADED[arch])]
    assert offloaded and set(offloaded) == {"meta"}  # the offloaded blocks are offloaded again
