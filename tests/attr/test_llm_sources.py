"""Sources of a Captum TextTemplateInput through LLMAttentionAttribution: every method's source scores
are the explicit sums of its token scores over spans located by hand, Captum's LLMAttribution names
and shapes the result alike, and the span-sum and the boundary rule hold as properties."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from captum.attr import FeatureAblation, LLMAttribution, LLMAttributionResult, TextTemplateInput
from hypothesis import given, settings
from hypothesis import strategies as st
from helpers import make_lm
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

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
from captum_attnflow.attr import LLMAttentionAttributionResult
from captum_attnflow.attr.llm_inputs import sum_over_sources, template_prompt, token_sources
from captum_attnflow.models.language_model import build_lm_tokenizer

EVERY_METHOD = [RawAttention, AttentionRollout, AttentionFlow, GradientWeightedRollout, ValueZeroing, ALTI, AttentionNorm,
                AttnLRP]
# [CLS] the keys to the cabinet , my dog: each value's token columns, counted by hand
TEMPLATE, VALUES, TARGET = "{} to {} , {}", ["the keys", "the cabinet", "my dog"], "are ."
COLUMNS, OUTSIDE = [[1, 2], [4, 5], [7, 8]], [0, 3, 6]
CHAT = "{% for m in messages %}near {{ m['content'] | trim }} .{% endfor %}{% if add_generation_prompt %} that{% endif %}"


@pytest.fixture(scope="module")
def tokenizer():
    return build_lm_tokenizer()


@pytest.fixture(scope="module")
def gpt2(tokenizer):
    return make_lm("gpt2", len(tokenizer))


def _sums(scores: torch.Tensor, columns: list[list[int]]) -> torch.Tensor:
    """(n_out, n) -> (n_out, F): the explicit sum of each source's columns."""
    return torch.stack([sum(scores[:, j] for j in group) for group in columns], 1)


@pytest.mark.parametrize("method", EVERY_METHOD)
def test_every_method_scores_a_source_by_the_sum_of_its_tokens(gpt2, tokenizer, method):
    explainer = LLMAttentionAttribution(method(gpt2), tokenizer)
    inp = TextTemplateInput(TEMPLATE, values=VALUES)
    result = explainer.attribute(inp, target=TARGET)
    tokens = explainer.attribute(inp.to_model_input(), target=TARGET)
    assert isinstance(result, LLMAttentionAttributionResult) and result.inp is inp
    assert result.input_tokens == VALUES and result.output_tokens == tokens.output_tokens == ["are", "."]
    assert result.token_attr.shape == (2, 3) and result.seq_attr.shape == (3,)
    torch.testing.assert_close(result.token_attr, _sums(tokens.token_attr, COLUMNS))
    torch.testing.assert_close(result.seq_attr, _sums(tokens.token_attr, COLUMNS).mean(0))
    torch.testing.assert_close(result.template_attr, tokens.token_attr[:, OUTSIDE].sum(1))
    # nothing lost, nothing counted twice: sources + template = the prompt's whole score
    torch.testing.assert_close(result.token_attr.sum(1) + result.template_attr, tokens.token_attr.sum(1))
    for name in ("output_attr", "sink_attr"):
        torch.testing.assert_close(getattr(result, name), getattr(tokens, name))


def test_captum_names_and_shapes_the_result_alike(gpt2, tokenizer):
    ours = LLMAttentionAttribution(AttentionRollout(gpt2), tokenizer)
    captum = LLMAttribution(FeatureAblation(gpt2), tokenizer)
    cases = [
        TextTemplateInput(TEMPLATE, values=VALUES),
        TextTemplateInput("{b} to {a} , {c}", values={"a": "the keys", "b": "the cabinet", "c": "my dog"}),
        TextTemplateInput(TEMPLATE, values=VALUES, mask=[3, 1, 3]),
    ]
    for inp in cases:
        theirs, mine = captum.attribute(inp, target=TARGET, forward_in_tokens=False), ours.attribute(inp, target=TARGET)
        assert isinstance(theirs, LLMAttributionResult) and isinstance(mine, LLMAttributionResult)
        assert mine.input_tokens == theirs.input_tokens
        assert mine.token_attr.shape == theirs.token_attr.shape and mine.seq_attr.shape == theirs.seq_attr.shape
        if inp.mask is not None:  # Captum gives every value its group's score; so do we
            for result in (mine, theirs):
                torch.testing.assert_close(result.token_attr[:, 0], result.token_attr[:, 2])


