"""The method registry: one entry per attribution method, the same objects the command line and the
reproduction run."""

from __future__ import annotations


import pytest
import torch

from captum_attnflow import (
    ALTI,
    AttnLRP,
    AttentionFlow,
    AttentionNorm,
    AttentionRollout,
    GradientWeightedRollout,
    RawAttention,
    ValueZeroing,
)
from captum_attnflow.baselines import BlankOut, TokenSaliency
from captum_attnflow.data import build_tokenizer
from captum_attnflow.methods import METHODS, attention_methods, paper_methods
from captum_attnflow.models import AgreementConfig, AgreementModel


def test_each_entry_builds_its_attribution_for_a_model():
    torch.manual_seed(0)
    model, tokenizer = AgreementModel(AgreementConfig(num_hidden_layers=2)).eval(), build_tokenizer()
    expected = {"raw": RawAttention, "rollout": AttentionRollout, "flow": AttentionFlow,
                "gradient_rollout": GradientWeightedRollout, "value_zeroing": ValueZeroing, "alti": ALTI,
                "norm": AttentionNorm, "saliency": TokenSaliency, "blankout": BlankOut, "attnlrp": AttnLRP}
    assert {name: type(method.build(model, tokenizer)) for name, method in METHODS.items()} == expected
    assert paper_methods() == ("raw", "rollout", "flow")
    assert attention_methods() == ("raw", "rollout", "flow", "gradient_rollout", "value_zeroing", "alti", "norm")
    blank_out = METHODS["blankout"].build(model, tokenizer)
    assert blank_out.token_id == tokenizer.unk_token_id  # the paper's blank
    assert blank_out.scores.probabilities
    # Options reach the constructor: one score (not class logits) is measured without its softmax.
    on_scores = METHODS["blankout"].build(model, tokenizer, **dict(METHODS["blankout"].on_scores))
    assert not on_scores.scores.probabilities and on_scores.token_id == tokenizer.unk_token_id
    with pytest.raises(TypeError):
        METHODS["rollout"].build(model, tokenizer, softmax=False)
