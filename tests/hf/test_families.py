"""Today's model families on the lean paths: each family's recomputed maps equal the maps its own
eager attention returns, with the score terms it adds (sliding windows, Gemma 2's soft-capping)
active, and a call carrying a term the capture cannot hold falls back to the stored maps."""

from __future__ import annotations

import pytest
import torch
import transformers
from families import FAMILIES, make_family_model, family_inputs

from captum_attnflow import GradientWeightedRollout, extract_attentions
from captum_attnflow.capture import capture_graph, lean
from captum_attnflow.capture.attention_gradients import capture_attention_gradients, supports_attention_gradients
from captum_attnflow.capture.lean import captured_scores, lean_capture, supports_lean
from captum_attnflow.capture.lean_blocks import AttentionScores, fused_blocks
from helpers import model_state

# The default run takes a representative slice (soft-capping with sliding windows, a global and
# local encoder, query-key norms with a window on some layers); the whole matrix is marked slow.
REPRESENTATIVE = {"gemma2", "modernbert", "qwen3"}
FAMILY_TYPES = [t if t in REPRESENTATIVE else pytest.param(t, marks=pytest.mark.slow) for t in sorted(FAMILIES)]
# The layers that attend through a sliding window smaller than the 9 tokens, and the window:
# query i sees key j only where |i - j| < window (ModernBERT's window is two-sided).
SLIDING = {"qwen3": ((1,), 4), "qwen3_moe": ((0, 1), 4), "phi3": ((0, 1), 4), "mixtral": ((0, 1), 4), "gemma2": ((0,), 4),
           "gemma3_text": ((0,), 4), "modernbert": ((1,), 3)}
ENCODERS = ("albert", "electra", "modernbert")


@pytest.mark.parametrize("side", ["none", "right", "left"])
@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_lean_maps_equal_the_models_own_eager_maps(model_type, side):
    model = make_family_model(model_type)
    ids, mask = family_inputs(side)
    before = model_state(model)
    assert supports_lean(model) and supports_attention_gradients(model)
    lean_graph = capture_graph(model, ids, attention_mask=mask, lean=True)
    stored = capture_graph(model, ids, attention_mask=mask, lean=False)  # eager attention's own maps
    assert lean_graph.is_streamed  # every layer recomputed from its queries and keys
    torch.testing.assert_close(lean_graph.weights, stored.weights, atol=1e-6, rtol=0)
    positions = torch.tensor([[8, 0], [4, 2], [1, 8]])
    torch.testing.assert_close(lean_graph.rows(1, positions), stored.rows(1, positions), atol=1e-6, rtol=0)
    assert lean_graph.is_causal == stored.is_causal == (model_type not in ENCODERS)
    assert model_state(model) == before


@pytest.mark.parametrize("model_type", sorted(SLIDING))
def test_sliding_windows_are_active_at_this_size(model_type):
    """The comparison above sees each window: the eager maps are 0 outside it, and a full
    layer's are not."""
    model = make_family_model(model_type)
    ids, _ = family_inputs("none")
    maps = extract_attentions(model, ids)
    layers, window = SLIDING[model_type]
    outside = (torch.arange(9)[:, None] - torch.arange(9)[None]).abs() >= window
    for index, layer in enumerate(maps):
        assert bool((layer[..., outside] == 0).all()) == (index in layers)


def test_gemma2_soft_capping_changes_the_maps_and_is_recomputed():
    model = make_family_model("gemma2")
    ids, _ = family_inputs("none")
    with torch.no_grad(), lean_capture(model) as capture:
        model(ids)
    for index, scores in enumerate(capture.layers):
        assert scores.softcap == 2.0
        capped = capture.fused_layer(index)
        uncapped = torch.zeros_like(capped)
        for start, stop, block in fused_blocks(AttentionScores(scores.query, scores.key, scores.mask, scores.scaling,
                                                               scores.causal), "mean"):
            uncapped[:, start:stop, : block.shape[-1]] = block
        assert (capped - uncapped).abs().max() > 0.05  # the test above would see a missing cap


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_the_model_computes_its_own_outputs_during_lean_capture(model_type):
    """Gemma 2 is loaded with eager attention (sdpa has no soft-capping): its own eager function
    computes the outputs, given the additive mask it takes."""
    model = make_family_model(model_type)
    ids, mask = family_inputs("right")
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
        with lean_capture(model) as capture:
            during = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(during, expected, atol=1e-5, rtol=0)
    assert capture.complete


@pytest.mark.parametrize("model_type", [t if t in ("gemma2", "modernbert") else pytest.param(t, marks=pytest.mark.slow)
                                        for t in sorted(FAMILIES)])
def test_gradient_weighted_rollout_lean_equals_stored(model_type):
    model = make_family_model(model_type)
    for side in ("right", "left"):
        ids, mask = family_inputs(side)
        capture = capture_attention_gradients(model, ids, attention_mask=mask)
        assert not capture.refused and len(capture.calls) == 2
        # the first real token of an encoder (its class token), the last of a decoder (its next-token logits)
        real = torch.arange(9)[None].expand(3, 9).masked_fill(mask == 0, -1)
        position = real.masked_fill(mask == 0, 9).amin(1) if model_type in ENCODERS else real.amax(1)
        target = torch.tensor([1, 0, 2] if model_type in ENCODERS else [7, 30, 52])
        stored = GradientWeightedRollout(model, lean=False).attribute(
            ids, target=target, attention_mask=mask, layer=None, position=position)  # every layer
        ours = GradientWeightedRollout(model, lean=True).attribute(
            ids, target=target, attention_mask=mask, layer=None, position=position)
        torch.testing.assert_close(ours, stored, atol=1e-5, rtol=0)