def test_dict_values_repeated_fields_and_mask_groups(gpt2, tokenizer):
    explainer = LLMAttentionAttribution(AttentionRollout(gpt2), tokenizer)
    # [CLS] the cabinet to the keys , my dog: keys "a" (the keys) at 4-5, "b" at 1-2, "c" at 7-8
    values = {"a": "the keys", "b": "the cabinet", "c": "my dog"}
    tokens = explainer.attribute("the cabinet to the keys , my dog", target=TARGET).token_attr
    by_key = explainer.attribute(TextTemplateInput("{b} to {a} , {c}", values=values), target=TARGET)
    assert by_key.input_tokens == ["the keys", "the cabinet", "my dog"]  # the dict's order, as Captum's
    torch.testing.assert_close(by_key.token_attr, _sums(tokens, [[4, 5], [1, 2], [7, 8]]))
    grouped = explainer.attribute(
        TextTemplateInput("{b} to {a} , {c}", values=values, mask={"a": 7, "b": 2, "c": 7}), target=TARGET
    )
    keys_and_dog = _sums(tokens, [[4, 5, 7, 8]])[:, 0]
    for column, expected in zip(grouped.token_attr.T, [keys_and_dog, _sums(tokens, [[1, 2]])[:, 0], keys_and_dog]):
        torch.testing.assert_close(column, expected)
    torch.testing.assert_close(grouped.template_attr, tokens[:, [0, 3, 6]].sum(1))
    # a value written twice counts where it is written, both times; a template function is located alike
    tokens = explainer.attribute("the keys to the cabinet , the keys", target=TARGET).token_attr
    for template in ("{0} to {1} , {0}", lambda a, b: f"{a} to {b} , {a}"):
        twice = explainer.attribute(TextTemplateInput(template, values=["the keys", "the cabinet"]), target=TARGET)
        torch.testing.assert_close(twice.token_attr, _sums(tokens, [[1, 2, 7, 8], [4, 5]]))


def test_a_batch_of_templates_and_strings_gives_each_alone(gpt2, tokenizer):
    explainer = LLMAttentionAttribution(AttentionRollout(gpt2), tokenizer)
    prompts = [TextTemplateInput(TEMPLATE, values=VALUES), "the dog", TextTemplateInput("near {x}", values={"x": "the box"})]
    targets = [TARGET, "is", "are"]
    for side in ("left", "right"):
        batch = explainer.attribute(prompts, target=targets, padding_side=side)
        for prompt, target, result in zip(prompts, targets, batch):
            alone = explainer.attribute(prompt, target=target)
            assert result.input_tokens == alone.input_tokens
            torch.testing.assert_close(result.token_attr, alone.token_attr, atol=1e-5, rtol=1e-4)
    assert batch[1].template_attr is None and batch[2].input_tokens == ["the box"]


def test_options_apply_to_the_tokens_before_they_are_summed(gpt2, tokenizer):
    explainer = LLMAttentionAttribution(AttentionRollout(gpt2), tokenizer)
    inp = TextTemplateInput(TEMPLATE, values=VALUES)
    fair = explainer.attribute(inp, target=TARGET, receptive_field=True, head_fusion="max")
    tokens = explainer.attribute(inp.to_model_input(), target=TARGET, receptive_field=True, head_fusion="max")
    torch.testing.assert_close(fair.token_attr, _sums(tokens.token_attr, COLUMNS))
    generated = explainer.attribute(inp, max_new_tokens=3)
    assert generated.output_tokens == explainer.attribute(inp.to_model_input(), max_new_tokens=3).output_tokens


def test_encoder_decoder_sources(tokenizer):
    explainer = LLMAttentionAttribution(AttentionRollout(make_lm("t5", len(tokenizer))), tokenizer)
    inp = TextTemplateInput(TEMPLATE, values=VALUES)
    tokens = explainer.attribute(inp.to_model_input(), target=TARGET)
    result = explainer.attribute(inp, target=TARGET)
    torch.testing.assert_close(result.token_attr, _sums(tokens.token_attr, COLUMNS))
    torch.testing.assert_close(result.decoder_start_attr, tokens.decoder_start_attr)


