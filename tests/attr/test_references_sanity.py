"""Sanity checks of the slow float64 references in ``tests/references.py`` themselves."""

import pytest
import torch
import transformers

from captum_attnflow import load_agreement_model
from helpers import CAUSAL, make_classifier, make_tiny_model, padded_batch
from references import (
    alti_reference,
    attention_norm_reference,
    float64_copy,
    gradient_weighted_rollout_reference,
    layers_of,
    recomputed_forward,
    rollout_of,
    value_zeroing_reference,
)

PAD_ID = {"bert": 0, "distilbert": 0, "roberta": 1, "gpt2": 0, "llama": 0}
METHODS = [alti_reference, value_zeroing_reference, attention_norm_reference]


def batch(arch, left=False, seed=0):
    ids, mask = padded_batch(seed=seed, batch=3, n=7)
    if left:
        ids, mask = ids.flip(1), mask.flip(1)
    return torch.where(mask.bool(), ids, torch.full_like(ids, PAD_ID[arch])), mask


def first_or_last_real(mask):
    """The position each example's target reads: the last real token (works for every model)."""
    return torch.stack([row.nonzero().max() for row in mask])


def hidden_target(mask):
    positions = first_or_last_real(mask)
    return lambda out: out.last_hidden_state[torch.arange(len(positions)), positions].sum(-1)


@pytest.fixture
def float64_llama(monkeypatch):
    """transformers' Llama computes RMSNorm and the rotary angles in float32 even in a float64 model;
    patch both to float64 so the recomputed forward can be compared tightly."""
    llama = transformers.models.llama.modeling_llama

    def rms_forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * hidden_states * torch.rsqrt(variance + self.variance_epsilon)

    def rotary_forward(self, x, position_ids):
        dim = self.inv_freq.shape[0] * 2
        exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
        inv_freq = 1.0 / self.config.rope_parameters["rope_theta"] ** exponents
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    monkeypatch.setattr(llama.LlamaRMSNorm, "forward", rms_forward)
    monkeypatch.setattr(llama.LlamaRotaryEmbedding, "forward", rotary_forward)


@pytest.mark.parametrize("left", [False, True])
def test_recomputed_forward_reproduces_the_model(arch, left, float64_llama):
    model = make_tiny_model(arch)
    ids, mask = batch(arch, left)
    model64 = float64_copy(model)
    with torch.no_grad():
        expected = model64(input_ids=ids, attention_mask=mask).last_hidden_state
    output, records, real = recomputed_forward(model64, ids, mask)
    assert len(records) == 3 and records[0]["A"].shape == (3, 4, 7, 7)
    real_rows = mask.bool()[..., None]
    torch.testing.assert_close(output.last_hidden_state * real_rows, expected * real_rows, atol=1e-10, rtol=1e-10)
    # the attention probabilities: exactly 0 on padding keys (and future keys for decoders)
    A = records[1]["A"]
    real_query_pad_key = (real[:, :, None] & ~real[:, None, :])[:, None].expand_as(A)
    assert (A[real_query_pad_key] == 0).all()
    if arch in CAUSAL:
        future = torch.ones(7, 7, dtype=torch.bool).triu(1)
        assert (A[(real[:, :, None] & future)[:, None].expand_as(A)] == 0).all()


