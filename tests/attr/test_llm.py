"""LLMAttentionAttribution: rows equal the single-position attributions, on tiny GPT-2, Llama, T5 and BART."""

from __future__ import annotations

import importlib

import matplotlib
import pytest
import torch
import transformers
from captum.attr import LLMAttributionResult, TextTokenInput

from captum_attnflow import (
    ALTI,
    AttentionFlow,
    AttentionNorm,
    AttentionRollout,
    AttnLRP,
    GradientWeightedRollout,
    LLMAttentionAttribution,
    RawAttention,
    ValueZeroing,
)
from captum_attnflow.capture import seq2seq_attentions
from captum_attnflow.functional.encoder_decoder import (
    encoder_decoder_flow,
    encoder_decoder_raw_attention,
    encoder_decoder_rollout,
)
from captum_attnflow.models.language_model import build_lm_tokenizer
from helpers import make_lm

matplotlib.use("Agg")

METHODS = [RawAttention, AttentionRollout, AttentionFlow]
JOINT = {RawAttention: encoder_decoder_raw_attention, AttentionRollout: encoder_decoder_rollout,
         AttentionFlow: encoder_decoder_flow}
PROMPT, TARGET = "the keys to the cabinet", "are ."


@pytest.fixture(scope="module")
def tokenizer():
    return build_lm_tokenizer()


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def causal_lm(request, tokenizer):
    return make_lm(request.param, len(tokenizer))


@pytest.fixture(scope="module", params=["t5", "bart"])
def seq2seq(request, tokenizer):
    return make_lm(request.param, len(tokenizer))


@pytest.mark.parametrize("method", METHODS)
def test_causal_rows_are_the_single_position_attributions(causal_lm, tokenizer, method):
    result = LLMAttentionAttribution(method(causal_lm), tokenizer).attribute(PROMPT, target=TARGET, layer=2)
    ids = tokenizer(f"{PROMPT} {TARGET}", return_tensors="pt")["input_ids"]
    n_in = len(tokenizer(PROMPT)["input_ids"])
    assert isinstance(result, LLMAttributionResult)
    assert result.input_tokens == tokenizer.convert_ids_to_tokens(ids[0, :n_in])
    assert result.output_tokens == ["are", "."]
    for t in range(2):
        single = method(causal_lm).attribute(ids, position=n_in - 1 + t, layer=2)[0]
        torch.testing.assert_close(result.token_attr[t], single[:n_in])
        torch.testing.assert_close(result.output_attr[t], single[n_in:])
    assert result.output_attr[0].abs().max() == 0  # the first output token sees only the prompt
    torch.testing.assert_close(result.seq_attr, result.token_attr.mean(0))
    torch.testing.assert_close(result.sink_attr, result.token_attr[:, 0])
    assert result.decoder_start_attr is None


def test_one_forward_pass_for_all_output_tokens(tokenizer):
    model = make_lm("gpt2", len(tokenizer))
    calls = []
    handle = model.transformer.register_forward_hook(lambda *args: calls.append(1))  # the layers run once
    try:
        LLMAttentionAttribution(AttentionRollout(model), tokenizer).attribute(PROMPT, target="are . that the")
    finally:
        handle.remove()
    assert len(calls) == 1


