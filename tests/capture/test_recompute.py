"""Layer-wise recomputation (capture/recompute.py): AttnLRP and gradient-weighted rollout give the
same scores with and without it (float64, padded on either side, grouped-query heads, sliding
windows, contrastive, every layer), keep only the blocks' inputs for the backward pass, leave the
model as it was (also when the backward pass raises, also from several threads), and switch on
where a block's activations outweigh its weights."""

from __future__ import annotations

import threading

import pytest
import torch
import transformers
from families import DECODERS, FAMILIES, family_inputs, make_family_model
from helpers import model_state, padded_batch

from captum_attnflow import AttnLRP, GradientWeightedRollout
from captum_attnflow.attr.llm import LLMAttentionAttribution
from captum_attnflow.capture import recompute
from captum_attnflow.capture.attention_gradients import attention_gradients_run
from captum_attnflow.capture import recompute
from captum_attnflow.capture.recompute import ACTIVATION_WIDTHS, RECOMPUTE_FLOOR_BYTES, layerwise_recomputation, recomputes

TINY = dict(vocab_size=60, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
            num_hidden_layers=3, max_position_embeddings=64, initializer_range=0.2, pad_token_id=0)


def _decoder(kind: str) -> torch.nn.Module:
    """A tiny float64 causal LM: Llama (grouped-query heads), Mistral and Qwen2 with a sliding
    window of 4 (shorter than the inputs), GPT-2 (biases, absolute positions)."""
    torch.manual_seed(0)
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=60, n_embd=32, n_head=4, n_layer=3, n_positions=64, initializer_range=0.2,
                                         bos_token_id=0, eos_token_id=0)
    elif kind == "qwen2":
        config = transformers.Qwen2Config(use_sliding_window=True, sliding_window=4, max_window_layers=0, **TINY)
    elif kind == "mistral":
        config = transformers.MistralConfig(sliding_window=4, **TINY)
    else:
        config = transformers.LlamaConfig(**TINY)
    return transformers.AutoModelForCausalLM.from_config(config).double().eval()


def _both_sides(n: int = 9) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(ids, mask, two real positions per example) padded on the right, then on the left."""
    ids, mask = padded_batch(seed=3, batch=3, n=n)
    right = torch.stack([mask.sum(1) - 2, mask.sum(1) - 1], 1)
    return [(ids, mask, right), (ids.flip(1), mask.flip(1), torch.full((3, 2), n - 1) - torch.tensor([1, 0]))]


def _recomputations(monkeypatch) -> list[None]:
    """A list that grows by one at each block's recomputation."""
    seen: list[None] = []
    recomputed = recompute._recomputed
    monkeypatch.setattr(recompute, "_recomputed", lambda *args: seen.append(None) or recomputed(*args))
    return seen


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2", "gpt2"])
def test_the_same_scores_with_and_without_recomputation(kind, monkeypatch):
    model = _decoder(kind)
    before = model_state(model)
    seen = _recomputations(monkeypatch)
    target = torch.tensor([[7, 30], [52, 3], [11, 12]])
    for ids, mask, position in _both_sides():
        for method, options in ((AttnLRP, {}), (GradientWeightedRollout, {"layer": None})):
            expected = method(model, recompute=False).attribute(ids, attention_mask=mask, position=position,
                                                                 target=target, **options)
            count = len(seen)
            ours = method(model, recompute=True).attribute(ids, attention_mask=mask, position=position, target=target,
                                                           **options)
            assert len(seen) - count == 3 * 2  # every layer, in each position's backward pass
            torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0)
            assert expected.abs().amax() > 0.1
    assert model_state(model) == before
    assert not any("forward" in vars(module) for module in model.modules())


def test_through_the_language_model_wrapper_and_contrastive():
    model = _decoder("llama")
    tokenizer = _Tokenizer()
    for method in (AttnLRP, GradientWeightedRollout):
        results = [
            LLMAttentionAttribution(method(model, recompute=flag), tokenizer).attribute(
                ["t5 t9 t17 t3", "t8 t20"], target=["t30 t31", "t40"], contrast_target=["t7 t8", "t9"],
                padding_side="left",
            )
            for flag in (False, True)
        ]
        for expected, ours in zip(*results):
            torch.testing.assert_close(ours.token_attr, expected.token_attr, atol=1e-6, rtol=0)
            assert expected.token_attr.abs().amax() > 0.01


