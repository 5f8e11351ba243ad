
import pytest
import torch

from helpers import model_state
from captum_attnflow import AttentionFlow
from captum_attnflow.functional import flow
from helpers import CAUSAL, IDS, eager_attentions, make_tiny_model

PAD_ID = {"bert": 0, "distilbert": 0, "roberta": 1, "gpt2": 0, "llama": 0}


def test_flow_of_sdpa_model_equals_functional_flow_and_leaves_model_unchanged(arch):
    model = make_tiny_model(arch)
    before = model_state(model)
    maps = flow(eager_attentions(arch, IDS), layer=None)  # (L, B, n, n)
    explainer = AttentionFlow(model)
    torch.testing.assert_close(explainer.attribute(IDS, position=3, layer=2), maps[1, :, 3])
    torch.testing.assert_close(explainer.attribute(IDS, position=torch.tensor([0, 5])), maps[-1, [0, 1], [0, 5]])
    all_layers = explainer.attribute(IDS, position=-1, layer=None)
    assert all_layers.shape == (3, 2, 6) and all_layers.dtype == torch.float32
    torch.testing.assert_close(all_layers, maps[:, :, -1])
    normalized = explainer.attribute(IDS, position=-1, layer=None, normalize=True)
    torch.testing.assert_close(normalized, maps[:, :, -1] / maps[:, :, -1].sum(-1, keepdim=True))
    assert model_state(model) == before and model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama"])
def test_padding_invariance(arch):
    """Each sentence padded in a batch gets its flows alone on its real tokens; padding gets 0."""
    sentences = [[5, 9, 13, 22, 7], [6, 8, 10, 11, 12, 14, 15, 16], [20, 21, 23]]
    n = max(len(s) for s in sentences)
    ids = torch.full((3, n), PAD_ID[arch])
    mask = torch.zeros(3, n, dtype=torch.long)
    for row, sentence in enumerate(sentences):
        ids[row, : len(sentence)] = torch.tensor(sentence)
        mask[row, : len(sentence)] = 1
    explainer = AttentionFlow(make_tiny_model(arch))
    positions = mask.sum(1) - 1 if arch in CAUSAL else torch.zeros(3, dtype=torch.long)
    batch = explainer.attribute(ids, position=positions, layer=None, attention_mask=mask)
    for row, sentence in enumerate(sentences):
        alone = explainer.attribute(torch.tensor([sentence]), position=int(positions[row]), layer=None)
        real = mask[row].bool()
        torch.testing.assert_close(batch[:, row, real], alone[:, 0], atol=1e-6, rtol=0)
        assert (batch[:, row, ~real] == 0).all()


def test_callable_and_errors():
    attentions = eager_attentions("bert", IDS)
    explainer = AttentionFlow(lambda ids: attentions)
    torch.testing.assert_close(explainer.attribute(IDS, layer=1), flow(attentions, layer=1, sources=0))
    with pytest.raises(ValueError, match="position"):
        explainer.attribute(IDS, position=6)
    with pytest.raises(ValueError, match="one per example"):
        explainer.attribute(IDS, position=torch.tensor([0, 1, 2]))
    with pytest.raises(TypeError, match="token ids"):
        explainer.attribute(IDS.float())
    with pytest.raises(ValueError, match="layer"):
        explainer.attribute(IDS, layer=4)