def test_recomputed_forward_reproduces_classifiers():
    model = make_classifier()
    ids, mask = padded_batch(batch=3, n=7)
    model64 = float64_copy(model)
    with torch.no_grad():
        expected = model64(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(recomputed_forward(model64, ids, mask)[0].logits, expected, atol=1e-10, rtol=1e-10)

    # gradient-weighted rollout of a logit against the eager model's own attention gradients
    eager = float64_copy(make_classifier())
    eager.config._attn_implementation = "eager"
    for parameter in eager.parameters():
        parameter.requires_grad_(True)
    output = eager(input_ids=ids, attention_mask=mask, output_attentions=True)
    grads = torch.autograd.grad(output.logits[:, 1].sum(), output.attentions)
    R = torch.eye(7, dtype=torch.float64).expand(3, 7, 7)
    for A, grad in zip(output.attentions, grads):
        R = R + (grad * A).clamp(min=0).mean(1) @ R
    real = mask.bool()
    expected = (R * (real[:, :, None] & real[:, None, :])).detach()
    reference = gradient_weighted_rollout_reference(model, ids, mask, lambda out: out.logits[:, 1])
    torch.testing.assert_close(reference[-1], expected, atol=1e-10, rtol=1e-9)

    agreement, tokenizer = load_agreement_model()
    encoded = tokenizer(["the keys to the cabinet are", "the key"], return_tensors="pt", padding=True)
    agreement64 = float64_copy(agreement)
    with torch.no_grad():
        expected = agreement64(**encoded).logits
    output = recomputed_forward(agreement64, encoded["input_ids"], encoded["attention_mask"])[0]
    torch.testing.assert_close(output.logits, expected, atol=1e-10, rtol=1e-10)
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    gwr = gradient_weighted_rollout_reference(agreement, ids, mask, lambda out: out.logits[:, 0])
    pad = ~mask.bool()
    assert gwr.shape == (6, 2) + mask.shape[1:] * 2 and pad.any()
    assert (gwr[:, pad] == 0).all() and (gwr.transpose(-1, -2)[:, pad] == 0).all()
    for method in (alti_reference, value_zeroing_reference):
        sums = method(agreement, ids, mask).sum(-1)
        torch.testing.assert_close(sums, mask.double().expand_as(sums))


def vit(classifier):
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=16, patch_size=8,
        num_labels=3,
    )
    return (transformers.ViTForImageClassification if classifier else transformers.ViTModel)(config).eval()


def test_vit():
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    for classifier in (False, True):
        model64 = float64_copy(vit(classifier))
        with torch.no_grad():
            expected = model64(pixel_values=pixels.double())
        output = recomputed_forward(model64, pixels, None)[0]
        name = "logits" if classifier else "last_hidden_state"
        torch.testing.assert_close(getattr(output, name), getattr(expected, name), atol=1e-10, rtol=1e-10)
    model = vit(True)
    gwr = gradient_weighted_rollout_reference(model, pixels, None, lambda out: out.logits[:, 1])
    assert gwr.shape == (2, 2, 5, 5) and gwr.dtype == torch.float64
    for method in METHODS:
        maps = method(model, pixels, None)
        assert maps.shape == (2, 2, 5, 5) and torch.isfinite(maps).all()


@pytest.mark.parametrize("left", [False, True])
def test_padding_rows_and_columns_are_zero_and_rows_sum_to_one(arch, left):
    model = make_tiny_model(arch)
    ids, mask = batch(arch, left)
    pad = ~mask.bool()
    pair_pad = pad[:, :, None] | pad[:, None, :]
    all_maps = {method.__name__: method(model, ids, mask) for method in METHODS}
    all_maps["gwr"] = gradient_weighted_rollout_reference(model, ids, mask, hidden_target(mask))
    for name, maps in all_maps.items():
        assert maps.shape == (3, 3, 7, 7) and maps.dtype == torch.float64, name
        assert torch.isfinite(maps).all() and (maps >= 0).all(), name
        assert (maps[:, pair_pad] == 0).all(), name
    for name in ("alti_reference", "value_zeroing_reference"):
        sums = all_maps[name].sum(-1)
        torch.testing.assert_close(sums, mask.double().expand_as(sums), msg=name)
    if arch in CAUSAL:  # nothing flows from the future
        future = torch.ones(7, 7, dtype=torch.bool).triu(1)
        for name in ("alti_reference", "attention_norm_reference", "gwr"):
            assert (all_maps[name][..., future] == 0).all(), name
        assert all_maps["value_zeroing_reference"][..., future].abs().max() < 1e-12