@pytest.mark.parametrize(("arch", "side"), [("gpt2", "right"), ("llama", "left"), ("mistral", "left")])
def test_the_papers_methods_run_lean_and_equal_the_stored_path(arch, side, tokenizer, monkeypatch):
    """Raw attention, rollout and flow on the lean capture (no eager maps; raw and rollout never
    build a whole layer) equal the stored maps: every head fusion, residual, receptive field, sink,
    GQA, a sliding window, a batch of prompts of different lengths padded on either side."""
    capture = importlib.import_module("captum_attnflow.capture.maps")
    graph = importlib.import_module("captum_attnflow.functional.graph")
    model = make_lm(arch, len(tokenizer))
    prompts, targets = [PROMPT, "a dog", "near the boxes , my dog"], [TARGET, "is", "are . that"]
    cases = [(RawAttention, "mean", 1.0, {}), (RawAttention, "max", 0.5, {"receptive_field": True}),
             (AttentionRollout, "mean", 0.5, {"drop_sink": True}), (AttentionRollout, "min", 0.8, {}),
             (AttentionRollout, "max", 0.3, {"receptive_field": True}), (AttentionFlow, "mean", 0.5, {}),
             (AttentionFlow, "max", 0.6, {"drop_sink": True})]
    for method, fusion, alpha, options in cases:
        for layer in (-1, 1) if method is AttentionRollout else (-1,):
            stored = LLMAttentionAttribution(method(model, lean=False), tokenizer).attribute(
                prompts, target=targets, layer=layer, padding_side=side, head_fusion=fusion, residual_alpha=alpha, **options
            )
            with monkeypatch.context() as patched:
                patched.setattr(capture, "extract_attentions", lambda *args: pytest.fail("eager maps were stored"))
                if method is not AttentionFlow:
                    patched.setattr(graph.AttentionGraph, "layer", lambda *args, **kw: pytest.fail("a layer was built"))
                lean = LLMAttentionAttribution(method(model), tokenizer).attribute(
                    prompts, target=targets, layer=layer, padding_side=side, head_fusion=fusion, residual_alpha=alpha,
                    **options,
                )
            for a, b in zip(lean, stored):
                assert a.input_tokens == b.input_tokens and a.output_tokens == b.output_tokens
                for name in ("token_attr", "output_attr", "sink_attr"):
                    torch.testing.assert_close(getattr(a, name), getattr(b, name), atol=1e-6, rtol=0)


@pytest.mark.parametrize("method", [AttentionRollout, AttentionFlow])
def test_generated_and_given_target_agree(causal_lm, tokenizer, method):
    explainer = LLMAttentionAttribution(method(causal_lm), tokenizer)
    generated = explainer.attribute(PROMPT, max_new_tokens=4)
    assert len(generated.output_tokens) == 4
    target = torch.tensor(tokenizer.convert_tokens_to_ids(generated.output_tokens))
    given = explainer.attribute(PROMPT, target=target)
    assert given.output_tokens == generated.output_tokens
    torch.testing.assert_close(given.token_attr, generated.token_attr)
    torch.testing.assert_close(given.output_attr, generated.output_attr)


