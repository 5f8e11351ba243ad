"""Value zeroing, ALTI, attention norms, gradient-weighted rollout and AttnLRP on the families of the
architecture table beyond the first ones: against the float64 references (tests/references.py)
where a family's block is written out there (ELECTRA, Qwen3 with its query and key norms, Mixtral
with its experts), the padding properties on every family, and AttnLRP's conservation where
nothing but the tokens can take the logit (bias-free families: fused gate projections, the
router and experts of a mixture held as the table says)."""

from __future__ import annotations

import contextlib

import pytest
import torch
import transformers
from families import DECODERS, family_config, family_inputs
from lrp_reference import attnlrp_reference
from references import (
    alti_reference,
    attention_norm_reference,
    gradient_weighted_rollout_reference,
    value_zeroing_reference,
)

from captum_attnflow import ALTI, AttentionNorm, AttnLRP, GradientWeightedRollout, ValueZeroing
from captum_attnflow.capture.decomposition import alti_maps, attention_norm_maps, value_zeroing_maps
from helpers import model_state

# The table's families written out in tests/references.py; their sliding windows off (the
# reference attends to every earlier token); Mixtral's experts in their own loop, which runs in
# float64 (grouped_mm does not).
REFERENCED = {"electra": {}, "qwen3": dict(use_sliding_window=False),
              "mixtral": dict(sliding_window=None, experts_implementation="eager"),
              "qwen3_moe": dict(use_sliding_window=False, experts_implementation="eager")}
TABLE_FAMILIES = ["albert", "electra", "gpt_neox", "gptj", "mixtral", "modernbert", "opt", "phi3", "qwen3", "qwen3_moe"]
MIXTURES = ("mixtral", "qwen3_moe")
DEFAULT_RUN = {"phi3"}  # fused projections; the rest of the matrix is marked slow


def _slow_unless(default: set[str], model_types) -> list:
    return [t if t in default else pytest.param(t, marks=pytest.mark.slow) for t in model_types]


def _model(model_type: str, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    config = family_config(model_type, **{**REFERENCED.get(model_type, {}), **overrides})
    if model_type in DECODERS:
        return transformers.AutoModelForCausalLM.from_config(config).eval()
    config.num_labels = 3
    return transformers.AutoModelForSequenceClassification.from_config(config).eval()


def _positions(model_type: str, mask: torch.Tensor) -> torch.Tensor:
    """The explained position of each example: the last real token of a decoder, the first of an encoder."""
    if model_type in DECODERS:
        return torch.where(mask.bool(), torch.arange(mask.shape[1]), -1).amax(1)
    return torch.where(mask.bool(), torch.arange(mask.shape[1]), mask.shape[1]).amin(1)


METHODS = {"alti": (alti_maps, alti_reference), "value_zeroing": (value_zeroing_maps, value_zeroing_reference),
           "attention_norm": (attention_norm_maps, attention_norm_reference)}


def _cases(model_types, methods, value_zeroing_default: str) -> list:
    """(model_type, maps_of, reference) for each pair; value zeroing (its reference reruns each
    layer once per token in float64) in the default run on ``value_zeroing_default`` only; the
    mixtures (their experts in a float64 loop) slow."""
    cases = []
    for model_type in model_types:
        for name in methods:
            slow = (name == "value_zeroing" and model_type != value_zeroing_default) or model_type in MIXTURES
            cases.append(pytest.param(model_type, *METHODS[name], id=f"{name}-{model_type}",
                                      marks=[pytest.mark.slow] if slow else []))
    return cases


@pytest.mark.parametrize("model_type, maps_of, reference",
                         _cases(sorted(REFERENCED), ["alti", "value_zeroing", "attention_norm"], "electra"))
def test_decompositions_match_reference(model_type, maps_of, reference):
    model = _model(model_type)
    ids, mask = family_inputs("right", n=7)
    before = model_state(model)
    ours = maps_of(model, ids, None, mask)
    expected = reference(model, ids, mask).float()
    torch.testing.assert_close(ours, expected, atol=2e-5, rtol=0)
    assert model_state(model) == before


@pytest.mark.parametrize("model_type", _slow_unless({"electra", "qwen3"}, sorted(REFERENCED)))
def test_gradient_weighted_rollout_matches_reference(model_type):
    model = _model(model_type)
    ids, mask = family_inputs("right", n=7)
    position = _positions(model_type, mask)
    target = torch.tensor([5, 17, 33]) if model_type in DECODERS else torch.tensor([0, 2, 1])
    ours = GradientWeightedRollout(model).attribute(ids, target=target, attention_mask=mask, layer=None, position=position)

    def target_fn(output):
        logits = output.logits[torch.arange(3), position] if output.logits.dim() == 3 else output.logits
        return logits[torch.arange(3), target]

    expected = gradient_weighted_rollout_reference(model, ids, mask, target_fn)[:, torch.arange(3), position].float()
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-3)


