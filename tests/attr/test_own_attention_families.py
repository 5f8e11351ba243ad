"""Value zeroing, ALTI, the attention norms and AttnLRP on the families whose attention runs in their
own modules (DeBERTa-v3, MPNet, BLOOM, Falcon with ALiBi or rotary positions), and AttnLRP on
Gemma 2 (soft-capping): against the float64 references written from the weights
(tests/references.py, tests/lrp_reference.py), padded; AttnLRP's books against the reference's and
its conservation where nothing but the tokens can take the logit."""

from __future__ import annotations

import pytest
import torch
import transformers
from families import family_config, family_inputs
from helpers import model_state
from lrp_reference import attnlrp_reference
from references import (
    alti_reference,
    attention_norm_reference,
    float64_copy,
    recomputed_forward,
    value_zeroing_reference,
)

from captum_attnflow import ALTI, AttnLRP
from captum_attnflow.capture import extract_attentions
from captum_attnflow.capture.decomposition import alti_maps, attention_norm_maps, value_zeroing_maps
from captum_attnflow.capture.internals import capture_internals
from captum_attnflow.hf.architectures import ARCHITECTURES
from captum_attnflow.hf.own_attention import qkv_factors

_COMMON = dict(vocab_size=60, hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2,
               pad_token_id=0, initializer_range=0.2, num_labels=3)
# DeBERTa-v3's relative attention (both terms, shared projections, normed table); Falcon-40B's
# layout with ALiBi (Falcon-RW's positions), and Falcon-7B's (multi-query, rotary).
CONFIGS = {
    "deberta-v2": dict(relative_attention=True, pos_att_type=["p2c", "c2p"], position_biased_input=False,
                       position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True, type_vocab_size=0),
    "mpnet": {},
    "bloom": dict(n_embed=32, n_head=4, n_layer=2),
    "falcon": dict(new_decoder_architecture=True, num_kv_heads=2, alibi=True),
    "falcon-rotary": dict(bias=True),
}
DECODERS = ("bloom", "falcon", "falcon-rotary")


def _model(name: str, biases: bool = True) -> torch.nn.Module:
    """The tiny model of ``name``: a classifier of an encoder, a language model of a decoder; its
    biases random (transformers sets them to 0) unless ``biases`` is False."""
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(name.split("-rotary")[0], **_COMMON, **CONFIGS[name])
    auto = transformers.AutoModelForCausalLM if name in DECODERS else transformers.AutoModelForSequenceClassification
    model = auto.from_config(config).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith("bias"):
                parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator) if biases else 0)
    return model


METHODS = {"alti": (alti_maps, alti_reference), "attention_norm": (attention_norm_maps, attention_norm_reference),
           "value_zeroing": (value_zeroing_maps, value_zeroing_reference)}


def _cases() -> list:
    """Every family and method; value zeroing (its reference reruns each layer once per token) in
    the default run on DeBERTa alone."""
    return [pytest.param(name, *METHODS[method], id=f"{method}-{name}",
                         marks=[pytest.mark.slow] if method == "value_zeroing" and name != "deberta-v2" else [])
            for name in CONFIGS for method in METHODS]


@pytest.mark.parametrize("name, maps_of, reference", _cases())
def test_decompositions_match_reference(name, maps_of, reference):
    """The probabilities the attention modules return, the values split from their projections."""
    model = _model(name)
    ids, mask = family_inputs("right", n=7)
    before = model_state(model)
    ours = maps_of(model, ids, None, mask)
    torch.testing.assert_close(ours, reference(model, ids, mask).float(), atol=2e-5, rtol=0)
    assert model_state(model) == before and model.config.output_attentions is False


def test_bloom_residual_after_the_input_norm():
    """BLOOM with apply_residual_connection_post_layernorm adds the attention to the input norm's
    output: ALTI's residual term is that output, and value zeroing reruns that block."""
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("bloom", **_COMMON, **CONFIGS["bloom"],
                                               apply_residual_connection_post_layernorm=True)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids, mask = family_inputs("right", n=5)
    for maps_of, reference in (METHODS["alti"], METHODS["value_zeroing"]):
        torch.testing.assert_close(maps_of(model, ids, None, mask), reference(model, ids, mask).float(), atol=2e-5, rtol=0)


def test_falcon_runs_as_loaded():
    """Falcon's eager attention adds ALiBi twice (its argument and the mask the model builds),
    sdpa once: the methods' run is the model's as loaded (sdpa), whose logits it returns, and the
    maps raw attention reads are the reference's (ALiBi once)."""
    model = _model("falcon")
    ids, mask = family_inputs("right", n=7)
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
    assert model.config._attn_implementation == "sdpa"
    internals = capture_internals(model, ids, attention_mask=mask, blocks=list(model.transformer.h),
                                  own=ARCHITECTURES["falcon"].own_attention)
    assert len(internals.probabilities) == 2
    torch.testing.assert_close(internals.output.logits * mask[..., None], expected * mask[..., None], atol=1e-5, rtol=0)
    _, records, real = recomputed_forward(float64_copy(model), ids, mask)
    pairs = (real[:, :, None] & real[:, None, :])[:, None]
    for stored, record in zip(extract_attentions(model, ids, attention_mask=mask), records):
        torch.testing.assert_close(stored * pairs, record["A"].float() * pairs, atol=1e-5, rtol=0)