@pytest.mark.parametrize("method", METHODS)
def test_left_and_right_padding_give_the_rows_of_each_prompt_alone(causal_lm, tokenizer, method):
    explainer = LLMAttentionAttribution(method(causal_lm), tokenizer)
    prompts, targets = [PROMPT, "a dog", "near the boxes , my dog"], [TARGET, "is", "is"]
    left = explainer.attribute(prompts, target=targets, padding_side="left")
    right = explainer.attribute(prompts, target=targets, padding_side="right")
    for prompt, target, a, b in zip(prompts, targets, left, right):
        alone = explainer.attribute(prompt, target=target)
        for result in (a, b):
            assert result.input_tokens == alone.input_tokens and result.output_tokens == alone.output_tokens
            torch.testing.assert_close(result.token_attr, alone.token_attr, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(result.output_attr, alone.output_attr, atol=1e-5, rtol=1e-4)


def test_model_is_unchanged_afterwards(tokenizer):
    model = make_lm("llama", len(tokenizer))
    model.train()
    model.lm_head.weight.requires_grad_(False)
    hooks = {name: dict(module._forward_hooks) for name, module in model.named_modules()}
    # generation and the one forward pass are shared by the three methods
    LLMAttentionAttribution(AttentionFlow(model), tokenizer).attribute(PROMPT, max_new_tokens=2)
    assert model.training and all(module.training for module in model.modules())
    assert model.config._attn_implementation == "sdpa" and not model.lm_head.weight.requires_grad
    assert {name: dict(module._forward_hooks) for name, module in model.named_modules()} == hooks


def test_receptive_field_divides_by_the_positions_that_see_each_token(tokenizer):
    model = make_lm("gpt2", len(tokenizer))
    explainer = LLMAttentionAttribution(AttentionRollout(model), tokenizer)
    plain = explainer.attribute(PROMPT, target=TARGET)
    fair = explainer.attribute(PROMPT, target=TARGET, receptive_field=True)
    n_in = 6  # [CLS] the keys to the cabinet
    for t in range(2):
        p = n_in - 1 + t  # the predicting position sees tokens 0..p; token j is seen by positions j..p
        for j in range(n_in):
            assert fair.token_attr[t, j].item() == pytest.approx(plain.token_attr[t, j].item() / (p - j + 1))
    assert fair.output_attr[1, 0].item() == pytest.approx(plain.output_attr[1, 0].item())  # j = p: seen once


def test_sink_is_dropped_or_reported(tokenizer):
    model = make_lm("gpt2", len(tokenizer))
    explainer = LLMAttentionAttribution(AttentionRollout(model), tokenizer)
    kept = explainer.attribute(PROMPT, target=TARGET)
    dropped = explainer.attribute(PROMPT, target=TARGET, drop_sink=True)
    assert dropped.input_tokens == kept.input_tokens[1:] == ["the", "keys", "to", "the", "cabinet"]
    torch.testing.assert_close(dropped.token_attr, kept.token_attr[:, 1:])
    torch.testing.assert_close(dropped.sink_attr, kept.token_attr[:, 0])
    torch.testing.assert_close(dropped.seq_attr, kept.token_attr[:, 1:].mean(0))


def test_text_token_input_skip_tokens_leave_columns_out(tokenizer):
    model = make_lm("gpt2", len(tokenizer))
    explainer = LLMAttentionAttribution(RawAttention(model), tokenizer)
    full = explainer.attribute(PROMPT, target=TARGET)
    text = TextTokenInput(PROMPT, tokenizer, skip_tokens=["the"])
    skipped = explainer.attribute(text, target=TARGET)
    assert skipped.input_tokens == ["[CLS]", "keys", "to", "cabinet"]
    torch.testing.assert_close(skipped.token_attr, full.token_attr[:, [0, 2, 3, 5]])
    both = explainer.attribute(text, target=TARGET, drop_sink=True)
    assert both.input_tokens == ["keys", "to", "cabinet"] and bool(text.itp_mask[0, 0])  # the input is not modified


@pytest.mark.parametrize("method", METHODS)
def test_encoder_decoder_rows_are_the_joint_graph_rows_of_each_decoder_position(seq2seq, tokenizer, method):
    result = LLMAttentionAttribution(method(seq2seq), tokenizer).attribute(PROMPT, target="are . that")
    source = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    start = seq2seq.config.decoder_start_token_id
    outputs = tokenizer.convert_tokens_to_ids(["are", ".", "that"])
    decoder = torch.tensor([[start, *outputs[:-1]]])
    n_in = source.shape[1]
    for t in range(3):
        # position t alone: the decoder run on its inputs up to t (causal, so the maps agree)
        maps = seq2seq_attentions(seq2seq, source, decoder[:, : t + 1])
        row = JOINT[method](maps.encoder, maps.decoder, maps.cross, layer=-1)[0, t]
        torch.testing.assert_close(result.token_attr[t], row[:n_in], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(result.decoder_start_attr[t], row[n_in])
        torch.testing.assert_close(result.output_attr[t, :t], row[n_in + 1 :], atol=1e-5, rtol=1e-4)
        assert result.output_attr[t, t:].abs().max() == 0


def test_encoder_decoder_generation_and_padding_agree(seq2seq, tokenizer):
    explainer = LLMAttentionAttribution(AttentionRollout(seq2seq), tokenizer)
    generated = explainer.attribute(PROMPT, max_new_tokens=3)
    target = torch.tensor(tokenizer.convert_tokens_to_ids(generated.output_tokens))
    given = explainer.attribute(PROMPT, target=target)
    torch.testing.assert_close(given.token_attr, generated.token_attr)
    batch = explainer.attribute(["a dog", PROMPT], target=["is", TARGET])
    torch.testing.assert_close(batch[0].token_attr, explainer.attribute("a dog", target="is").token_attr)
    torch.testing.assert_close(batch[1].token_attr, explainer.attribute(PROMPT, target=TARGET).token_attr)
    rows = given.token_attr.sum(1) + given.output_attr.sum(1) + given.decoder_start_attr
    torch.testing.assert_close(rows, torch.ones(len(rows)))


def test_captum_plots_the_result(tokenizer):
    model = make_lm("gpt2", len(tokenizer))
    result = LLMAttentionAttribution(AttentionFlow(model), tokenizer).attribute(PROMPT, target=TARGET)
    fig, ax = result.plot_token_attr()
    assert [label.get_text() for label in ax.get_yticklabels()] == ["are", "."]
    fig, ax = result.plot_seq_attr()
    matplotlib.pyplot.close("all")


def test_errors_name_the_fix(tokenizer):
    model = make_lm("gpt2", len(tokenizer))
    with pytest.raises(TypeError, match="captum.attr.LLMAttribution"):
        LLMAttentionAttribution(object(), tokenizer)
    with pytest.raises(TypeError, match="causal LM"):
        LLMAttentionAttribution(AttentionRollout(model.transformer), tokenizer)
    explainer = LLMAttentionAttribution(AttentionRollout(model), tokenizer)
    with pytest.raises(ValueError, match="non-empty target"):
        explainer.attribute(PROMPT, target="")
    with pytest.raises(ValueError, match="one target"):
        explainer.attribute([PROMPT, "a dog"], target=["is"])
    with pytest.raises(TypeError, match="one layer"):
        explainer.attribute(PROMPT, target=TARGET, layer=None)
    t5 = LLMAttentionAttribution(AttentionRollout(make_lm("t5", len(tokenizer))), tokenizer)
    with pytest.raises(ValueError, match="decoder-only"):
        t5.attribute(PROMPT, target=TARGET, receptive_field=True)
    with pytest.raises(TypeError, match="head_fusion, residual_alpha, show_progress"):
        t5.attribute(PROMPT, target=TARGET, normalize=True)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_input_errors_name_the_problem(arch, tokenizer):
    explainer = LLMAttentionAttribution(AttentionRollout(make_lm(arch, len(tokenizer))), tokenizer)  # 64 positions
    with pytest.raises(ValueError, match=f"token id {len(tokenizer) + 5} is outside the model's vocabulary"):
        explainer.attribute(PROMPT, target=torch.tensor([len(tokenizer) + 5]))
    with pytest.raises(ValueError, match="token ids must be >= 0"):
        explainer.attribute(PROMPT, target=torch.tensor([-1]))
    with pytest.raises(TypeError, match="integer token ids, got dtype torch.float32"):
        explainer.attribute(PROMPT, target=torch.tensor([1.0]))
    with pytest.raises(ValueError, match="1-D token ids"):
        explainer.attribute(PROMPT, target=torch.tensor([[1]]))
    with pytest.raises(ValueError, match="the prompt has 71 tokens but .* 64 positions"):
        explainer.attribute(" ".join(["the"] * 70), target="are")
    with pytest.raises(ValueError, match="prompt and target have 61 \\+ 10 tokens but .* 64 positions"):
        explainer.attribute(" ".join(["the"] * 60), target=" ".join(["are"] * 10))
    for empty in ["", "[CLS]", "[CLS] [PAD]"]:
        with pytest.raises(ValueError, match="the prompt is empty"):
            explainer.attribute(empty, target="are")
        with pytest.raises(ValueError, match="the prompt is empty"):
            explainer.attribute([PROMPT, empty])


def test_generation_stops_at_the_last_position(tokenizer):
    explainer = LLMAttentionAttribution(AttentionRollout(make_lm("gpt2", len(tokenizer))), tokenizer)
    result = explainer.attribute(" ".join(["the"] * 60), max_new_tokens=25)  # 61 prompt tokens, 64 positions
    assert 1 <= len(result.output_tokens) <= 3


def test_encoder_decoder_positions_are_checked(tokenizer):
    bart = LLMAttentionAttribution(AttentionRollout(make_lm("bart", len(tokenizer))), tokenizer)  # 32 positions
    with pytest.raises(ValueError, match="the prompt has 41 tokens but BartForConditionalGeneration has 32 positions"):
        bart.attribute(" ".join(["the"] * 40), target="are")
    with pytest.raises(ValueError, match="the target has 33 tokens but BartForConditionalGeneration has 32 positions"):
        bart.attribute(PROMPT, target=" ".join(["are"] * 33))
    assert len(bart.attribute(" ".join(["the"] * 31), target=" ".join(["are"] * 32)).output_tokens) == 32
    t5 = LLMAttentionAttribution(AttentionRollout(make_lm("t5", len(tokenizer))), tokenizer)  # relative positions
    assert len(t5.attribute(" ".join(["the"] * 80), target="are").input_tokens) == 81


def test_flow_rows_come_from_one_kernel_call_on_one_graph(tokenizer, monkeypatch):
    maxflow = importlib.import_module("captum_attnflow.functional._maxflow")  # flow() imports max_flows from it per call
    model = make_lm("gpt2", len(tokenizer))
    calls = []
    kernel = maxflow.max_flows
    monkeypatch.setattr(
        maxflow, "max_flows", lambda cap, sources, *args: calls.append(sources) or kernel(cap, sources, *args)
    )
    target = "are . that the keys"
    result = LLMAttentionAttribution(AttentionFlow(model), tokenizer).attribute(PROMPT, target=target, show_progress=True)
    n_in = len(tokenizer(PROMPT)["input_ids"])
    assert len(calls) == 1 and list(calls[0]) == list(range(n_in - 1, n_in + 4))
    monkeypatch.setattr(maxflow, "max_flows", kernel)
    ids = tokenizer(f"{PROMPT} {target}", return_tensors="pt")["input_ids"]
    for t in range(5):  # one flow call per output token gives the same rows
        single = AttentionFlow(model).attribute(ids, position=n_in - 1 + t)[0]
        torch.testing.assert_close(result.token_attr[t], single[:n_in])
        torch.testing.assert_close(result.output_attr[t], single[n_in:])


@pytest.mark.parametrize("method", [GradientWeightedRollout, ALTI, ValueZeroing, AttentionNorm])
def test_newer_methods_rows_are_their_single_position_attributions(causal_lm, tokenizer, method):
    explainer = LLMAttentionAttribution(method(causal_lm), tokenizer)
    result = explainer.attribute(PROMPT, target="are . that", layer=-1)
    ids = tokenizer(f"{PROMPT} are . that", return_tensors="pt")["input_ids"]
    n_in = len(tokenizer(PROMPT)["input_ids"])
    for t in range(3):  # each written token explained for its own logit (gradients: batched backward)
        target = {"target": ids[:, n_in + t]} if method is GradientWeightedRollout else {}
        single = method(causal_lm).attribute(ids, position=n_in - 1 + t, **target)[0]
        torch.testing.assert_close(result.token_attr[t], single[:n_in], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(result.output_attr[t], single[n_in:], atol=1e-5, rtol=1e-4)
    padded = explainer.attribute([PROMPT, "a dog"], target=["are . that", "is"], padding_side="left")
    torch.testing.assert_close(padded[0].token_attr, result.token_attr, atol=1e-5, rtol=1e-4)


def test_gradient_weighted_rollout_of_an_encoder_decoder(seq2seq, tokenizer):
    method = GradientWeightedRollout(seq2seq)
    result = LLMAttentionAttribution(method, tokenizer).attribute(PROMPT, target=TARGET)
    source = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    written = torch.tensor([tokenizer.convert_tokens_to_ids(result.output_tokens)])
    start = seq2seq.config.decoder_start_token_id
    decoder = torch.cat([torch.tensor([[start]]), written[:, :-1]], 1)
    rows = method.encoder_decoder_rows(source, decoder, written)[0]
    torch.testing.assert_close(result.token_attr, rows[:, : source.shape[1]])


@pytest.mark.parametrize("method", [ALTI, ValueZeroing, AttentionNorm, AttnLRP])
def test_every_method_explains_an_encoder_decoder_through_the_wrapper(seq2seq, tokenizer, method):
    """The wrapper's rows are the method's own encoder_decoder_rows: source tokens in token_attr,
    the start token and the earlier outputs in decoder_start_attr and output_attr, their sums the
    source and target shares (ALTI+'s, summing to 1)."""
    result = LLMAttentionAttribution(method(seq2seq), tokenizer).attribute(PROMPT, target="are . that", layer=-1)
    source = tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    written = torch.tensor([tokenizer.convert_tokens_to_ids(["are", ".", "that"])])
    decoder = torch.cat([torch.tensor([[seq2seq.config.decoder_start_token_id]]), written[:, :-1]], 1)
    target = (written,) if method is AttnLRP else ()
    rows = method(seq2seq).encoder_decoder_rows(source, decoder, *target, -1)[0]
    n_in = source.shape[1]
    torch.testing.assert_close(result.token_attr, rows[:, :n_in])
    torch.testing.assert_close(result.decoder_start_attr, rows[:, n_in])
    torch.testing.assert_close(result.output_attr[:, :2], rows[:, n_in + 1 :])
    torch.testing.assert_close(result.source_share, rows[:, :n_in].sum(-1))
    torch.testing.assert_close(result.target_share, rows[:, n_in:].sum(-1))
    assert result.decoder_start_token == tokenizer.convert_ids_to_tokens(seq2seq.config.decoder_start_token_id)
    if method in (ALTI, ValueZeroing):
        torch.testing.assert_close(result.source_share + result.target_share, torch.ones(3))


ALL_METHODS = [RawAttention, AttentionRollout, AttentionFlow, GradientWeightedRollout, ValueZeroing, ALTI, AttentionNorm]


@pytest.mark.parametrize("method", ALL_METHODS)
def test_every_method_takes_show_progress_through_the_wrapper(tokenizer, method, capsys):
    model = make_lm("gpt2", len(tokenizer))
    explainer = LLMAttentionAttribution(method(model), tokenizer)
    quiet = explainer.attribute(PROMPT, target=TARGET, show_progress=False)
    assert not capsys.readouterr().err
    shown = explainer.attribute(PROMPT, target=TARGET, show_progress=True)
    assert capsys.readouterr().err  # tqdm writes its bar to stderr
    torch.testing.assert_close(shown.token_attr, quiet.token_attr)
    with pytest.raises(TypeError, match=f"{method.__name__} through LLMAttentionAttribution takes no bogus.*show_progress"):
        explainer.attribute(PROMPT, target=TARGET, bogus=1)


@pytest.mark.parametrize("method", [AttentionFlow, GradientWeightedRollout, AttentionRollout])
def test_encoder_decoder_takes_show_progress(tokenizer, method, capsys):
    explainer = LLMAttentionAttribution(method(make_lm("t5", len(tokenizer))), tokenizer)
    quiet = explainer.attribute(PROMPT, target=TARGET, show_progress=False)
    shown = explainer.attribute(PROMPT, target=TARGET, show_progress=True)
    assert bool(capsys.readouterr().err) == (method is not AttentionRollout)  # rollout's products take no time
    torch.testing.assert_close(shown.token_attr, quiet.token_attr)