def test_a_call_with_an_unknown_score_term_is_refused():
    """GPT-OSS adds attention sinks (``s_aux``) to the softmax: recomputing q k^T s + M without
    them would be wrong, so its calls are refused even where its type were listed."""
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(
        "gpt_oss", vocab_size=60, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        intermediate_size=32, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
        pad_token_id=0, bos_token_id=0, eos_token_id=0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(5, 60, (2, 9))
    with torch.no_grad(), lean_capture(model) as capture:
        model(ids)
    assert capture.refused and not capture.complete and not capture.layers
    assert capture_attention_gradients(model, ids).refused
    query = key = torch.zeros(1, 1, 9, 4)
    neutral = {"position_ids": torch.arange(9)[None], "use_cache": True, "sliding_window": 4}
    assert captured_scores(model, query, key, torch.ones(1, 1, 9, 9, dtype=torch.bool), None, neutral) is not None
    assert captured_scores(model, query, key, None, None, {"s_aux": torch.zeros(1)}) is None
    # a window narrower than the keys with no mask to hold it
    assert captured_scores(model, query, key, None, None, neutral) is None


def test_a_refused_call_falls_back_to_the_stored_maps(monkeypatch):
    model = make_family_model("qwen3")
    ids, mask = family_inputs("right")
    expected_graph = capture_graph(model, ids, attention_mask=mask, lean=False)
    position, target = mask.sum(1) - 1, torch.tensor([7, 30, 52])
    expected = GradientWeightedRollout(model, lean=False).attribute(ids, target=target, attention_mask=mask, position=position)
    # every call now carries a keyword the capture does not know
    monkeypatch.setattr(lean, "_NEUTRAL_KEYWORDS", lean._NEUTRAL_KEYWORDS - {"position_ids"})
    graph = capture_graph(model, ids, attention_mask=mask)
    assert not graph.is_streamed
    torch.testing.assert_close(graph.weights, expected_graph.weights)
    ours = GradientWeightedRollout(model).attribute(ids, target=target, attention_mask=mask, position=position)
    torch.testing.assert_close(ours, expected)
    with pytest.raises(ValueError, match="cannot be recomputed; use lean=None or False"):
        GradientWeightedRollout(model, lean=True).attribute(ids, target=target, attention_mask=mask, position=position)


def _tower(kind: str) -> torch.nn.Module:
    """A tiny CLIP or SigLIP text or vision tower, or a DINOv2 classifier."""
    torch.manual_seed(0)
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, initializer_range=0.2)
    text = dict(vocab_size=60, max_position_embeddings=16, pad_token_id=0, bos_token_id=0, eos_token_id=2, **common)
    vision = dict(image_size=16, patch_size=8, **common)
    models = {
        "clip_text_model": lambda: transformers.CLIPTextModel(transformers.CLIPTextConfig(**text)),
        "siglip_text_model": lambda: transformers.SiglipTextModel(transformers.SiglipTextConfig(**text)),
        "clip_vision_model": lambda: transformers.CLIPVisionModel(transformers.CLIPVisionConfig(**vision)),
        "siglip_vision_model": lambda: transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**vision)),
        "dinov2": lambda: transformers.Dinov2ForImageClassification(transformers.Dinov2Config(num_labels=3, **vision)),
    }
    return models[kind]().eval()


class _PooledScores(torch.nn.Module):
    """A tower's pooled output times a fixed matrix: three scores to explain."""

    def __init__(self, tower: torch.nn.Module) -> None:
        super().__init__()
        self.tower = tower
        self.head = torch.nn.Linear(32, 3)

    def forward(self, inputs, attention_mask=None):
        kwargs = {} if attention_mask is None else dict(attention_mask=attention_mask)
        return self.head(self.tower(inputs, **kwargs).pooler_output)


@pytest.mark.parametrize("kind", ["clip_text_model", "clip_vision_model", "dinov2", pytest.param("siglip_text_model", marks=pytest.mark.slow),
                                  pytest.param("siglip_vision_model", marks=pytest.mark.slow)])
def test_clip_siglip_and_dinov2_towers_go_lean(kind):
    model = _tower(kind)
    if "text" in kind:
        inputs, mask = family_inputs("right")
        inputs[torch.arange(3), mask.sum(1) - 1] = 2  # CLIP pools at its end-of-text token
    else:
        inputs, mask = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)), None
    lean_graph = capture_graph(model, inputs, attention_mask=mask, lean=True)
    stored = capture_graph(model, inputs, attention_mask=mask, lean=False)
    assert lean_graph.is_streamed and lean_graph.is_causal == (kind == "clip_text_model")
    torch.testing.assert_close(lean_graph.weights, stored.weights, atol=1e-6, rtol=0)
    scores = model if kind == "dinov2" else _PooledScores(model)
    assert supports_attention_gradients(scores)
    position = (mask.sum(1) - 1) if kind == "clip_text_model" else 0
    ours = GradientWeightedRollout(scores).attribute(inputs, target=1, attention_mask=mask, layer=None, position=position)
    expected = GradientWeightedRollout(scores, lean=False).attribute(inputs, target=1, attention_mask=mask, layer=None,
                                                                    position=position)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)