@pytest.mark.parametrize("model_type", _slow_unless(DEFAULT_RUN, TABLE_FAMILIES))
def test_padding_gets_zero_and_changes_nothing_on_either_side(model_type):
    """Every method of the table, each example alone equal to it in a batch padded on either side."""
    model = _model(model_type)
    ids, mask = family_inputs("right")
    _, left_mask = family_inputs("left")
    shift = (left_mask == 0).sum(1, keepdim=True)
    where = (torch.arange(9)[None] + shift) % 9  # the new place of each token
    left_ids = ids.new_zeros(ids.shape).scatter(1, where, ids)
    position = _positions(model_type, mask)
    for method in (ALTI, ValueZeroing, AttentionNorm, AttnLRP):
        kwargs = dict(target=torch.tensor([1, 0, 2])) if method is AttnLRP else dict(layer=None)
        right = method(model).attribute(ids, attention_mask=mask, position=position, **kwargs)
        assert bool((right * (1 - mask) == 0).all())
        for b in range(3):
            length = int(mask[b].sum())
            alone_kwargs = {k: v[b : b + 1] if k == "target" else v for k, v in kwargs.items()}
            alone = method(model).attribute(ids[b : b + 1, :length], position=position[b : b + 1], **alone_kwargs)
            torch.testing.assert_close(right[..., b, :length], alone[..., 0, :], atol=2e-5, rtol=1e-4)
        left = method(model).attribute(left_ids, attention_mask=left_mask, position=where.gather(1, position[:, None])[:, 0],
                                       **kwargs)
        torch.testing.assert_close(left.gather(-1, where.expand_as(left)), right, atol=2e-5, rtol=1e-4)


def _zero_values(model: torch.nn.Module, model_type: str) -> None:
    """Every attention writes nothing: its value projection (the last third of a fused one) zeroed."""
    with torch.no_grad():
        for module in model.modules():
            if model_type == "phi3" and hasattr(module, "qkv_proj"):
                module.qkv_proj.weight[-model.config.num_key_value_heads * module.head_dim :] = 0
            elif model_type == "modernbert" and hasattr(module, "Wqkv"):
                module.Wqkv.weight[-model.config.hidden_size :] = 0
            elif hasattr(module, "v_proj"):
                module.v_proj.weight.zero_()


