"""The lean gradient-weighted maps (hf/attention_gradients.py): the same rollout as eager attention's
stored probabilities and gradients, with the model's own sdpa attention, row blocks of any size, no
(B, H, n, n) tensor kept for the backward pass, and the model left as it was."""

from __future__ import annotations

import pytest
import torch
import transformers
from helpers import CONFIGS, make_tiny_model, model_state, padded_batch

from captum_attnflow import AttnLRP, GradientWeightedRollout, load_agreement_model
from captum_attnflow.capture import lean_blocks
from captum_attnflow.capture.attention_gradients import capture_attention_gradients, supports_attention_gradients


def _with_head(arch: str) -> torch.nn.Module:
    torch.manual_seed(1)
    config = CONFIGS[arch]()
    config.initializer_range = 0.2
    if arch in ("gpt2", "llama"):
        return transformers.AutoModelForCausalLM.from_config(config).eval()
    config.num_labels = 3
    return transformers.AutoModelForSequenceClassification.from_config(config).eval()


def _left_padded(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    shift = (mask == 0).sum(1, keepdim=True)
    where = (torch.arange(ids.shape[1])[None] + shift) % ids.shape[1]
    return ids.new_zeros(ids.shape).scatter(1, where, ids), mask.new_zeros(mask.shape).scatter(1, where, mask), where


@pytest.fixture(params=[None, 1], ids=["one-block", "row-blocks"])
def block_bytes(request, monkeypatch):
    """Blocks of the whole map, or of one row (every block boundary, causal narrow blocks)."""
    if request.param is not None:
        monkeypatch.setattr(lean_blocks, "_BLOCK_BYTES", request.param)
    return request.param


@pytest.mark.parametrize("arch", ["bert", "distilbert", "roberta", "gpt2", "llama"])
def test_lean_equals_stored_probabilities_padded_on_either_side(arch, block_bytes):
    model = _with_head(arch)
    ids, mask = padded_batch(seed=7, batch=3, n=8)
    before = model_state(model)
    left_ids, left_mask, where = _left_padded(ids, mask)
    for layer in (None, -1, 2):
        for inputs, attention_mask, position in ((ids, mask, [0, 2]), (left_ids, left_mask, where[:, [0, 2]])):
            stored = GradientWeightedRollout(model, lean=False).attribute(
                inputs, attention_mask=attention_mask, layer=layer, position=position
            )
            ours = GradientWeightedRollout(model, lean=True).attribute(
                inputs, attention_mask=attention_mask, layer=layer, position=position
            )
            assert ours.shape == stored.shape
            assert torch.allclose(ours, stored, atol=1e-5), (layer, (ours - stored).abs().max())
    assert model_state(model) == before
    assert model.config._attn_implementation == "sdpa"
    assert all(p.grad is None for p in model.parameters())


def test_lean_equals_stored_on_the_bundled_model_vit_and_bart(block_bytes):
    model, tokenizer = load_agreement_model()
    encoded = tokenizer(["the keys to the cabinet", "the key"], return_tensors="pt", padding=True)
    stored = GradientWeightedRollout(model, lean=False).attribute(encoded, target=1, layer=None)
    assert torch.allclose(GradientWeightedRollout(model).attribute(encoded, target=1, layer=None), stored, atol=1e-5)
    torch.manual_seed(0)
    vit = transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=16, patch_size=8,
        num_labels=3, initializer_range=0.2,
    )).eval()
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    stored = GradientWeightedRollout(vit, lean=False).attribute(pixels, target=2, layer=None)
    assert torch.allclose(GradientWeightedRollout(vit, lean=True).attribute(pixels, target=2, layer=None), stored, atol=1e-5)
    bart = transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=40, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32, init_std=0.2,
    )).eval()
    source, source_mask = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 1, 1]]), torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    decoder, decoder_mask = torch.tensor([[2, 12, 13], [2, 14, 1]]), torch.tensor([[1, 1, 1], [1, 1, 0]])
    target = torch.tensor([[12, 13, 2], [14, 2, 1]])
    rows = {
        lean_path: GradientWeightedRollout(bart, lean=lean_path).encoder_decoder_rows(
            source, decoder, target, None, source_mask, decoder_mask
        )
        for lean_path in (False, True)
    }
    assert torch.allclose(rows[True], rows[False], atol=1e-5)


