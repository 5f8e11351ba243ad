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


# Every other method, float32 and bfloat16: on CUDA the lean blocks, the gradient-weighted maps,
# ALTI's distances and the norms run in the Triton kernels (capture/lean_triton.py,
# functional/decomposition_triton.py), value zeroing in chunks sized by the GPU's free memory.
INTERNALS_METHODS = {"alti": "ALTI", "norms": "AttentionNorm", "value zeroing": "ValueZeroing",
                     "gradient-weighted rollout": "GradientWeightedRollout", "attnlrp": "AttnLRP"}


def _causal_lm(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = CONFIGS[arch]()
    config.initializer_range = 0.2  # maps far from uniform
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def close_to_float32(ours: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, msg: str) -> None:
    """float32 on CUDA: the CPU's numbers to 1e-5 (atol) and 1e-4 (rtol); bfloat16 weights: within
    5e-2 of the largest score (the half-precision distance of tests/attr/test_half_precision.py)."""
    assert ours.device.type == "cuda" and ours.dtype == torch.float32, msg
    if dtype == torch.float32:
        torch.testing.assert_close(ours.cpu(), expected, atol=1e-5, rtol=1e-4, msg=msg)
    else:
        assert float((ours.cpu() - expected).abs().max() / expected.abs().max()) < 5e-2, msg


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama"])
@pytest.mark.parametrize("method", sorted(INTERNALS_METHODS))
def test_internals_and_gradient_methods_agree(method, arch, dtype):
    import captum_attnflow

    model = make_classifier() if arch == "bert" else _causal_lm(arch)
    ids, mask = padded_batch(seed=6, batch=3, n=11)
    last = mask.sum(1) - 1
    explainer = getattr(captum_attnflow, INTERNALS_METHODS[method])
    options = {"target": 1} if method in ("gradient-weighted rollout", "attnlrp") else {}
    expected = explainer(model).attribute(ids, attention_mask=mask, position=last, layer=None, **options)
    on_gpu = copy.deepcopy(model).to(DEVICE, dtype)
    ours = explainer(on_gpu).attribute(
        ids.to(DEVICE), attention_mask=mask.to(DEVICE), position=last.to(DEVICE), layer=None, **options
    )
    close_to_float32(ours, expected, dtype, f"{method} {arch}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_llm_wrapper_agrees(dtype):
    from captum.attr import TextTokenInput

    from captum_attnflow import AttentionRollout, GradientWeightedRollout, LLMAttentionAttribution
    from captum_attnflow.models.language_model import build_lm_tokenizer

    tokenizer = build_lm_tokenizer()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64, num_hidden_layers=3,
                                      max_position_embeddings=64, bos_token_id=2, eos_token_id=3, pad_token_id=0)
    model = transformers.LlamaForCausalLM(config).eval()
    on_gpu = copy.deepcopy(model).to(DEVICE, dtype)
    for method in (AttentionRollout, GradientWeightedRollout):
        expected = LLMAttentionAttribution(method(model), tokenizer).attribute(
            TextTokenInput("the keys to the cabinet", tokenizer), target="are .", show_progress=False
        )
        ours = LLMAttentionAttribution(method(on_gpu), tokenizer).attribute(
            TextTokenInput("the keys to the cabinet", tokenizer), target="are .", show_progress=False
        )
        close_to_float32(ours.token_attr, expected.token_attr, dtype, method.__name__)


def test_evaluator_agrees():
    from captum_attnflow import ALTI, AttentionRollout, GradientWeightedRollout
    from captum_attnflow.evaluate import Evaluator

    model = make_classifier()
    ids, mask = padded_batch(seed=7)
    batch = {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 2, 1])}

    def evaluate(model, device):
        methods = {"rollout": AttentionRollout(model), "alti": ALTI(model), "grad-rollout": GradientWeightedRollout(model)}
        result = Evaluator(model, methods, {"saliency": TokenSaliency(model)}, show_progress=False).run(
            [{key: value.to(device) for key, value in batch.items()}]
        )
        return result.scores

    expected, ours = evaluate(model, torch.device("cpu")), evaluate(copy.deepcopy(model).to(DEVICE), DEVICE)
    assert ours.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(torch.as_tensor(ours[key]), torch.as_tensor(expected[key]), atol=1e-4, rtol=0, equal_nan=True,
                                   msg=str(key))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True], ids=["padded", "causal"])