class _Tokenizer:
    """Words ``t<id>`` to ids, no special tokens: what the wrapper needs of a tokenizer."""

    padding_side = "right"
    pad_token_id = 0
    eos_token_id = 0

    def encode(self, text, add_special_tokens=True, return_tensors=None):
        ids = [int(word[1:]) for word in text.split()]
        return torch.tensor([ids]) if return_tensors == "pt" else ids

    def __call__(self, text, add_special_tokens=True, return_tensors=None):
        return {"input_ids": self.encode(text, return_tensors=return_tensors)}

    def convert_ids_to_tokens(self, ids):
        return [f"t{int(i)}" for i in ids]

    def decode(self, ids, **kwargs):
        return " ".join(self.convert_ids_to_tokens(ids))


@pytest.mark.parametrize("model_type", [t if t in ("qwen3_moe", "gemma3_text", "albert") else pytest.param(
    t, marks=pytest.mark.slow) for t in sorted(FAMILIES)])
def test_every_family_gives_the_same_scores(model_type):
    """Encoders and decoders of the architecture table, mixtures and Gemma's soft-capping included
    (float32: the mixtures' grouped products take no float64)."""
    model = make_family_model(model_type)
    # Decoders padded on the left; an encoder on the right, where its default position, 0 (CLS), is a real token.
    ids, mask = family_inputs("left" if model_type in DECODERS else "right")
    for method in (GradientWeightedRollout, AttnLRP):
        expected = method(model, recompute=False).attribute(ids, attention_mask=mask, target=1)
        ours = method(model, recompute=True).attribute(ids, attention_mask=mask, target=1)
        torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0)


def test_the_forward_keeps_only_the_blocks_inputs():
    """No tensor of the feed-forward's width is saved for the backward pass outside the
    recomputed blocks, and the gradient capture keeps no queries, keys or values."""
    model = _decoder("llama")
    ids, mask = padded_batch(seed=3, batch=3, n=9)
    for flag in (False, True):
        shapes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(t.shape) or t, lambda t: t):
            AttnLRP(model, recompute=flag).attribute(ids, attention_mask=mask)
        assert any(shape[-1] == 64 for shape in shapes) != flag  # the intermediate size
    with attention_gradients_run(model, ids, None, mask, recompute=True) as capture:
        assert all(c.scores.query.is_meta and c.scores.key.is_meta and c.value.is_meta for c in capture.calls)
        assert all(c.output is None for c in capture.calls)


def test_the_model_is_left_as_it_was_when_the_backward_pass_raises(monkeypatch):
    model = _decoder("gpt2")
    model.transformer.h[0].attn.c_attn.weight.requires_grad_(False)
    model.train()
    sentinel = model.transformer.h[1].forward  # an instance forward, as accelerate's hooks set one
    model.transformer.h[1].__dict__["forward"] = sentinel
    before = model_state(model)
    ids, mask = padded_batch(seed=3, batch=3, n=9)
    expected = AttnLRP(model, recompute=False).attribute(ids, attention_mask=mask)
    assert model_state(model) == before

    def failing(*args):
        raise RuntimeError("boom")

    for method in (AttnLRP, GradientWeightedRollout):
        with monkeypatch.context() as patch:
            patch.setattr(recompute, "_recomputed", failing)
            with pytest.raises(RuntimeError, match="boom"):
                method(model, recompute=True).attribute(ids, attention_mask=mask)
        assert model_state(model) == before and model.training
        assert model.transformer.h[1].__dict__["forward"] is sentinel
        assert not any("forward" in vars(m) for m in model.modules() if m is not model.transformer.h[1])
    torch.testing.assert_close(AttnLRP(model, recompute=True).attribute(ids, attention_mask=mask), expected,
                               atol=1e-6, rtol=0)


def test_under_no_grad_with_frozen_parameters():
    model = _decoder("llama")
    ids, mask = padded_batch(seed=3, batch=3, n=9)
    expected = {m: m(model, recompute=False).attribute(ids, attention_mask=mask) for m in (AttnLRP, GradientWeightedRollout)}
    model.requires_grad_(False)
    with torch.no_grad():
        for method, scores in expected.items():
            torch.testing.assert_close(method(model, recompute=True).attribute(ids, attention_mask=mask), scores,
                                       atol=1e-6, rtol=0)
    assert not any(p.requires_grad or p.grad is not None for p in model.parameters())