def test_language_model_positions_each_explain_their_own_token():
    model = _with_head("llama")
    ids, mask = padded_batch(seed=8, batch=2, n=9)
    last = mask.sum(1) - 1
    position = torch.stack([last - 2, last - 1, last], 1)
    target = torch.randint(0, 60, (2, 3), generator=torch.Generator().manual_seed(1))
    together = GradientWeightedRollout(model).attribute(ids, target=target, attention_mask=mask, position=position)
    for k in range(3):
        alone = GradientWeightedRollout(model, lean=False).attribute(
            ids, target=target[:, k], attention_mask=mask, position=position[:, k]
        )
        assert torch.allclose(together[:, k], alone, atol=1e-5)


def test_a_language_model_computes_the_logits_of_the_explained_positions_alone():
    """Given positions: ``logits_to_keep`` holds their run positions (left padding moves them),
    and each score is the logit its full run gives."""
    model = _with_head("llama")
    ids, mask = (t.flip(1) for t in padded_batch(seed=8, batch=2, n=9))  # left padding
    position = torch.tensor([[8, 6], [7, 8]])
    capture = capture_attention_gradients(model, ids, attention_mask=mask, positions=position)
    full = capture_attention_gradients(model, ids, attention_mask=mask)
    assert capture.order is not None and not mask[1].all()  # the padded example's tokens moved
    rows = capture.logit_rows(position if capture.order is None else capture.order.argsort(-1).gather(1, position))
    assert capture.output.logits.shape[1] == capture.kept.numel() < full.output.logits.shape[1]
    picked = torch.arange(2)[:, None]
    run = position if full.order is None else full.order.argsort(-1).gather(1, position)
    torch.testing.assert_close(capture.output.logits[picked, rows], full.output.logits[picked, run], atol=1e-5, rtol=0)


def test_a_model_that_takes_logits_to_keep_but_computes_every_logit():
    """A language model whose forward accepts ``logits_to_keep`` and ignores it: the scores are
    still each position's own logit (the rows found from the logits' shape)."""

    class EveryLogit(transformers.LlamaForCausalLM):
        def forward(self, *args, logits_to_keep=0, **kwargs):
            return super().forward(*args, **kwargs)

    model = _with_head("llama")
    ignoring = EveryLogit(model.config).eval()
    ignoring.load_state_dict(model.state_dict())
    ids, mask = padded_batch(seed=8, batch=2, n=9)
    position, target = torch.tensor([[5, 7], [1, 2]]), torch.tensor([[5, 9], [17, 3]])  # kept: 1, 2, 5, 7
    for method in (GradientWeightedRollout, AttnLRP):
        expected = method(model).attribute(ids, target=target, attention_mask=mask, position=position)
        ours = method(ignoring).attribute(ids, target=target, attention_mask=mask, position=position)
        torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0)


def test_the_backward_pass_keeps_no_attention_map():
    """Only the (B, 1, n, n) mask of the padded batch has two token axes; eager attention
    would keep the (B, H, n, n) probabilities of every layer."""
    model = _with_head("gpt2")
    n = 24
    ids, mask = padded_batch(seed=2, batch=2, n=n)
    shapes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append((t.shape, t.dtype)) or t, lambda t: t):
        capture = capture_attention_gradients(model, ids, None, mask)
    maps = [(shape, dtype) for shape, dtype in shapes if len(shape) == 4 and shape[-2:] == (n, n)]
    assert maps and all(shape[1] == 1 for shape, _ in maps)
    assert len(capture.calls) == 3 and all(call.output.requires_grad for call in capture.calls)


def test_runs_under_no_grad_with_frozen_parameters():
    model = _with_head("bert")
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    ids, mask = padded_batch(seed=3, batch=2, n=6)
    expected = GradientWeightedRollout(model, lean=False).attribute(ids, target=1, attention_mask=mask)
    with torch.no_grad():
        ours = GradientWeightedRollout(model).attribute(ids, target=1, attention_mask=mask)
    assert torch.allclose(ours, expected, atol=1e-5)
    assert not any(p.requires_grad for p in model.parameters())


def test_lean_true_on_a_model_it_cannot_recompute_names_the_supported_types():
    model = transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=40, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4
    )).eval()
    assert not supports_attention_gradients(model) and supports_attention_gradients(make_tiny_model("bert"))
    with pytest.raises(ValueError, match="lean=True.*bert"):
        GradientWeightedRollout(model, lean=True).attribute(torch.tensor([[5, 6, 7]]), target=None)