def test_kernels_equal_the_torch_path_at_size(dtype, causal, monkeypatch):
    """The compiled kernels at BERT-like and Llama-like head counts, n = 1000 (many tiles), in
    row blocks, against the torch path on the same device (TF32 off, torch's default)."""
    from captum_attnflow.capture import lean_blocks
    from captum_attnflow.capture.lean_blocks import AttentionScores, fused_blocks

    generator = torch.Generator().manual_seed(0)
    heads, kv_heads = (12, 12) if not causal else (32, 8)
    query = torch.randn(2, heads, 1000, 64, generator=generator).to(DEVICE, dtype)
    key = torch.randn(2, kv_heads, 1000, 64, generator=generator).to(DEVICE, dtype)
    grad_output = torch.randn(2, heads, 1000, 64, generator=generator).to(DEVICE, dtype)
    value = torch.randn(2, kv_heads, 1000, 64, generator=generator).to(DEVICE, dtype)
    mask = None
    if not causal:
        mask = torch.ones(2, 1, 1, 1000, dtype=torch.bool, device=DEVICE)
        mask[1, ..., 900:] = False
    scores = AttentionScores(query, key, mask, 0.125, causal)

    def whole(gradient):
        out = torch.zeros(2, 1000, 1000, device=DEVICE)
        for start, stop, block in fused_blocks(scores, "mean", gradient=gradient):
            out[:, start:stop, : block.shape[-1]] = block
        return out

    assert lean_blocks._kernels(DEVICE) is not None, "triton ships with torch's CUDA builds"
    results = {gradient: whole(gradient) for gradient in (None, (grad_output, value))}
    monkeypatch.setattr(lean_blocks, "_kernels", lambda device: None)
    for gradient, ours in results.items():
        tolerance = dict(atol=1e-6, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(ours, whole(gradient), **tolerance)


@pytest.mark.parametrize("post_norm", [False, True], ids=["pre-LN", "post-LN"])
def test_decomposition_kernels_equal_the_torch_path_at_size(post_norm):
    """ALTI's distances compiled, BERT-base's 12 heads and D = 768, n = 300 (several row tiles
    and feature chunks), padding keys, against the torch path's row blocks on CUDA, a
    block of rows fed alone equal to those rows; the norms' Gram form against the vectors' lengths."""
    from captum_attnflow.functional import decomposition, decomposition_triton

    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 12, 300, 300, generator=generator)
    scores[1, :, :, 250:] = float("-inf")
    probabilities = torch.softmax(scores, -1).to(DEVICE)
    values, weight = torch.randn(2, 12, 300, 64, generator=generator), torch.randn(768, 768, generator=generator) / 30
    projected = decomposition.projected_values(values.to(DEVICE), weight.to(DEVICE))
    inputs = torch.randn(2, 300, 768, generator=generator).to(DEVICE)
    outputs = inputs + torch.randn(2, 300, 768, generator=generator).to(DEVICE)
    scale = (torch.rand(2, 300, 768, generator=generator) + 0.5).to(DEVICE) if post_norm else None
    expected = torch.cat([decomposition._distances(probabilities, projected, inputs, outputs, scale, rows)
                          for rows in decomposition._row_blocks(2, 300, 768)], 1)
    ours = decomposition_triton.alti_distances(probabilities, projected, inputs, outputs, scale)
    assert torch.equal(torch.isinf(ours), torch.isinf(expected))
    finite = torch.isfinite(expected)
    torch.testing.assert_close(ours[finite], expected[finite], atol=1e-3, rtol=1e-5)
    norms = torch.cat([decomposition.transformed_vectors(probabilities, projected, rows).norm(dim=-1)
                       for rows in decomposition._row_blocks(2, 300, 768)], 1)
    mask = torch.ones(2, 300, dtype=torch.bool, device=DEVICE)
    gram = decomposition.attention_norms(probabilities, values.to(DEVICE), weight.to(DEVICE), mask)
    torch.testing.assert_close(gram, norms, atol=1e-5, rtol=1e-5)
    rows = slice(40, 300)  # a block of rows with its offset, as the lean capture feeds them
    block = decomposition_triton.alti_distances(
        probabilities[:, :, rows], projected, inputs[:, rows], outputs[:, rows], None if scale is None else scale[:, rows], 40
    )
    torch.testing.assert_close(block, ours[:, rows], atol=0, rtol=1e-6)