@pytest.mark.parametrize("model_type", ["qwen3", "mixtral", "qwen3_moe", "phi3", "modernbert"])
def test_attnlrp_gives_the_tokens_all_of_the_logit_when_nothing_else_can_take_it(model_type):
    """Bias-free families without position embeddings whose attention writes nothing: the norms'
    identity rule, the fused gate's uniform rule (Phi-3, ModernBERT), the router held constant and
    the experts' gated products by the uniform rule (Mixtral, Qwen3-MoE with a dense layer and a
    mixture) conserve relevance, so the tokens share the logit exactly (a gate rule that halved
    both halves or neither would not). With the values back, the softmax linearisation takes a share."""
    model = _model(model_type).double()
    ids, mask = family_inputs("none", batch=1)
    decoder = model_type in DECODERS
    target, position = torch.tensor([7 if decoder else 0]), torch.tensor([8 if decoder else 0])
    with_attention = AttnLRP(model).attribute(ids, target=target, position=position)
    _zero_values(model, model_type)
    with torch.no_grad():
        logits = model(ids).logits
    logit = (logits[0, 8] if decoder else logits[0])[target[0]]
    relevance = AttnLRP(model).attribute(ids, target=target, position=position)
    # float64 but for the RMS norms, which these families compute in float32
    assert float(relevance.sum()) == pytest.approx(float(logit), rel=1e-6)
    assert float(with_attention.sum()) != pytest.approx(float(logit), abs=1e-3)


def _one_expert_and_its_dense_twin(model_type: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A mixture with one expert (its routing weight is 1) and the dense model of the same weights
    (Llama for Mixtral, Qwen3 for Qwen3-MoE), float64."""
    common = dict(vocab_size=60, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                  intermediate_size=64, num_hidden_layers=2, initializer_range=0.2, rms_norm_eps=1e-6,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    experts = dict(num_local_experts=1) if model_type == "mixtral" else dict(num_experts=1, moe_intermediate_size=64)
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(model_type, num_experts_per_tok=1, experts_implementation="eager",
                                               **experts, **common)
    mixture = transformers.AutoModelForCausalLM.from_config(config).double().eval()
    dense_config = transformers.AutoConfig.for_model("llama" if model_type == "mixtral" else "qwen3", **common)
    dense = transformers.AutoModelForCausalLM.from_config(dense_config).double().eval()
    weights = mixture.state_dict()
    for name in dense.state_dict():
        if ".mlp." in name:
            layer, part = name.split(".mlp.")
            gate_up, down = weights[f"{layer}.mlp.experts.gate_up_proj"][0], weights[f"{layer}.mlp.experts.down_proj"][0]
            half = gate_up.shape[0] // 2
            weights[name] = {"gate_proj.weight": gate_up[:half], "up_proj.weight": gate_up[half:], "down_proj.weight": down}[part]
    dense.load_state_dict({name: weights[name] for name in dense.state_dict()})
    return mixture, dense


@pytest.mark.parametrize("model_type", MIXTURES)
def test_attnlrp_on_one_expert_is_attnlrp_on_the_dense_twin(model_type):
    """With one expert a mixture computes a dense gated feed-forward, so AttnLRP (the experts'
    product by the uniform rule) gives what it gives on the dense model of the same weights (Llama,
    Qwen3: tested against the float64 reference). Holding the gate of the product instead (all
    its relevance to the up projection) misses by about the largest relevance here."""
    mixture, dense = _one_expert_and_its_dense_twin(model_type)
    ids = torch.randint(5, 60, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(mixture(ids).logits, dense(ids).logits, atol=1e-12, rtol=0)
    ours, twin = AttnLRP(mixture).attribute(ids, target=7), AttnLRP(dense).attribute(ids, target=7)
    torch.testing.assert_close(ours, twin, atol=1e-12, rtol=0)


@pytest.mark.parametrize("model_type", MIXTURES)
def test_attnlrp_is_the_same_for_every_experts_implementation(model_type):
    """transformers runs the experts as a loop (eager) or as batched or grouped matrix products;
    the rule reaches the activation and the experts' output in each."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(family_config(model_type, experts_implementation="eager")).eval()
    ids, mask = family_inputs("right")
    expected = AttnLRP(model).attribute(ids, target=[3, 9, 27], attention_mask=mask)
    for implementation in ("batched_mm", "grouped_mm"):
        model.set_experts_implementation(implementation)
        ours = AttnLRP(model).attribute(ids, target=[3, 9, 27], attention_mask=mask)
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-4)