def test_calls_from_several_threads_run_one_at_a_time():
    model = _decoder("llama")
    ids, mask = padded_batch(seed=3, batch=3, n=9)
    expected = {m: m(model, recompute=False).attribute(ids, attention_mask=mask) for m in (AttnLRP, GradientWeightedRollout)}
    results, errors = [], []

    def work(method):
        try:
            results.append((method, method(model, recompute=True).attribute(ids, attention_mask=mask)))
        except Exception as error:  # noqa: BLE001  (reported below)
            errors.append(error)

    threads = [threading.Thread(target=work, args=(m,)) for m in (AttnLRP, GradientWeightedRollout) * 3]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(results) == 6
    for method, ours in results:
        torch.testing.assert_close(ours, expected[method], atol=1e-6, rtol=0)
    assert not any("forward" in vars(module) for module in model.modules())


def test_off_by_default_where_the_activations_are_small_whatever_the_weights():
    model = _decoder("llama")  # width 32, float64: a block's weights are outweighed from a few hundred tokens
    assert not recomputes(None, model, torch.zeros(1, 4096, dtype=torch.long), "AttnLRP")
    floor = RECOMPUTE_FLOOR_BYTES // (32 * ACTIVATION_WIDTHS * 8)
    assert not recomputes(None, model, torch.zeros(1, floor - 1, dtype=torch.long), "AttnLRP")
    assert recomputes(None, model, torch.zeros(1, floor, dtype=torch.long), "AttnLRP")
    assert not recomputes(None, model.float(), torch.zeros(1, floor, dtype=torch.long), "AttnLRP")  # 4 bytes a number


def test_on_by_default_where_the_activations_outweigh_a_block(monkeypatch):
    monkeypatch.setattr(recompute, "RECOMPUTE_FLOOR_BYTES", 0)  # the tiny model's activations are small
    model = _decoder("llama")
    weights = sum(p.numel() for p in model.model.layers[0].parameters())
    tokens = -(-weights // (32 * ACTIVATION_WIDTHS))  # the first B n with B n D w >= the block's weights
    assert not recomputes(None, model, torch.zeros(1, tokens - 1, dtype=torch.long), "AttnLRP")
    assert recomputes(None, model, torch.zeros(1, tokens, dtype=torch.long), "AttnLRP")
    assert recomputes(None, model, torch.zeros(tokens, 1, dtype=torch.long), "AttnLRP")  # B n tokens in all
    assert not recomputes(False, model, torch.zeros(1, 10 * tokens, dtype=torch.long), "AttnLRP")
    assert recomputes(True, model, torch.zeros(1, 2, dtype=torch.long), "AttnLRP")
    images = torch.zeros(1, 3, 16, 16)  # pixel values: their token count is the model's
    assert not recomputes(None, model, images, "AttnLRP")
    outside = transformers.XLNetModel(transformers.XLNetConfig(vocab_size=40, d_model=32, n_layer=2, n_head=4, d_inner=64))
    assert not recomputes(None, outside, torch.zeros(1, 10 * tokens, dtype=torch.long), "AttnLRP")
    with pytest.raises(ValueError, match="recompute=True"):
        recomputes(True, outside, torch.zeros(1, 2, dtype=torch.long), "GradientWeightedRollout")
    seen = _recomputations(monkeypatch)
    ids = torch.randint(5, 60, (1, tokens))
    for method in (AttnLRP, GradientWeightedRollout):
        method(model).attribute(ids[:, : tokens - 1], target=3)
        assert not seen
        method(model).attribute(ids, target=3)
        assert len(seen) == 3
        seen.clear()


def test_the_wrapper_restores_each_blocks_own_forward():
    blocks = [torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]
    own = lambda x: x  # noqa: E731
    blocks[1].__dict__["forward"] = own
    with layerwise_recomputation([blocks[0], blocks[1], blocks[0]]):
        assert "forward" in vars(blocks[0]) and vars(blocks[1])["forward"] is not own
    assert "forward" not in vars(blocks[0]) and vars(blocks[1])["forward"] is own