def test_padding_does_not_change_real_tokens(arch):
    """Right padding: each example's maps over its real tokens equal those of the unpadded example."""
    model = make_tiny_model(arch)
    ids, mask = batch(arch)
    padded = {method.__name__: method(model, ids, mask) for method in METHODS}
    padded["gwr"] = gradient_weighted_rollout_reference(model, ids, mask, hidden_target(mask))
    for b in range(3):
        length = int(mask[b].sum())
        alone_ids, alone_mask = ids[b : b + 1, :length], mask[b : b + 1, :length]
        alone = {method.__name__: method(model, alone_ids, alone_mask) for method in METHODS}
        alone["gwr"] = gradient_weighted_rollout_reference(model, alone_ids, alone_mask, hidden_target(alone_mask))
        for name in padded:
            torch.testing.assert_close(
                padded[name][:, b, :length, :length], alone[name][:, 0], atol=1e-10, rtol=1e-8, msg=name
            )


def test_gradient_weighted_rollout_matches_eager_attention_gradients(arch):
    """Ā from the eager model's own attention probabilities and their autograd gradients."""
    ids, mask = batch(arch)
    target = hidden_target(mask)
    model = make_tiny_model(arch)
    eager = float64_copy(make_tiny_model(arch, attn_implementation="eager"))
    for parameter in eager.parameters():
        parameter.requires_grad_(True)
    output = eager(input_ids=ids, attention_mask=mask, output_attentions=True)
    grads = torch.autograd.grad(target(output).sum(), output.attentions)
    R = torch.eye(7, dtype=torch.float64).expand(3, 7, 7)
    expected = []
    real = mask.bool()
    for A, grad in zip(output.attentions, grads):
        R = R + (grad * A).clamp(min=0).mean(1) @ R
        expected.append(R * (real[:, :, None] & real[:, None, :]))
    reference = gradient_weighted_rollout_reference(model, ids, mask, target)
    tolerance = 1e-5 if arch == "llama" else 1e-9  # transformers' Llama: float32 RMSNorm and rotary
    torch.testing.assert_close(reference, torch.stack(expected).detach(), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_value_zeroing_matches_zeroing_the_models_own_value_projection(arch):
    """Layer 1 of the model itself, with a hook zeroing token j's value-projection output."""
    model = make_tiny_model(arch)
    ids, mask = batch(arch)
    model64 = float64_copy(model)
    layer = layers_of(model64)[1]
    projection = layer.attention.self.value if arch == "bert" else layer.attn.c_attn
    d = 32
    captured = {}
    layer.register_forward_hook(lambda module, args, out: captured.__setitem__("out", out))
    with torch.no_grad():
        model64(input_ids=ids, attention_mask=mask)
        original = captured["out"]
        C = torch.zeros(3, 7, 7, dtype=torch.float64)
        for j in range(7):

            def zero(module, args, out, j=j):
                out = out.clone()
                out[:, j, -d:] = 0  # the value part (all of it for BERT, the last third of GPT-2's c_attn)
                return out

            handle = projection.register_forward_hook(zero)
            model64(input_ids=ids, attention_mask=mask)
            handle.remove()
            C[:, :, j] = 1 - torch.nn.functional.cosine_similarity(captured["out"], original, dim=-1)
    real = mask.bool()
    C = C * (real[:, :, None] & real[:, None, :])
    C = C / C.sum(-1, keepdim=True).clamp(min=1e-300)
    torch.testing.assert_close(value_zeroing_reference(model, ids, mask)[1], C, atol=1e-9, rtol=1e-7)


def test_rollout_of():
    M = torch.rand(3, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    out = rollout_of(M)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out[0], M[0].double())
    torch.testing.assert_close(out[2], (M[2].double() @ M[1].double()) @ M[0].double())