def _chat_tokenizer(template: str = CHAT):
    tokenizer = build_lm_tokenizer()
    tokenizer.chat_template = template
    return tokenizer


def test_a_chat_template_is_applied_and_the_sources_found_in_it(gpt2):
    chat = _chat_tokenizer()
    inp = TextTemplateInput(" {} to {} ", values=["the keys", "the cabinet"])  # the template trims the message
    prompt = template_prompt(inp, chat)
    ids = chat.apply_chat_template([{"role": "user", "content": inp.to_model_input()}], add_generation_prompt=True,
                                   return_dict=False)
    assert prompt.ids.tolist() == ids  # no [CLS] added: the chat template writes the special tokens
    # near the keys to the cabinet . that
    assert chat.convert_ids_to_tokens(ids) == ["near", "the", "keys", "to", "the", "cabinet", ".", "that"]
    assert prompt.sources.tolist() == [-1, 0, 0, -1, 1, 1, -1, -1]
    method = AttentionRollout(gpt2)
    result = LLMAttentionAttribution(method, chat).attribute(inp, target=TARGET)
    full = torch.tensor([ids + chat.encode(TARGET, add_special_tokens=False)])
    rows = torch.stack([method.attribute(full, position=7 + t)[0, :8] for t in range(2)])
    torch.testing.assert_close(result.token_attr, _sums(rows, [[1, 2], [4, 5]]))
    # the first token is in a source here: drop_sink moves it to the template's share
    sinkless = LLMAttentionAttribution(method, _chat_tokenizer("{{ messages[0]['content'] }}")).attribute(inp, target=TARGET,
                                                                                                      drop_sink=True)
    plain = LLMAttentionAttribution(method, _chat_tokenizer("{{ messages[0]['content'] }}")).attribute(inp, target=TARGET)
    torch.testing.assert_close(sinkless.token_attr[:, 0] + sinkless.sink_attr, plain.token_attr[:, 0])
    torch.testing.assert_close(sinkless.template_attr, plain.template_attr + plain.sink_attr)


def test_a_token_across_a_boundary_goes_to_the_largest_share_ties_to_the_first(tokenizer):
    cases = [  # template, values, the token "keys" holds: (characters of the first, of the second)
        ("{}{} to", ["the ke", "ys"], 0),  # 2 and 2: a tie, to the first character's source
        ("{}{} to", ["the k", "eys"], 1),  # 1 and 3
        ("{}s to", ["the key"], 0),  # 3 in the source, 1 in the template
        ("ke{} to", ["ys"], -1),  # 2 and 2: a tie, the template's first
        ("k{} to", ["eys"], 0),
    ]
    for template, values, owner in cases:
        prompt = template_prompt(TextTemplateInput(template, values=values), tokenizer)
        tokens = tokenizer.convert_ids_to_tokens(prompt.ids.tolist())
        assert "keys" in tokens and prompt.sources[tokens.index("keys")].item() == owner, (template, values)
        assert prompt.sources[0].item() == -1  # [CLS], added by the tokenizer, has no characters