# Families whose attention runs outside transformers' interface (relative positions, ALiBi).
OWN_ATTENTION = {
    "deberta-v2": {}, "mpnet": {}, "bloom": dict(n_embed=32, n_head=4, n_layer=2),
    "falcon": dict(new_decoder_architecture=True, num_kv_heads=2, alibi=True),
}


@pytest.mark.parametrize("model_type", _slow_unless({"deberta-v2", "bloom"}, sorted(OWN_ATTENTION)))
def test_gradient_weighted_rollout_on_models_computing_their_own_attention(model_type):
    """The probabilities the model returns with output_attentions, with their gradients: padding
    gets 0 and changes nothing, every layer's gradient reaches the scores."""
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(
        model_type, vocab_size=60, hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2,
        pad_token_id=0, initializer_range=0.2, num_labels=3, **OWN_ATTENTION[model_type])
    model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    ids, mask = family_inputs("right", n=7)
    before = model_state(model)
    rows = GradientWeightedRollout(model).attribute(ids, target=1, attention_mask=mask, layer=None, position=[0, 2])
    assert bool((rows * (1 - mask)[:, None] == 0).all())
    for b in range(3):
        length = int(mask[b].sum())
        alone = GradientWeightedRollout(model).attribute(ids[b : b + 1, :length], target=1, layer=None, position=[0, 2])
        torch.testing.assert_close(rows[:, b, :, :length], alone[:, 0], atol=2e-5, rtol=1e-4)
    assert bool((rows[0, :, 1] - torch.eye(7)[2] != 0).any())  # the gradients weigh the maps
    assert model_state(model) == before and model.config.output_attentions is False


def test_returned_probabilities_give_what_the_interface_gives(monkeypatch):
    """The same method on BERT, once through the interface, once from the maps it returns."""
    model = _model("electra")
    ids, mask = family_inputs("right", n=7)
    expected = GradientWeightedRollout(model, lean=False).attribute(ids, target=[0, 2, 1], attention_mask=mask, layer=None)
    # the model's attention now bypasses the capture
    monkeypatch.setattr("captum_attnflow.capture.internals.implementation",
                        lambda module, name: contextlib.nullcontext(lambda model: model.config._attn_implementation))
    ours = GradientWeightedRollout(model, lean=False).attribute(ids, target=[0, 2, 1], attention_mask=mask, layer=None)
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="ran no attention through"):
        ValueZeroing(model).attribute(ids, attention_mask=mask)


def _tower(model_type: str) -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, initializer_range=0.2)
    if model_type == "clip_text_model":
        config = transformers.CLIPTextConfig(vocab_size=60, max_position_embeddings=16, pad_token_id=0, bos_token_id=0,
                                             eos_token_id=2, **common)
        return transformers.CLIPTextModel(config).eval()
    return transformers.CLIPVisionModel(transformers.CLIPVisionConfig(image_size=16, patch_size=8, **common)).eval()


@pytest.mark.parametrize("model_type, maps_of, reference",
                         _cases(["clip_text_model", "clip_vision_model"], ["alti", "value_zeroing", "attention_norm"], ""))
def test_clip_towers_match_reference(model_type, maps_of, reference):
    """CLIP's text tower (causal, padded) and vision tower (class embedding and patches)."""
    model = _tower(model_type)
    if model_type == "clip_text_model":
        inputs, mask = family_inputs("right", n=7)
    else:
        inputs, mask = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)), None
    torch.testing.assert_close(maps_of(model, inputs, None, mask), reference(model, inputs, mask).float(), atol=2e-5, rtol=0)


