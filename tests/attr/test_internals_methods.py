"""GradientWeightedRollout, ValueZeroing, ALTI and AttentionNorm against slow float64 references
written from their papers (tests/references.py), on tiny models of every architecture in the table,
padded and unpadded; and their properties (rows sum to 1, padding gets 0 and changes nothing)."""

from __future__ import annotations

import pytest
import torch
import transformers
from helpers import CONFIGS, make_tiny_model, model_state, padded_batch
from references import (
    alti_reference,
    attention_norm_reference,
    gradient_weighted_rollout_reference,
    rollout_of,
    value_zeroing_reference,
)

from captum_attnflow import ALTI, AttentionNorm, GradientWeightedRollout, ValueZeroing, load_agreement_model
from captum_attnflow.capture.decomposition import alti_maps, attention_norm_maps, value_zeroing_maps

ARCHS = ["bert", "distilbert", "roberta", "gpt2", "llama"]
DECOMPOSITIONS = [
    (ALTI, alti_maps, alti_reference),
    (ValueZeroing, value_zeroing_maps, value_zeroing_reference),
]


def _classifier(arch: str) -> torch.nn.Module:
    """A tiny classifier (encoders) or language model (decoders) with a head for gradients."""
    torch.manual_seed(0)
    config = CONFIGS[arch]()
    config.initializer_range = 0.2  # scores that move when attention changes
    if arch in ("gpt2", "llama"):
        return transformers.AutoModelForCausalLM.from_config(config).eval()
    config.num_labels = 3
    return transformers.AutoModelForSequenceClassification.from_config(config).eval()


def _vit() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=16, patch_size=8,
        num_labels=3,
    )
    return transformers.ViTForImageClassification(config).eval()


