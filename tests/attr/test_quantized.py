"""Every method on models loaded quantized through transformers (bitsandbytes nf4, fp4 and 8-bit,
torchao int8 weight-only) on the CPU, against the same method on a float model whose linear
layers hold the quantized layers' dequantized weights; AttnLRP's conservation on the quantized
models; the model left as it was; the language-model wrapper.

The tolerance is derived from what the quantized kernels themselves add: each test measures ε,
the largest difference between a quantized layer's output and ``F.linear`` with its dequantized
weight, relative to that output's magnitude, over the layers' calls on the test's inputs (0 for
bitsandbytes' 4-bit layers on a CPU without AVX512-BF16, which dequantize and call F.linear;
about 2^-8 where they run the fused bfloat16 kernel; about 1e-2 for the 8-bit layers, which round
their inputs to int8; below 1e-6 for torchao's). See :func:`_tolerance`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from helpers import model_state

from captum_attnflow import (
    ALTI,
    AttentionFlow,
    AttentionNorm,
    AttentionRollout,
    AttnLRP,
    GradientWeightedRollout,
    LLMAttentionAttribution,
    RawAttention,
    ValueZeroing,
)
from captum_attnflow.hf.weights import is_quantized, linear_weight
from captum_attnflow.models.language_model import build_lm_tokenizer

pytest.importorskip("bitsandbytes")
pytest.importorskip("torchao")

METHODS = [RawAttention, AttentionRollout, AttentionFlow, GradientWeightedRollout, ALTI, AttentionNorm, ValueZeroing,
           AttnLRP]
LAYERS = 2
# Widths that are multiples of 32: bitsandbytes' CPU kernel packs 4-bit weights in blocks of 32 rows.
_TINY = dict(hidden_size=64, num_attention_heads=4, intermediate_size=128, num_hidden_layers=LAYERS,
             max_position_embeddings=64, initializer_range=0.2)
IDS = torch.tensor([[5, 9, 13, 22, 7, 30, 11, 40], [6, 8, 10, 11, 12, 14, 0, 0]])
MASK = (IDS != 0).long()


def _model(arch: str, vocab: int = 60, zero_values: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    if arch == "llama":
        config = transformers.LlamaConfig(vocab_size=vocab, num_key_value_heads=2, pad_token_id=0, bos_token_id=2,
                                          eos_token_id=3, **_TINY)
        model = transformers.LlamaForCausalLM(config)
        if zero_values:
            with torch.no_grad():
                for layer in model.model.layers:
                    layer.self_attn.v_proj.weight.zero_()
        return model.eval()
    if arch == "gpt2":
        config = transformers.GPT2Config(vocab_size=vocab, n_embd=64, n_head=4, n_layer=LAYERS, n_positions=64,
                                         initializer_range=0.2)
        return transformers.GPT2LMHeadModel(config).eval()
    config = transformers.BertConfig(vocab_size=vocab, num_labels=3, **_TINY)
    return transformers.BertForSequenceClassification(config).eval()


def _quantization(scheme: str, arch: str):
    if scheme == "torchao":
        from torchao.quantization import Int8WeightOnlyConfig

        return transformers.TorchAoConfig(Int8WeightOnlyConfig())
    # BERT's 3-way head stays in float (its rows are no multiple of 32); transformers keeps a
    # language model's output embedding in float itself
    skip = {"llm_int8_skip_modules": ["classifier"]} if arch == "bert" else {}
    if scheme == "int8":
        return transformers.BitsAndBytesConfig(load_in_8bit=True, **skip)
    return transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=scheme,
                                           bnb_4bit_use_double_quant=scheme == "fp4", **skip)


def _first_call(model: torch.nn.Module, ids: torch.Tensor = IDS) -> torch.nn.Module:
    """``model`` after one call without gradients: bitsandbytes converts its weights at a layer's
    first call (8-bit scales moved; 4-bit weights repacked on AVX512-BF16 CPUs), so the
    dequantized weights are read from then on."""
    with torch.no_grad():
        model(ids)
    return model


def _pair(arch: str, scheme: str, tmp_path_factory, **kwargs) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the model loaded quantized, the float model with each quantized layer's dequantized weight)."""
    path = tmp_path_factory.mktemp(f"{arch}_{scheme}")
    _model(arch, **kwargs).save_pretrained(path)
    model_class = type(_model(arch, **kwargs))
    quantized = model_class.from_pretrained(path, quantization_config=_quantization(scheme, arch), device_map="cpu")
    quantized = _first_call(quantized.eval())
    reference = model_class.from_pretrained(path).eval()
    layers = dict(reference.named_modules())
    count = 0
    with torch.no_grad():
        for name, layer in quantized.named_modules():
            if is_quantized(layer):
                weight, _ = linear_weight(layer)
                target = layers[name]  # GPT-2's Conv1D (stored transposed) is quantized as a linear layer
                target.weight.copy_(weight.t() if isinstance(target, transformers.pytorch_utils.Conv1D) else weight)
                count += 1
    assert count >= 4 * LAYERS  # at least each attention's projections
    return quantized, reference


