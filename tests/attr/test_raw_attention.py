
import pytest
import torch

from helpers import model_state
from captum_attnflow import RawAttention
from helpers import make_tiny_model

IDS = torch.tensor([[5, 9, 13, 22, 7, 30], [6, 8, 10, 11, 12, 14]])


def head_mean_attentions(arch, ids, **kwargs):
    """(L, B, n, n) head-averaged attentions of the eager-loaded model, straight from transformers."""
    model = make_tiny_model(arch, attn_implementation="eager")
    with torch.no_grad():
        return torch.stack(model(ids, output_attentions=True, **kwargs).attentions).mean(2)


def test_raw_attention_is_the_head_averaged_attention_row(arch):
    model = make_tiny_model(arch)
    before = model_state(model)
    expected = head_mean_attentions(arch, IDS)
    raw = RawAttention(model)
    torch.testing.assert_close(raw.attribute(IDS, position=2, layer=1), expected[0, :, 2])
    torch.testing.assert_close(raw.attribute(IDS, position=-1), expected[-1, :, -1])
    torch.testing.assert_close(raw.attribute(IDS, position=torch.tensor([4, 1]), layer=None), expected[:, [0, 1], [4, 1]])
    assert model_state(model) == before and model.config._attn_implementation == "sdpa"


def test_raw_attention_with_residual_and_head_fusion():
    model = make_tiny_model("bert")
    with torch.no_grad():
        model.set_attn_implementation("eager")
        heads = model(IDS, output_attentions=True).attentions[1]
        model.set_attn_implementation("sdpa")
    mixed = 0.5 * heads.amax(1) + 0.5 * torch.eye(6)
    expected = (mixed / mixed.sum(-1, keepdim=True))[:, 3]
    scores = RawAttention(model).attribute(IDS, position=3, layer=2, head_fusion="max", residual_alpha=0.5)
    torch.testing.assert_close(scores, expected)


def test_raw_attention_gives_padding_zero_and_renormalises_over_real_tokens():
    ids = IDS.clone()
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    scores = RawAttention(make_tiny_model("bert")).attribute(ids, attention_mask=mask, layer=None)
    assert (scores[:, 1, 4:] == 0).all()
    torch.testing.assert_close(scores.sum(-1), torch.ones(3, 2))
    alone = RawAttention(make_tiny_model("bert")).attribute(ids[1:, :4], layer=None)
    torch.testing.assert_close(scores[:, 1:, :4], alone, atol=1e-6, rtol=0)


def test_raw_attention_is_a_captum_attribution():
    raw = RawAttention(make_tiny_model("bert"))
    assert not raw.has_convergence_delta()
    torch.testing.assert_close(raw.attribute(IDS, target=1), raw.attribute(IDS))
    with pytest.raises(ValueError, match="layer=4 is out of range for a model with L=3 layers"):
        raw.attribute(IDS, layer=4)
    with pytest.raises(ValueError, match="out of range for sequences of n=6"):
        raw.attribute(IDS, position=6)
