"""The lean path (attention reduced to its fused (B, n, n) matrix per layer during the forward)
equals the stored-maps path, keeps the model's own outputs, and leaves the model as it was."""

from __future__ import annotations

import pytest
import torch
import transformers

from captum_attnflow import AttentionFlow, AttentionRollout, RawAttention, load_agreement_model
from captum_attnflow.capture import capture_graph
from captum_attnflow.capture.lean import LeanCapture, lean_capture
from captum_attnflow.capture.lean_blocks import AttentionScores, _scratch_size, fused_blocks
from captum_attnflow.functional import fuse_heads, rollout_rows
from helpers import make_tiny_model, model_state, padded_batch

LEAN_ARCHS = ["bert", "roberta", "distilbert", "gpt2", "llama"]


def ids_and_mask(arch: str, side: str):
    ids, mask = padded_batch(batch=3, n=9)
    if side == "left":
        ids, mask = ids.flip(-1), mask.flip(-1)
    if side == "none":
        mask = None
    if arch == "roberta":  # RoBERTa's pad id is 1 and its positions count from it
        ids = ids.clamp(min=2) if mask is None else torch.where(mask.bool(), ids.clamp(min=2), 1)
    return ids, mask


@pytest.mark.parametrize("arch", LEAN_ARCHS)
@pytest.mark.parametrize("side", ["none", "right", "left"])
@pytest.mark.parametrize("fusion", ["mean", "max", "min"])
def test_lean_graph_equals_the_stored_maps_graph(arch, side, fusion):
    model = make_tiny_model(arch)
    ids, mask = ids_and_mask(arch, side)
    lean = capture_graph(model, ids, attention_mask=mask, head_fusion=fusion, lean=True)
    stored = capture_graph(model, ids, attention_mask=mask, head_fusion=fusion, lean=False)
    assert lean.is_streamed  # layers computed when asked for, none stored by the forward
    for index in range(lean.num_layers):
        torch.testing.assert_close(lean.layer(index), stored.weights[index], atol=1e-6, rtol=0)
        positions = torch.tensor([[0, 8, 3], [5, 1, 5], [2, 7, 4]])  # rows alone: recomputed from their queries
        torch.testing.assert_close(lean.rows(index, positions), stored.rows(index, positions), atol=1e-6, rtol=0)
    torch.testing.assert_close(lean.weights, stored.weights, atol=1e-6, rtol=0)
    assert torch.equal(lean.mask, stored.mask) and lean.is_causal == stored.is_causal


@pytest.mark.parametrize(("arch", "side"), [("bert", "right"), ("gpt2", "none"), ("llama", "none"), ("llama", "left")])
@pytest.mark.parametrize("block_bytes", [1, 20, 40])
def test_lean_layers_computed_in_many_row_blocks(monkeypatch, arch, side, block_bytes):
    """Blocks of one row up to several (n = 9), causal blocks of varying width: the same layers."""
    monkeypatch.setattr("captum_attnflow.capture.lean_blocks._BLOCK_BYTES", block_bytes * 4 * 3 * 4)  # B = 3, H = 4
    model = make_tiny_model(arch)
    ids, mask = ids_and_mask(arch, side)
    lean = capture_graph(model, ids, attention_mask=mask, lean=True)
    stored = capture_graph(model, ids, attention_mask=mask, lean=False)
    assert lean.is_blockwise  # also a left-padded batch, run reordered: its rows move, not its layers
    expected = rollout_rows(stored, layer=None)
    monkeypatch.setattr(type(lean), "layer", lambda *args, **kwargs: pytest.fail("a whole layer was built"))
    torch.testing.assert_close(rollout_rows(lean, layer=None), expected, atol=1e-6, rtol=0)
    monkeypatch.undo()
    assert lean.is_streamed  # the rollout multiplied block by block, stored nothing
    torch.testing.assert_close(lean.weights, stored.weights, atol=1e-6, rtol=0)


@pytest.mark.parametrize("method", [RawAttention, AttentionRollout, AttentionFlow])
@pytest.mark.parametrize(("arch", "side"), [("llama", "left"), ("bert", "right"), ("gpt2", "none")])
@pytest.mark.parametrize("layer", [None, -1, 1])
def test_methods_agree_on_both_paths(method, arch, side, layer):
    model = make_tiny_model(arch)  # llama: rotary positions, grouped-query attention
    ids, mask = ids_and_mask(arch, side)
    lean = method(model).attribute(ids, attention_mask=mask, layer=layer)
    stored = method(model, lean=False).attribute(ids, attention_mask=mask, layer=layer)
    torch.testing.assert_close(lean, stored, atol=1e-6, rtol=0)
    if method is not AttentionFlow:  # two positions per example
        real = torch.ones_like(ids) if mask is None else mask
        first, last = real.argmax(-1), real.shape[1] - 1 - real.flip(-1).argmax(-1)
        position = torch.stack([last, first], 1)  # (B, 2): two real positions per example
        lean = method(model).attribute(ids, attention_mask=mask, layer=layer, position=position)
        stored = method(model, lean=False).attribute(ids, attention_mask=mask, layer=layer, position=position)
        torch.testing.assert_close(lean, stored, atol=1e-6, rtol=0)