def _layer_difference(model: torch.nn.Module, ids: torch.Tensor = IDS, mask: torch.Tensor = MASK) -> float:
    """ε: over the quantized layers' calls in a forward of ``ids``, the largest difference between
    the layer's output and ``F.linear`` with its dequantized weight, relative to the largest
    magnitude of that output."""
    differences = []

    def measure(layer: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        weight, bias = linear_weight(layer)
        expected = F.linear(args[0], weight.to(args[0].dtype), bias)
        differences.append(float((output - expected).abs().max() / expected.abs().max()))

    handles = [layer.register_forward_hook(measure) for layer in model.modules() if is_quantized(layer)]
    try:
        with torch.no_grad():
            model(ids, attention_mask=mask)
    finally:
        for handle in handles:
            handle.remove()
    return max(differences)


def _tolerance(epsilon: float, scale: float) -> float:
    """The scores' tolerance: to first order a block's output moves by the relative errors of the
    quantized projections along its longest chain (queries or keys into the scores, the values,
    the output projection, the feed-forward's two: 5 ε), those of the L blocks add up, and the
    explained score's own head or layer adds one more: 6 L ε of the scores' magnitude (measured
    on these models: up to 2.2 L ε). The floor, 1e-5, is float32 rounding of sums taken in
    another order."""
    return max(1e-5, 6 * LAYERS * epsilon) * scale


SCHEMES = ["nf4", "fp4", "int8", "torchao"]
CASES = [("llama", scheme) for scheme in SCHEMES] + [("gpt2", "nf4"), ("gpt2", "int8"), ("bert", "nf4"), ("bert", "int8")]
# Where the weights are read (the gradient methods and the decompositions); the attention-only
# methods read the attention maps alone, whatever computed them.
READ_WEIGHTS = {GradientWeightedRollout, ALTI, AttentionNorm, ValueZeroing, AttnLRP}


def _fast(arch: str, scheme: str, method: type) -> bool:
    """The cases of the test command: Llama in nf4, 8-bit and torchao for the methods that read
    weights, nf4 for the others (fp4 differs from nf4 only in its code table, tested in
    tests/hf/test_weights.py); ALTI and AttnLRP on GPT-2 in nf4 (its Conv1D layers become linear
    ones) and BERT in 8-bit (post-LN); the rest are marked slow."""
    if arch != "llama":
        return (arch, scheme) in (("gpt2", "nf4"), ("bert", "int8")) and method in (ALTI, AttnLRP)
    return scheme != "fp4" and (method in READ_WEIGHTS or scheme == "nf4")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """``(arch, scheme) -> (quantized, reference, ε)``, each pair loaded once."""
    cache = {}

    def get(arch: str, scheme: str):
        if (arch, scheme) not in cache:
            quantized, reference = _pair(arch, scheme, tmp_path_factory)
            cache[arch, scheme] = quantized, reference, _layer_difference(quantized)
        return cache[arch, scheme]

    return get


@pytest.mark.parametrize("arch, scheme, method", [
    pytest.param(arch, scheme, method, marks=() if _fast(arch, scheme, method) else pytest.mark.slow,
                 id=f"{arch}-{scheme}-{method.__name__}")
    for arch, scheme in CASES for method in METHODS
])
def test_scores_match_the_dequantized_float_model(pairs, arch, scheme, method):
    quantized, reference, epsilon = pairs(arch, scheme)
    if scheme in ("nf4", "fp4") and not _packed(quantized):
        assert epsilon == 0  # dequantize, then F.linear: the float model's own computation
    target = 1 if arch == "bert" else 5
    before = model_state(quantized)
    weights = _weights(quantized)
    ours = method(quantized).attribute(IDS, target=target, attention_mask=MASK)
    expected = method(reference).attribute(IDS, target=target, attention_mask=MASK)
    assert ours.shape == expected.shape and ours.dtype == expected.dtype
    torch.testing.assert_close(ours, expected, atol=_tolerance(epsilon, float(expected.abs().max())), rtol=0)
    assert model_state(quantized) == before
    assert all(torch.equal(a, b) for a, b in zip(_weights(quantized), weights))


def _packed(model: torch.nn.Module) -> bool:
    """Whether bitsandbytes repacked the model's 4-bit weights for its bfloat16 CPU kernel."""
    return any(getattr(getattr(layer.weight, "quant_state", None), "packing_format_for_cpu", False)
               for layer in model.modules() if is_quantized(layer))


def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [linear_weight(layer)[0] for layer in model.modules() if is_quantized(layer)]


@pytest.mark.parametrize("scheme", [pytest.param(s, marks=pytest.mark.slow) if s == "fp4" else s for s in SCHEMES])
def test_attnlrp_conserves_the_score_on_quantized_models(scheme, tmp_path_factory):
    """A bias-free Llama whose attention writes nothing (values 0): every rule conserves, so the
    score reaches the tokens, less what the quantized layers' kernels add to x W^T, which AttnLRP
    books with the biases (0 where the kernel is F.linear itself); nothing is left to the softmax."""
    quantized, reference = _pair("llama", scheme, tmp_path_factory, zero_values=True)
    ids = torch.tensor([[3, 9, 27, 4, 11]])
    for model in (quantized, reference):
        shares = {name: float(value[0]) for name, value in AttnLRP(model).shares(ids, target=7).items()}
        score = shares["score"]
        assert shares["tokens"] + shares["biases"] == pytest.approx(score, abs=2e-5 * abs(score))
        assert abs(shares["softmax"]) <= 2e-5 * abs(score)
        assert float(AttnLRP(model).attribute(ids, target=7).sum()) == pytest.approx(shares["tokens"], rel=1e-5)
        if model is quantized and _layer_difference(quantized, ids, torch.ones_like(ids)) == 0:
            assert shares["biases"] == 0
    assert shares["biases"] == 0  # the float model, bias-free


def test_language_model_wrapper(tmp_path_factory):
    """LLMAttentionAttribution over an nf4 Llama: each method's rows are those of the float model
    with the dequantized weights."""
    tokenizer = build_lm_tokenizer()
    quantized, reference = _pair("llama", "nf4", tmp_path_factory, vocab=len(tokenizer))
    prompt, target = "the keys to the cabinet", "are ."
    ids = tokenizer(f"{prompt} {target}", return_tensors="pt")["input_ids"]
    epsilon = _layer_difference(quantized, ids, torch.ones_like(ids))
    for method in (ALTI, AttnLRP):
        ours = LLMAttentionAttribution(method(quantized), tokenizer).attribute(prompt, target=target).token_attr
        expected = LLMAttentionAttribution(method(reference), tokenizer).attribute(prompt, target=target).token_attr
        torch.testing.assert_close(ours, expected, atol=_tolerance(epsilon, float(expected.abs().max())), rtol=0)


@pytest.mark.parametrize("scheme", ["nf4", "int8"])
def test_recomputed_blocks_take_the_same_gradients(pairs, scheme, monkeypatch):
    """Layer-wise recomputation runs each block's quantized layers again in the backward pass,
    with the dequantized weights' gradient there too: the same scores, also when the library's
    4-bit kernel has no backward (as bitsandbytes' CPU-packed one has none)."""
    import bitsandbytes as bnb

    quantized, _, _ = pairs("llama", scheme)
    matmul = bnb.matmul_4bit
    monkeypatch.setattr(bnb, "matmul_4bit", lambda *args, **kwargs: matmul(*args, **kwargs).detach())
    for method in (GradientWeightedRollout, AttnLRP):
        expected = method(quantized, recompute=False).attribute(IDS, target=5, attention_mask=MASK)
        ours = method(quantized, recompute=True).attribute(IDS, target=5, attention_mask=MASK)
        torch.testing.assert_close(ours, expected, atol=1e-6 * float(expected.abs().max()), rtol=0)
