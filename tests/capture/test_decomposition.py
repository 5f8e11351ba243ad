"""hf/decomposition.py: each block's map is made during the forward, so one layer's attention
exists at a time; on the lean capture (the model's own sdpa, each head's probabilities
recomputed in blocks of rows) the maps equal those of the eager path's stored probabilities."""

from __future__ import annotations

import pytest
import torch
from helpers import make_tiny_model, model_state

from captum_attnflow import ALTI, AttentionNorm, ValueZeroing, load_agreement_model
from captum_attnflow.capture import decomposition, internals as internals_module
from captum_attnflow.capture.internals import capture_internals
from captum_attnflow.capture.lean_heads import head_blocks

MAPS = [decomposition.alti_maps, decomposition.attention_norm_maps, decomposition.value_zeroing_maps]
MAP_IDS = ["alti", "norms", "value_zeroing"]


@pytest.mark.parametrize("method", [ALTI, AttentionNorm, ValueZeroing])
def test_each_layers_attention_is_dropped_once_its_map_is_made(monkeypatch, method):
    model, tokenizer = load_agreement_model()
    batch = tokenizer(["the keys to the cabinet are", "the key"], return_tensors="pt", padding=True)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    expected = method(model).attribute(ids, attention_mask=mask, layer=None)
    alive, lean = [], []

    def capture(*args, after_block, **kwargs):
        def checked(internals):
            after_block(internals)
            lean.append(bool(internals.scores) and not internals.probabilities)
            alive.append(sum(p is not None for p in internals.probabilities + internals.scores))

        return capture_internals(*args, after_block=checked, **kwargs)

    monkeypatch.setattr(decomposition, "capture_internals", capture)
    assert torch.equal(method(model).attribute(ids, attention_mask=mask, layer=None), expected)
    assert alive == [0] * model.config.num_hidden_layers
    assert all(lean)


def test_maps_equal_those_of_the_stored_probabilities():
    """The maps made on the lean capture are the maps of the probabilities eager attention returns."""
    model, tokenizer = load_agreement_model()
    ids = tokenizer(["the keys to the cabinet are"], return_tensors="pt")["input_ids"]
    maps = decomposition.attention_norm_maps(model, ids)
    architecture, modules = decomposition.architecture_of(model, "AttentionNorm")
    internals = capture_internals(model, ids, blocks=modules)
    for index, module in enumerate(modules):
        weight = decomposition.projection_weight(architecture.output_projection(module))[0]
        expected = decomposition.decomposition.attention_norms(
            internals.probabilities[index], internals.values[index], weight, torch.ones(1, ids.shape[1], dtype=torch.bool)
        )
        torch.testing.assert_close(maps[index], expected, atol=1e-7, rtol=1e-6)


def _batch(side: str) -> tuple[torch.Tensor, torch.Tensor]:
    second, real = ([6, 8, 10, 11, 0, 0], [1, 1, 1, 1, 0, 0]) if side == "right" else ([0, 0, 6, 8, 10, 11], [0, 0, 1, 1, 1, 1])
    return torch.tensor([[5, 9, 13, 22, 7, 30], second]), torch.tensor([[1] * 6, real])


@pytest.mark.parametrize("block_rows", [1, 4], ids=["row-blocks-of-1", "row-blocks-of-4"])
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama"])  # post-LN bidirectional; pre-LN causal; causal, GQA
@pytest.mark.parametrize("maps_of", MAPS, ids=MAP_IDS)
def test_lean_maps_equal_the_eager_path(monkeypatch, maps_of, arch, side, block_rows):
    """Equal to the maps of eager attention's stored probabilities (the path of models the lean
    capture does not serve) to 1e-6, with the recomputed rows in blocks that split the layer.
    Value zeroing to 1e-5: its distances are 1 - cos of nearly equal outputs, where float32
    rounding of the attention output (sdpa's or eager's) shows; both paths are 5e-6 from a
    float64 reference (tests/attr/test_internals_methods.py)."""
    model = make_tiny_model(arch)
    ids, mask = _batch(side)
    before = model_state(model)
    monkeypatch.setattr(decomposition, "head_blocks", lambda scores, rows=None: head_blocks(scores, rows or block_rows))
    lean = maps_of(model, ids, attention_mask=mask)
    monkeypatch.setattr(decomposition, "supports_lean", lambda model: False)
    eager = maps_of(model, ids, attention_mask=mask)
    tolerance = 1e-5 if maps_of is decomposition.value_zeroing_maps else 1e-6
    torch.testing.assert_close(lean, eager, atol=tolerance, rtol=0)
    assert model_state(model) == before


def test_a_call_the_lean_capture_cannot_recompute_runs_eager(monkeypatch):
    """A layer whose scores hold a term the capture cannot recompute sends the call to the eager
    path: the same maps, the model left as it was."""
    model = make_tiny_model("llama")
    ids, mask = _batch("left")
    expected = decomposition.alti_maps(model, ids, attention_mask=mask)
    calls = []

    def refused(*args, **kwargs):
        calls.append(1)
        return None

    monkeypatch.setattr(internals_module, "captured_scores", refused)
    before = model_state(model)
    torch.testing.assert_close(decomposition.alti_maps(model, ids, attention_mask=mask), expected, atol=1e-6, rtol=0)
    assert calls and model_state(model) == before