def test_padding_on_either_side_gives_the_same_scores():
    """A left-padded batch runs with its real tokens first (ALiBi, relative positions unchanged)."""
    model = _model("bloom")
    ids, mask = family_inputs("right", n=7)
    shift = (mask == 0).sum(1, keepdim=True)
    where = (torch.arange(7)[None] + shift) % 7
    left_ids, left_mask = ids.new_zeros(ids.shape).scatter(1, where, ids), mask.new_zeros(mask.shape).scatter(1, where, mask)
    position = mask.sum(1) - 1
    for method in (ALTI, AttnLRP):  # the decompositions share ALTI's capture
        kwargs = dict(target=torch.tensor([5, 17, 42])) if method is AttnLRP else dict(layer=None)
        right = method(model).attribute(ids, attention_mask=mask, position=position, **kwargs)
        left = method(model).attribute(left_ids, attention_mask=left_mask, position=where.gather(1, position[:, None])[:, 0],
                                       **kwargs)
        torch.testing.assert_close(left.gather(-1, where.expand_as(left)), right, atol=2e-5, rtol=1e-4)


def _gemma2() -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(family_config("gemma2")).eval()


@pytest.mark.parametrize("name", [*CONFIGS, "gemma2"])
def test_attnlrp_matches_explicit_relevance_propagation(name):
    """The q, k, v projections' gradients scaled as the attention function scales them elsewhere,
    the score terms (relative positions, ALiBi) biases that pass nothing on, Gemma 2's soft-caps
    by the identity rule: the relevance and each share of the logit are the reference's."""
    model = _gemma2() if name == "gemma2" else _model(name)
    ids, mask = family_inputs("right", n=9 if name == "gemma2" else 7)
    decoder = name in DECODERS or name == "gemma2"
    target = torch.tensor([5, 17, 42]) if decoder else torch.tensor([0, 2, 1])
    position = torch.where(mask.bool(), torch.arange(ids.shape[1]), -1).amax(1) if decoder else None
    expected, ledgers = attnlrp_reference(model, ids, target, mask, position)
    model = model.double()
    before = model_state(model)
    ours = AttnLRP(model).attribute(ids, target=target, attention_mask=mask)
    # float64 but for what these families compute in float32 (BLOOM's softmax, rotary angles, Gemma's norms)
    torch.testing.assert_close(ours, expected, atol=1e-6 * float(expected.abs().max()), rtol=0)
    shares = AttnLRP(model).shares(ids, target=target, attention_mask=mask)
    for b, ledger in enumerate(ledgers):
        books = [ledger[kind] for kind in ("logit", "token", "other", "bias", "softmax")]
        ours_books = [float(shares[kind][b]) for kind in ("score", "tokens", "other_embeddings", "biases", "softmax")]
        assert ours_books == pytest.approx(books, abs=1e-6)
        if name in ("deberta-v2", "bloom", "falcon"):  # no position embeddings: the score terms' share
            assert abs(ledger["other"]) > 1e-4
    assert model_state(model) == before
    assert all("disentangled_attention_bias" not in vars(m) for m in model.modules())


@pytest.mark.parametrize("name", ["deberta-v2", "bloom", "falcon", "gemma2"])
def test_attnlrp_gives_the_tokens_all_of_the_logit_when_nothing_else_can_take_it(name):
    """Without biases or position embeddings, an attention that writes nothing (values 0): the
    norms', activations' (BLOOM's GELU, DeBERTa's pooler, Gemma 2's final soft-cap) rules conserve."""
    model = (_gemma2() if name == "gemma2" else _model(name, biases=False)).double()
    with torch.no_grad():
        for module in model.modules():
            for projection in ("value_proj", "v_proj"):
                if hasattr(module, projection):
                    getattr(module, projection).weight.zero_()
            if hasattr(module, "self_attention"):  # the fused projection's value channels
                (values,) = qkv_factors(ARCHITECTURES[model.config.model_type].own_attention, module, (1, 1, 0))
                module.self_attention.query_key_value.weight[values == 0] = 0
    ids, _ = family_inputs("none", batch=1, n=7)
    decoder = name != "deberta-v2"
    target, position = (torch.tensor([7]), torch.tensor([6])) if decoder else (torch.tensor([1]), None)
    with torch.no_grad():
        logits = model(ids).logits
    logit = (logits[0, 6] if decoder else logits[0])[target[0]]
    relevance = AttnLRP(model).attribute(ids, target=target, position=position)
    assert float(relevance.sum()) == pytest.approx(float(logit), rel=1e-6)


def test_attnlrp_refuses_deberta_with_its_convolution_layer():
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("deberta-v2", **_COMMON, conv_kernel_size=3)
    model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    with pytest.raises(ValueError, match="convolution layer"):
        AttnLRP(model).attribute(torch.tensor([[5, 6, 7]]), target=0)
    assert ALTI(model).attribute(torch.tensor([[5, 6, 7]])).shape == (1, 3)  # it reads no rule


@pytest.mark.parametrize("name", [*CONFIGS, "gemma2"])
def test_attnlrp_recomputes_each_block_to_the_same_relevance(name):
    """Layer-wise recomputation runs each block again under the same rules: the projections'
    scaled gradients, the score terms as leaves, the soft-caps, the same relevance."""
    model = _gemma2() if name == "gemma2" else _model(name)
    ids, mask = family_inputs("right", n=7)
    target = torch.tensor([5, 17, 42]) if name in DECODERS or name == "gemma2" else torch.tensor([0, 2, 1])
    before = model_state(model)
    expected = AttnLRP(model, recompute=False).attribute(ids, target=target, attention_mask=mask)
    ours = AttnLRP(model, recompute=True).attribute(ids, target=target, attention_mask=mask)
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0)
    assert model_state(model) == before
