"""Targets are checked in one place, as Captum checks them: one int for all, or one per example."""

from __future__ import annotations

import pytest
import torch
from helpers import make_classifier

from captum_attnflow import GradientWeightedRollout
from captum_attnflow.baselines import TokenSaliency
from captum_attnflow.evaluate import aopc_comprehensiveness
from captum_attnflow.hf import target_indices


def test_target_indices_accepts_one_for_all_or_one_per_example():
    assert target_indices(2, batch=3).tolist() == 2
    assert target_indices([2, 0, 1], batch=3).tolist() == [2, 0, 1]
    assert target_indices([[1, 2]], batch=1, per_position=2).tolist() == [[1, 2]]
    for wrong in ([0], [0, 1], torch.tensor([1, 0, 1, 0])):
        with pytest.raises(ValueError, match=r"entries for B = 3 examples: give one per example, or one int for all"):
            target_indices(wrong, batch=3)
    with pytest.raises(ValueError, match=r"must have shape \(1, 2\)"):
        target_indices([[1, 2, 3]], batch=1, per_position=2)
    for wrong in ("yes", True, [0.5, 1.0], [[1]]):
        with pytest.raises(TypeError, match="integer indices"):
            target_indices(wrong, batch=1)


def test_a_short_target_list_is_refused_by_every_entry_point():
    model = make_classifier(layers=1)
    ids = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10]])
    calls = [
        lambda: GradientWeightedRollout(model).attribute(ids, target=[0]),
        lambda: TokenSaliency(model).attribute(ids, target=[0]),
        lambda: aopc_comprehensiveness(model, ids, torch.rand(2, 4), target=[0]),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="target has 1 entries for B = 2 examples"):
            call()
    torch.testing.assert_close(  # one int still means the same class for all
        GradientWeightedRollout(model).attribute(ids, target=1), GradientWeightedRollout(model).attribute(ids, target=[1, 1])
    )


def test_the_embedding_layer_is_the_one_the_forward_calls_on_t5s_encoder():
    """T5EncoderModel's get_input_embeddings() is `shared`, but its forward calls
    `encoder.embed_tokens` (the same weight): hooks go on the module that runs."""
    import transformers

    from captum_attnflow.hf.scores import input_embeddings

    config = transformers.T5Config(vocab_size=60, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=2,
                                   decoder_start_token_id=0, eos_token_id=3, pad_token_id=0)
    encoder = transformers.T5EncoderModel(config).eval()
    wrapped = torch.nn.Sequential(encoder)  # a module holding the model: found through it too
    for forward_func in (encoder, wrapped):
        layer, called = input_embeddings(forward_func), []
        handle = layer.register_forward_hook(lambda module, args, output: called.append(output))
        encoder(input_ids=torch.tensor([[5, 6, 7, 3]]))
        handle.remove()
        assert len(called) == 1
    full = transformers.T5ForConditionalGeneration(config).eval()
    assert input_embeddings(full) is full.shared  # the encoder-decoder keeps its shared embedding