def _left_padded(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The batch with its padding moved to the front, and (B, n) the new position of each old one."""
    shift = (mask == 0).sum(1, keepdim=True)
    n = ids.shape[1]
    where = (torch.arange(n)[None] + shift) % n
    return ids.new_zeros(ids.shape).scatter(1, where, ids), mask.new_zeros(mask.shape).scatter(1, where, mask), where


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("method, maps_of, reference", DECOMPOSITIONS, ids=["alti", "value_zeroing"])
def test_decomposition_maps_match_reference(arch, method, maps_of, reference):
    model = make_tiny_model(arch)
    ids, mask = padded_batch(seed=1, batch=3, n=7)
    before = model_state(model)
    ours = maps_of(model, ids, None, mask)
    expected = reference(model, ids, mask).float()
    assert torch.allclose(ours, expected, atol=2e-5), (ours - expected).abs().max()
    rows = method(model).attribute(ids, attention_mask=mask, layer=None, position=[0, 2])  # (L, B, S, n)
    assert torch.allclose(rows, rollout_of(expected).float()[:, :, [0, 2]], atol=5e-5)
    assert model_state(model) == before


@pytest.mark.parametrize("arch", ARCHS)
def test_attention_norms_match_reference(arch):
    model = make_tiny_model(arch)
    ids, mask = padded_batch(seed=2, batch=3, n=6)
    expected = attention_norm_reference(model, ids, mask).float()
    assert torch.allclose(attention_norm_maps(model, ids, None, mask), expected, atol=1e-5)
    rows = AttentionNorm(model).attribute(ids, attention_mask=mask, layer=2, position=1)
    assert torch.allclose(rows, expected[1, :, 1], atol=1e-5)


@pytest.mark.parametrize("method, maps_of, reference", DECOMPOSITIONS, ids=["alti", "value_zeroing"])
def test_decompositions_on_the_bundled_model_and_vit(method, maps_of, reference):
    model, tokenizer = load_agreement_model()
    encoded = tokenizer(["the keys to the cabinet", "the key"], return_tensors="pt", padding=True)
    expected = reference(model, encoded["input_ids"], encoded["attention_mask"]).float()
    assert torch.allclose(maps_of(model, encoded["input_ids"], None, encoded["attention_mask"]), expected, atol=2e-5)
    vit = _vit()
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(maps_of(vit, pixels), reference(vit, pixels, None).float(), atol=2e-5)
    assert method(vit).attribute(pixels).shape == (2, 5)  # [CLS] + 4 patches


@pytest.mark.parametrize("arch", ARCHS)
def test_gradient_weighted_rollout_matches_reference(arch):
    model = _classifier(arch)
    ids, mask = padded_batch(seed=3, batch=3, n=7)
    before = model_state(model)
    if arch in ("gpt2", "llama"):  # a language model: the next token's logit at the last real token
        last = mask.sum(1) - 1
        tokens = torch.tensor([5, 17, 33])
        ours = GradientWeightedRollout(model).attribute(ids, target=tokens, attention_mask=mask, layer=None)

        def target_fn(output):
            return output.logits[torch.arange(3), last, tokens]

        position = last
    else:
        ours = GradientWeightedRollout(model).attribute(ids, target=[0, 2, 1], attention_mask=mask, layer=None)

        def target_fn(output):
            return output.logits[torch.arange(3), torch.tensor([0, 2, 1])]

        position = torch.zeros(3, dtype=torch.long)
    expected = gradient_weighted_rollout_reference(model, ids, mask, target_fn)
    expected = expected[:, torch.arange(3), position].float()
    assert torch.allclose(ours, expected, atol=1e-5, rtol=1e-3), (ours - expected).abs().max()
    assert model_state(model) == before
    assert all(p.grad is None for p in model.parameters())


def test_gradient_weighted_rollout_on_the_bundled_model_and_vit():
    model, tokenizer = load_agreement_model()
    encoded = tokenizer(["the keys to the cabinet", "the key"], return_tensors="pt", padding=True)
    ours = GradientWeightedRollout(model).attribute(encoded, target=1, layer=None)
    expected = gradient_weighted_rollout_reference(
        model, encoded["input_ids"], encoded["attention_mask"], lambda output: output.logits[:, 1]
    )[:, :, 0]
    assert torch.allclose(ours, expected.float(), atol=1e-5, rtol=1e-3)
    vit = _vit()
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    expected = gradient_weighted_rollout_reference(vit, pixels, None, lambda output: output.logits[:, 2])[:, :, 0]
    assert torch.allclose(GradientWeightedRollout(vit).attribute(pixels, target=2, layer=None), expected.float(), atol=1e-5, rtol=1e-3)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("method", [ALTI, ValueZeroing, AttentionNorm, GradientWeightedRollout])
def test_padding_gets_zero_and_changes_nothing_on_either_side(arch, method):
    model = _classifier(arch) if method is GradientWeightedRollout else make_tiny_model(arch)
    ids, mask = padded_batch(seed=4, batch=3, n=8)
    right = method(model).attribute(ids, attention_mask=mask, layer=None, position=[0, 1])
    assert bool((right * (1 - mask)[:, None, :] == 0).all())
    for b in range(3):
        length = int(mask[b].sum())
        alone = method(model).attribute(ids[b : b + 1, :length], layer=None, position=[0, 1])
        assert torch.allclose(right[:, b, :, :length], alone[:, 0], atol=2e-5)
    left_ids, left_mask, where = _left_padded(ids, mask)
    left = method(model).attribute(left_ids, attention_mask=left_mask, layer=None, position=where[:, :2])
    moved = left.gather(-1, where[None, :, None, :].expand_as(left))
    assert torch.allclose(moved, right, atol=2e-5)


@pytest.mark.parametrize("method", [ALTI, ValueZeroing])
def test_rows_are_non_negative_and_sum_to_one(method):
    model = make_tiny_model("bert")
    ids, mask = padded_batch(seed=5, batch=4, n=9)
    scores = method(model).attribute(ids, attention_mask=mask, layer=None)
    assert bool((scores >= 0).all())
    assert torch.allclose(scores.sum(-1), torch.ones(3, 4), atol=1e-5)


def test_unsupported_model_names_the_supported_ones():
    torch.manual_seed(0)
    model = transformers.XLNetModel(transformers.XLNetConfig(vocab_size=60, d_model=32, n_layer=2, n_head=4, d_inner=64))
    with pytest.raises(ValueError, match="knows the model types .*'bert'"):
        ALTI(model.eval()).attribute(torch.tensor([[1, 2, 3]]))


def test_an_encoder_decoders_encoder_alone_is_one_stack():
    """T5's encoder (T5EncoderModel) has the blocks of the T5 row: each one self-attention, so the
    one-stack methods run on it and give rows summing to 1."""
    torch.manual_seed(0)
    model = transformers.T5EncoderModel(transformers.T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                                                              vocab_size=60)).eval()
    ids = torch.tensor([[4, 5, 6, 1]])
    for method in (ALTI, ValueZeroing):
        scores = method(model).attribute(ids, layer=None)
        torch.testing.assert_close(scores.sum(-1), torch.ones(2, 1))


def test_mask_given_the_captum_way_is_used_without_a_warning(recwarn):
    model = make_tiny_model("bert")
    ids, mask = padded_batch(seed=6, batch=2, n=6)
    ids = ids.masked_fill(mask == 0, 0)  # BERT's pad token id is 0
    expected = ALTI(model).attribute(ids, attention_mask=mask)
    assert torch.allclose(ALTI(model).attribute(ids, additional_forward_args=(mask,)), expected)
    assert not [w for w in recwarn if "no attention_mask" in str(w.message)]


def _seq2seq(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "t5":
        config = transformers.T5Config(
            vocab_size=40, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=3, num_heads=2,
            initializer_factor=3.0,
        )
        return transformers.T5ForConditionalGeneration(config).eval()
    config = transformers.BartConfig(
        vocab_size=40, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, init_std=0.3,
    )
    return transformers.BartForConditionalGeneration(config).eval()


def _co_attention_reference(model, source, decoder, target, source_mask, decoder_mask):
    """Chefer et al.'s rules 6, 7 and 10 written out in float64, on the gradients of the maps
    the model returns itself with eager attention and ``output_attentions`` (retain_grad)."""
    import copy

    model = copy.deepcopy(model).double()
    model.config._attn_implementation = "eager"
    for sub in model.modules():
        if hasattr(sub, "config"):
            sub.config._attn_implementation = "eager"
    output = model(source, attention_mask=source_mask, decoder_input_ids=decoder, decoder_attention_mask=decoder_mask,
                   output_attentions=True)
    maps = (output.encoder_attentions, output.decoder_attentions, output.cross_attentions)
    for group in maps:
        for attention in group:
            attention.retain_grad()
    batch, m = decoder.shape
    n = source.shape[1]
    rows = torch.zeros(batch, m, n + m, dtype=torch.float64)
    for t in range(m):
        for group in maps:
            for attention in group:
                attention.grad = None
        output.logits[torch.arange(batch), t, target[:, t]].sum().backward(retain_graph=True)
        bar = [[(a.grad * a).clamp(min=0).mean(1).detach() for a in group] for group in maps]
        sm, tm = source_mask.double(), decoder_mask.double()
        ss = torch.diag_embed(sm)
        for weighted in bar[0]:
            ss = ss + (weighted * sm[:, :, None] * sm[:, None, :]) @ ss
        tt, ts = torch.diag_embed(tm), torch.zeros(batch, m, n, dtype=torch.float64)

        def hat(r):
            eye = torch.eye(r.shape[-1], dtype=torch.float64)
            s = (r - eye).sum(-1, keepdim=True)
            return (r - eye) / torch.where(s != 0, s, torch.ones_like(s)) + eye

        for self_w, cross_w in zip(bar[1], bar[2]):
            self_w = self_w * tm[:, :, None] * tm[:, None, :]
            tt, ts = tt + self_w @ tt, ts + self_w @ ts
            ts = ts + hat(tt).transpose(1, 2) @ (cross_w * tm[:, :, None] * sm[:, None, :]) @ hat(ss)
        rows[:, t] = torch.cat([ts[:, t], tt[:, t] * tm[:, t, None]], -1)
    return rows


@pytest.mark.parametrize("kind", ["t5", "bart"])
def test_encoder_decoder_co_attention_rules_match_reference(kind):
    model = _seq2seq(kind)
    source = torch.tensor([[5, 6, 7, 8, 1], [9, 10, 11, 1, 0]])
    source_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    decoder = torch.tensor([[0, 12, 13], [0, 14, 0]])
    decoder_mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    target = torch.tensor([[12, 13, 1], [14, 1, 1]])
    before = model_state(model)
    ours = GradientWeightedRollout(model).encoder_decoder_rows(source, decoder, target, -1, source_mask, decoder_mask)
    expected = _co_attention_reference(model, source, decoder, target, source_mask, decoder_mask).float()
    assert torch.allclose(ours, expected, rtol=1e-3, atol=1e-4), (ours - expected).abs().max()
    assert model_state(model) == before


def test_gradient_weighted_rollout_inside_no_grad_enables_its_own_gradients():
    model = _classifier("bert")
    ids, mask = padded_batch(seed=7, batch=2, n=6)
    expected = GradientWeightedRollout(model).attribute(ids, target=1, attention_mask=mask)
    with torch.no_grad():
        inside = GradientWeightedRollout(model).attribute(ids, target=1, attention_mask=mask)
        assert not torch.is_grad_enabled()  # the caller's mode is back
    torch.testing.assert_close(inside, expected)


@pytest.mark.parametrize("method", [ALTI, ValueZeroing, AttentionNorm])
def test_causal_decoder_explains_the_last_token_by_default(method):
    """The causal mask gives exact zeros above the diagonal, so the default position is each
    example's last real token (rounding of 1e-7 there would make it position 0)."""
    model = make_tiny_model("gpt2")
    ids, mask = padded_batch(seed=8, batch=3, n=9)
    last = mask.sum(1) - 1
    expected = method(model).attribute(ids, attention_mask=mask, position=last, layer=None)
    torch.testing.assert_close(method(model).attribute(ids, attention_mask=mask, layer=None), expected, rtol=0, atol=0)
    maps = alti_maps(model, ids, attention_mask=mask)
    assert bool((maps.triu(1) == 0).all())
