"""inject_attention: the given attention is the one the model applies, and the model comes back unchanged."""

from __future__ import annotations


import pytest
import torch
import transformers

from captum_attnflow import AttentionRollout, RawAttention, eager_attention
from captum_attnflow.capture import inject_attention
from captum_attnflow.functional import rollout_rows
from captum_attnflow.models.tagger import TaggerModel, yang_tagger_config

TINY = dict(vocab_size=60, hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2)
MODELS = {
    "bert": lambda: transformers.BertModel(transformers.BertConfig(**TINY)),
    "gpt2": lambda: transformers.GPT2Model(transformers.GPT2Config(vocab_size=60, n_embd=32, n_head=4, n_layer=2)),
    # grouped-query attention: 4 query heads share 2 key/value heads
    "llama": lambda: transformers.LlamaModel(transformers.LlamaConfig(num_key_value_heads=2, pad_token_id=0, **TINY)),
}
IDS = torch.tensor([[2, 10, 11, 12, 13], [2, 14, 15, 0, 0]])
MASK = (IDS != 0).long()


def keep(layer, weights):
    return weights


@pytest.mark.parametrize("arch", ["tagger", "bert", "gpt2", "llama"])
def test_identity_replacement_is_eager_attention(arch):
    torch.manual_seed(0)
    model = TaggerModel(yang_tagger_config(num_hidden_layers=2)) if arch == "tagger" else MODELS[arch]()
    model.eval()
    with eager_attention(model):
        expected = model(IDS, attention_mask=MASK, output_attentions=True)
    seen = []
    with inject_attention(model, lambda layer, weights: seen.append(layer) or weights):
        got = model(IDS, attention_mask=MASK, output_attentions=True)
    assert seen == list(range(len(expected.attentions)))
    out = "logits" if arch == "tagger" else "last_hidden_state"
    real = MASK.bool()
    assert torch.allclose(getattr(got, out)[real], getattr(expected, out)[real], atol=1e-5)
    for a, b in zip(got.attentions, expected.attentions):
        assert torch.allclose(a, b, atol=1e-6)


def test_uniform_attention_against_explicit_block():
    torch.manual_seed(0)
    model = TaggerModel(yang_tagger_config()).eval()
    ids = IDS[:1]
    with inject_attention(model, lambda layer, w: torch.full_like(w, 1 / w.shape[-1])):
        logits = model(ids).logits[0]
    # The one GPT-2 block written out: with uniform attention every query reads the mean value.
    block = model.h[0]
    x = model.wte(ids[0]) + model.wpe(torch.arange(ids.shape[1]))
    h = block.ln_1(x)
    value = h @ block.attn.c_attn.weight[:, 128:] + block.attn.c_attn.bias[128:]
    x = x + (value.mean(0, keepdim=True).expand_as(value) @ block.attn.c_proj.weight + block.attn.c_proj.bias)
    h = block.ln_2(x)
    mlp = torch.nn.functional.gelu(h @ block.mlp.c_fc.weight + block.mlp.c_fc.bias, approximate="tanh")
    x = x + mlp @ block.mlp.c_proj.weight + block.mlp.c_proj.bias
    expected = model.ln_f(x) @ model.classifier.weight.T + model.classifier.bias
    assert torch.allclose(logits, expected, atol=1e-5)


def snapshot(model):
    return (
        {k: v.clone() for k, v in model.state_dict().items()},
        [(name, m.training) for name, m in model.named_modules()],
        [p.requires_grad for p in model.parameters()],
        model.config._attn_implementation,
        sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()),
    )


def assert_same(before, after):
    assert before[0].keys() == after[0].keys() and all(torch.equal(before[0][k], after[0][k]) for k in before[0])
    assert before[1:] == after[1:]


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_model_unchanged_after_injection_and_after_an_exception(mode):
    model = TaggerModel(yang_tagger_config(num_hidden_layers=2))
    model.train(mode == "train")
    model.h[1].requires_grad_(False)
    before = snapshot(model)
    with torch.no_grad(), inject_attention(model, keep):
        model(IDS, attention_mask=MASK, output_attentions=True)
    assert_same(before, snapshot(model))
    with pytest.raises(ZeroDivisionError), inject_attention(model, lambda layer, w: w / 0 if layer else 1 / 0):
        model(IDS, attention_mask=MASK)
    assert_same(before, snapshot(model))
    with pytest.raises(ValueError, match=r"must return a tensor of the weights' shape"):
        with inject_attention(model, lambda layer, w: w[:, :1]):
            model(IDS, attention_mask=MASK)
    assert_same(before, snapshot(model))
    # Outside the block the model is back on its own implementation and computes as before.
    assert model.config._attn_implementation == "sdpa"


def test_gradients_reach_the_injected_attention():
    model = TaggerModel(yang_tagger_config()).eval().requires_grad_(False)
    logits = torch.zeros(1, 4, 5, 5, requires_grad=True)
    with inject_attention(model, lambda layer, w: logits.softmax(-1)):
        model(IDS[:1]).logits.sum().backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_errors_name_the_fix():
    with pytest.raises(TypeError, match="callable"):
        with inject_attention(TaggerModel(yang_tagger_config()), None):
            pass
    with pytest.raises(TypeError, match="no Hugging Face"):
        with inject_attention(torch.nn.Linear(2, 2), keep):
            pass


@pytest.mark.parametrize("lean", [None, False])
def test_attributions_inside_the_block_explain_the_injected_attention(lean):
    """Inside the block the model applies the injected weights: raw attention and rollout read
    those (not eager attention, not weights recomputed from queries and keys)."""
    model = MODELS["bert"]().eval()  # 2 layers, 4 heads, sdpa as loaded
    ids = torch.tensor([[3, 10, 11, 12, 13]])
    peaked = torch.softmax(torch.randn(5, 5, generator=torch.Generator().manual_seed(0)) * 3, -1)  # (n, n)
    injected = lambda layer, weights: peaked.expand_as(weights).contiguous()
    with inject_attention(model, injected):
        raw = RawAttention(model, lean=lean).attribute(ids, layer=None)
        rolled = AttentionRollout(model, lean=lean).attribute(ids, layer=None)
        with pytest.raises(ValueError, match="inject_attention"):
            RawAttention(model, lean=True).attribute(ids)
    torch.testing.assert_close(raw[:, 0], peaked[0].expand(2, 5))  # (L, B, n): row 0 in every layer
    attentions = peaked.expand(2, 1, 4, 5, 5)  # (L, B, H, n, n)
    torch.testing.assert_close(rolled, rollout_rows(attentions, position=0, layer=None))
    assert model.config._attn_implementation == "sdpa"