def test_byte_level_tokens_carry_their_space_into_the_source():
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(["the keys to the cabinet"] * 10, trainers.BpeTrainer(
        vocab_size=280, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    byte_level = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
    prompt = template_prompt(TextTemplateInput("{} {}", values=["the", "keys to"]), byte_level)
    assert byte_level.convert_ids_to_tokens(prompt.ids.tolist()) == ["the", "Ġkeys", "Ġto"]  # offsets 0-3, 3-8, 8-11
    assert prompt.sources.tolist() == [0, 1, 1]  # "Ġkeys": its space in the template, "keys" in the second value


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_sum_over_sources_equals_the_explicit_sums_and_keeps_the_total(data):
    n = data.draw(st.integers(0, 12))
    count = data.draw(st.integers(1, 5))
    sources = torch.tensor(data.draw(st.lists(st.integers(-1, count - 1), min_size=n, max_size=n)), dtype=torch.long)
    lead = data.draw(st.sampled_from([(), (3,), (2, 3)]))
    scores = torch.tensor(data.draw(st.lists(st.floats(-10, 10), min_size=int(np.prod(lead)) * n,
                                             max_size=int(np.prod(lead)) * n)), dtype=torch.float64).reshape(*lead, n)
    summed = sum_over_sources(scores, sources, count)
    assert summed.shape == (*lead, count)
    for f in range(count):
        expected = sum((scores[..., j] for j in range(n) if sources[j] == f), torch.zeros(lead, dtype=torch.float64))
        torch.testing.assert_close(summed[..., f], expected)
    outside = sum((scores[..., j] for j in range(n) if sources[j] < 0), torch.zeros(lead, dtype=torch.float64))
    torch.testing.assert_close(summed.sum(-1) + outside, scores.sum(-1))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_each_token_has_one_owner_the_largest_share_and_the_first_of_a_tie(data):
    owner = np.array(data.draw(st.lists(st.integers(-1, 3), min_size=1, max_size=30)))
    spans = data.draw(st.lists(st.tuples(st.integers(0, len(owner)), st.integers(0, 6)), max_size=10))
    offsets = [(start, min(start + width, len(owner))) for start, width in spans]
    assigned = token_sources(offsets, owner).tolist()
    assert len(assigned) == len(offsets)
    for (start, end), source in zip(offsets, assigned):
        characters = owner[start:end].tolist()
        if not characters:
            assert source == -1
            continue
        shares = {s: characters.count(s) for s in characters}
        best = max(shares.values())
        assert shares[source] == best
        assert characters.index(source) == min(characters.index(s) for s, c in shares.items() if c == best)


def test_the_result_is_saved_viewed_and_merged_on_its_output(gpt2, tokenizer, tmp_path):
    result = LLMAttentionAttribution(AttentionRollout(gpt2), tokenizer).attribute(
        TextTemplateInput(TEMPLATE, values=VALUES), target=TARGET
    )
    files = result.save(tmp_path / "sources")
    loaded = LLMAttentionAttributionResult.load(files[0])
    assert loaded == result and loaded.input_tokens == VALUES
    torch.testing.assert_close(loaded.template_attr, result.template_attr)
    page = result.to_html()
    assert page.count('class="caf-cell"') == 6 and 'data-token="the cabinet"' in page and "score of the source" in page
    words = result.aggregate_words(reduce="sum")  # the sources stay; "are" and "." are already words
    assert words.input_tokens == VALUES
    torch.testing.assert_close(words.token_attr, result.token_attr)
    torch.testing.assert_close(words.template_attr, result.template_attr)


def test_errors_name_the_fix(gpt2, tokenizer):
    explainer = LLMAttentionAttribution(AttentionRollout(gpt2), tokenizer)
    with pytest.raises(TypeError, match="TextTemplateInput, got int"):
        explainer.attribute(3, target=TARGET)
    for template in ("{!r} to {}", "{:.3} to {}"):
        with pytest.raises(ValueError, match="template changes them"):
            explainer.attribute(TextTemplateInput(template, values=VALUES[:2]), target=TARGET)
    with pytest.raises(ValueError, match="private-use"):
        explainer.attribute(TextTemplateInput("{} to", values=["the \ue001keys"]), target=TARGET)
    slow = LLMAttentionAttribution(AttentionRollout(gpt2), types.SimpleNamespace(is_fast=False))
    with pytest.raises(TypeError, match="needs a fast tokenizer"):
        slow.attribute(TextTemplateInput(TEMPLATE, values=VALUES), target=TARGET)
    shouting = LLMAttentionAttribution(AttentionRollout(gpt2), _chat_tokenizer("{{ messages[0]['content'] | upper }}"))
    with pytest.raises(ValueError, match="chat template rewrites the prompt"):
        shouting.attribute(TextTemplateInput(TEMPLATE, values=VALUES), target=TARGET)
    with pytest.raises(ValueError, match="the prompt is empty"):
        explainer.attribute(TextTemplateInput("{}", values=[""]), target=TARGET)
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        sum_over_sources(torch.zeros(2, 3), torch.zeros(4, dtype=torch.long), 2)
    with pytest.raises(ValueError, match=r"-1\.\.1"):
        sum_over_sources(torch.zeros(2, 3), torch.tensor([0, 2, -1]), 2)