def test_bundled_model_and_vision_transformer_go_lean():
    model, tokenizer = load_agreement_model()
    batch = tokenizer(["the keys to the cabinet", "the key"], padding=True, return_tensors="pt")
    lean = capture_graph(model, batch["input_ids"], attention_mask=batch["attention_mask"], lean=True)
    stored = capture_graph(model, batch["input_ids"], attention_mask=batch["attention_mask"], lean=False)
    torch.testing.assert_close(lean.weights, stored.weights, atol=1e-6, rtol=0)
    torch.manual_seed(0)
    vit = transformers.ViTModel(transformers.ViTConfig(
        image_size=8, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64)).eval()
    pixels = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(capture_graph(vit, pixels, lean=True).weights, capture_graph(vit, pixels, lean=False).weights,
                               atol=1e-6, rtol=0)


def test_the_model_computes_its_own_outputs_during_lean_capture():
    model = make_tiny_model("gpt2")
    ids, mask = ids_and_mask("gpt2", "right")
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).last_hidden_state
        with lean_capture(model) as capture:
            during = model(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(during, expected)
    assert capture.complete and capture.fused_layer(2).shape == (3, 9, 9)


def test_model_unchanged_after_an_exception_inside_the_lean_forward():
    model = make_tiny_model("bert")
    model.train()
    model.config.output_attentions = False
    before = model_state(model), model.config._attn_implementation

    def fail(*args):
        raise RuntimeError("inside the forward")

    failing = model.encoder.layer[1].register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="inside the forward"):
        AttentionRollout(model, lean=True).attribute(torch.tensor([[5, 6, 7]]))
    failing.remove()
    assert (model_state(model), model.config._attn_implementation) == before
    assert model.training and model.config.output_attentions is False


def test_lean_true_where_it_does_not_apply_is_an_error():
    attentions = torch.softmax(torch.randn(2, 1, 2, 4, 4), -1)
    with pytest.raises(ValueError, match="lean path applies"):
        AttentionRollout(lambda ids: attentions, lean=True).attribute(torch.tensor([[1, 2, 3, 4]]))
    # per-head results need every head's maps: the stored path serves them, also by default
    model = make_tiny_model("bert")
    torch.testing.assert_close(
        AttentionRollout(model).attribute(torch.tensor([[5, 6, 7]]), head=1),
        AttentionRollout(model, lean=False).attribute(torch.tensor([[5, 6, 7]]), head=1),
    )


def test_causality_is_read_from_bool_and_additive_masks():
    query = key = torch.zeros(1, 1, 3, 2)
    later = torch.ones(3, 3, dtype=torch.bool).triu(1)
    cases = {
        "bool causal": (~later[None, None], True),
        "bool full": (torch.ones(1, 1, 3, 3, dtype=torch.bool), False),
        "additive causal": (torch.zeros(1, 1, 3, 3).masked_fill(later, float("-inf")), True),
        "additive full": (torch.zeros(1, 1, 3, 3), False),
    }
    for name, (mask, causal) in cases.items():
        capture = LeanCapture(1, "mean", "sdpa")
        capture.add(AttentionScores(query, key, mask, 1.0, False))
        assert capture.causal is causal, name


def test_rollout_on_the_lean_path_shows_a_progress_bar_when_asked(capfd):
    model = make_tiny_model("bert")
    ids, mask = ids_and_mask("bert", "right")
    AttentionRollout(model).attribute(ids, attention_mask=mask, layer=None)
    assert "attention rollout" not in capfd.readouterr().err  # tiny inputs: no bar by default
    AttentionRollout(model).attribute(ids, attention_mask=mask, layer=None, show_progress=True)
    assert "attention rollout" in capfd.readouterr().err


@pytest.mark.parametrize("block_bytes", [1, 20, 10**9])
@pytest.mark.parametrize("fusion", ["mean", "max"])
def test_fused_blocks_take_masks_of_any_broadcast_shape(monkeypatch, block_bytes, fusion):
    """Bool or additive masks, with a query axis of n or 1; scratch never larger than the maps."""
    monkeypatch.setattr("captum_attnflow.capture.lean_blocks._BLOCK_BYTES", block_bytes * 4 * 2 * 4)  # B = 2, H = 4
    generator = torch.Generator().manual_seed(0)
    query, key = torch.randn(2, 4, 6, 8, generator=generator), torch.randn(2, 2, 6, 8, generator=generator)  # GQA
    keys_allowed = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    scores = query @ key.repeat_interleave(2, 1).transpose(-1, -2) * 0.3
    expected = fuse_heads(torch.softmax(scores.masked_fill(~keys_allowed[:, None, None], float("-inf")), -1), fusion)
    for mask in (keys_allowed[:, None, None], keys_allowed[:, None, None].expand(2, 1, 6, 6),
                 torch.zeros(2, 1, 1, 6).masked_fill(~keys_allowed[:, None, None], torch.finfo(torch.float32).min)):
        out = torch.full((2, 6, 6), float("nan"))
        for _ in fused_blocks(AttentionScores(query, key, mask, 0.3, False), fusion, out=out):
            pass
        torch.testing.assert_close(out, expected)
    assert _scratch_size(AttentionScores(query, key, None, 0.3, False)) <= (2 * 4 + 1) * 2 * 6 * 6
