"""The method registry: one entry per attribution method, the same objects the command line and the
reproduction run."""

from __future__ import annotations


import pytest
import torch

from captum_attnflow.capture import extract_attentions
from captum_attnflow.data import build_tokenizer
from captum_attnflow.methods import EXTRA_METHODS, METHODS, attention_methods, paper_methods
from captum_attnflow.models import AgreementConfig, AgreementModel


def test_each_entry_keeps_the_promises_of_its_flags():
    torch.manual_seed(0)
    model, tokenizer = AgreementModel(AgreementConfig(num_hidden_layers=2)).eval(), build_tokenizer()
    ids = tokenizer(["the keys to the cabinet"], return_tensors="pt")["input_ids"]  # (1, 6)
    attentions = extract_attentions(model, ids)
    for name, entry in METHODS.items():
        method = entry.build(model, tokenizer)
        target = {"target": 1} if entry.class_specific else {}
        scores = method.attribute(ids, layer=None, **target) if entry.per_layer else method.attribute(ids, target=1)
        assert scores.shape == ((2, 1, 6) if entry.per_layer else (1, 6)), name
        if entry.from_attentions:  # the attention maps alone give the same scores
            torch.testing.assert_close(entry.build(lambda _: attentions, tokenizer).attribute(ids, layer=None), scores)
        if entry.class_specific:  # the target chooses what is explained
            other = method.attribute(ids, target=0, **({"layer": None} if entry.per_layer else {}))
            assert not torch.allclose(other, scores), name
        # Unsigned methods are drawn from their minimum on a sequential scale: never below 0.
        assert entry.signed or (scores >= 0).all(), name
    # "raw" is the head-mean attention of the explained position ([CLS]) at each layer; "rollout" the
    # product of the layers' head-mean attention mixed half and half with the residual (paper, section 3).
    raw = torch.stack([layer.mean(1)[:, 0] for layer in attentions])
    torch.testing.assert_close(METHODS["raw"].build(model, tokenizer).attribute(ids, layer=None), raw)
    mixed = [0.5 * layer.mean(1)[0] + 0.5 * torch.eye(6) for layer in attentions]
    torch.testing.assert_close(
        METHODS["rollout"].build(model, tokenizer).attribute(ids, layer=None)[:, 0],
        torch.stack([mixed[0][0], (mixed[1] @ mixed[0])[0]]),
    )
    assert len({type(entry.build(model, tokenizer)) for entry in METHODS.values()}) == len(METHODS)
    assert paper_methods() == ("raw", "rollout", "flow")
    assert set(paper_methods()) < set(attention_methods()) < set(METHODS)


def test_the_methods_declared_signed_give_negative_scores():
    """``signed`` draws a method centred at 0: each method declared so does score some token below 0
    (here on an untrained model), and each one declared unsigned does not (the per-layer ones are
    checked above); input x gradient and integrated gradients are built with ``reduce="norm"``."""
    torch.manual_seed(0)
    model, tokenizer = AgreementModel(AgreementConfig(num_hidden_layers=2)).eval(), build_tokenizer()
    ids = tokenizer(["the keys to the cabinet near the doors"], return_tensors="pt")["input_ids"]
    entries = {**METHODS, **EXTRA_METHODS}
    assert {name for name, entry in entries.items() if entry.signed} == {"blankout", "attnlrp"}
    for name, entry in entries.items():
        if not entry.per_layer:
            scores = torch.cat([entry.build(model, tokenizer).attribute(ids, target=target) for target in (0, 1)])
            assert bool((scores < 0).any()) == entry.signed, name
    summed = EXTRA_METHODS["input_x_gradient"].build(model, tokenizer, reduce="sum").attribute(ids, target=1)
    assert (summed < 0).any()  # the option that makes it signed, for which plot_methods takes signed=


def test_options_reach_the_constructor():
    torch.manual_seed(0)
    model, tokenizer = AgreementModel(AgreementConfig(num_hidden_layers=2)).eval(), build_tokenizer()
    blank_out = METHODS["blankout"].build(model, tokenizer)
    assert blank_out.token_id == tokenizer.unk_token_id  # the paper's blank
    assert blank_out.scores.probabilities
    # One score (not class logits) is measured without its softmax.
    on_scores = METHODS["blankout"].build(model, tokenizer, **dict(METHODS["blankout"].on_scores))
    assert not on_scores.scores.probabilities and on_scores.token_id == tokenizer.unk_token_id
    with pytest.raises(TypeError):
        METHODS["rollout"].build(model, tokenizer, softmax=False)
