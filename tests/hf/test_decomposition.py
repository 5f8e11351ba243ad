"""hf/decomposition.py: each block's map is made during the forward, so one layer's probabilities
exist at a time; the maps are those of the model's own stored probabilities."""

from __future__ import annotations

import pytest
import torch

from captum_attnflow import ALTI, AttentionNorm, ValueZeroing, load_agreement_model
from captum_attnflow.hf import decomposition
from captum_attnflow.hf.internals import capture_internals


@pytest.mark.parametrize("method", [ALTI, AttentionNorm, ValueZeroing])
def test_each_layers_probabilities_are_dropped_once_its_map_is_made(monkeypatch, method):
    model, tokenizer = load_agreement_model()
    batch = tokenizer(["the keys to the cabinet are", "the key"], return_tensors="pt", padding=True)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    expected = method(model).attribute(ids, attention_mask=mask, layer=None)
    alive = []

    def capture(*args, after_block, **kwargs):
        def checked(internals):
            after_block(internals)
            alive.append(sum(p is not None for p in internals.probabilities))

        return capture_internals(*args, after_block=checked, **kwargs)

    monkeypatch.setattr(decomposition, "capture_internals", capture)
    assert torch.equal(method(model).attribute(ids, attention_mask=mask, layer=None), expected)
    assert alive == [0] * model.config.num_hidden_layers


def test_maps_equal_those_of_the_stored_probabilities():
    """The maps made during the forward are the maps of the probabilities the forward returns."""
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
        torch.testing.assert_close(maps[index], expected, atol=0, rtol=0)