class _Pooled(torch.nn.Module):
    """A vision tower's pooled output (B, D), whose features AttnLRP explains as a classifier's classes."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values).pooler_output


@pytest.mark.parametrize("model_type", ["dinov2", "clip_vision_model", "siglip_vision_model"])
def test_attnlrp_on_vision_towers_matches_explicit_relevance_propagation(model_type):
    """The relevance lands on the patch embedding's output (CLIP's and SigLIP's a convolution's,
    flattened) and the class token; SigLIP's pooling head (a probe's nn.MultiheadAttention) takes
    the uniform rule on its products. DINOv2's and CLIP's books are the reference's (SigLIP's
    probe and in-projection biases are not booked: the reference's probe is a sink)."""
    torch.manual_seed(0)
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=16,
                  patch_size=8, initializer_range=0.2)
    if model_type == "dinov2":
        model = transformers.Dinov2Model(transformers.Dinov2Config(**common, layerscale_value=0.7))
    elif model_type == "clip_vision_model":
        model = transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**common))
    else:
        model = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**common))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # nonzero biases, a layer scale that differs by channel
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "lambda1" in name:
                parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))
    pixels, target = torch.randn(3, 3, 16, 16, generator=generator), torch.tensor([0, 5, 11])
    expected, ledgers = attnlrp_reference(model.eval(), pixels, target)
    explained = _Pooled(model.double())
    ours = AttnLRP(explained).attribute(pixels.double(), target=target)
    assert ours.shape == expected.shape == (3, 4 if model_type == "siglip_vision_model" else 5)
    torch.testing.assert_close(ours, expected, atol=1e-10, rtol=0)
    if model_type != "siglip_vision_model":
        shares = AttnLRP(explained).shares(pixels.double(), target=target)
        for b, ledger in enumerate(ledgers):
            books = [ledger[kind] for kind in ("logit", "token", "other", "bias", "softmax")]
            assert [float(shares[kind][b]) for kind in ("score", "tokens", "other_embeddings", "biases", "softmax")] == \
                pytest.approx(books, abs=1e-10)


# Norms (Gemma 2/3, OLMo 2) or a layer scale (DINOv2) on the attention's output before the
# residual; Gemma 2 without its soft-capping and window here (the reference has neither).
POST_NORMED = {
    "gemma2": dict(attn_logit_softcapping=None, final_logit_softcapping=None, sliding_window=64, query_pre_attn_scalar=8),
    "gemma3_text": dict(sliding_window=64, query_pre_attn_scalar=8),
    "olmo2": {},
}


def _post_normed(model_type: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if model_type == "dinov2":
        config = transformers.Dinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                           image_size=16, patch_size=8, initializer_range=0.2, layerscale_value=0.7)
        model = transformers.Dinov2Model(config).eval()
        with torch.no_grad():  # a scale that differs by channel
            for layer in model.encoder.layer:
                layer.layer_scale1.lambda1.uniform_(0.2, 1.5)
        return model
    return transformers.AutoModelForCausalLM.from_config(family_config(model_type, **POST_NORMED[model_type])).eval()


@pytest.mark.parametrize("model_type, maps_of, reference",
                         _cases(["dinov2", "gemma2", "gemma3_text", "olmo2"], ["alti", "value_zeroing"], "gemma3_text"))
def test_norms_on_the_attention_output_match_reference(model_type, maps_of, reference):
    model = _post_normed(model_type)
    if model_type == "dinov2":
        inputs, mask = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)), None
    else:
        inputs, mask = family_inputs("right", n=7)
    torch.testing.assert_close(maps_of(model, inputs, None, mask), reference(model, inputs, mask).float(), atol=2e-5, rtol=0)


@pytest.mark.parametrize("model_type", ["gemma3_text", "olmo2"])
def test_attnlrp_conserves_through_gemma_and_olmo_norms(model_type):
    """Gemma 3's RMS norms scale by 1 + w, OLMo 2's by w, on the attention's and the feed-forward's
    outputs: their identity rule (the ratio y / x) conserves, so with the values zeroed the tokens
    share the logit."""
    model = _post_normed(model_type).double()
    ids, _ = family_inputs("none", batch=1)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.v_proj.weight.zero_()
        logit = model(ids).logits[0, 8, 7]
    relevance = AttnLRP(model).attribute(ids, target=7, position=8)
    assert float(relevance.sum()) == pytest.approx(float(logit), rel=1e-6)
