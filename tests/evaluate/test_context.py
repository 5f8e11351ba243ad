"""Context attribution metrics: the ablated prompts' log-probabilities against one forward pass per
prompt formatted by hand, the top-k drop, LDS against scipy, gold precision and recall against
every tie-breaking order, and their leaderboard."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import transformers
from captum.attr import TextTemplateInput
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from torch import nn

from captum_attnflow.evaluate import (
    Leaderboard,
    ResponseLogProb,
    ablation_masks,
    context_leaderboard,
    context_metrics,
    lds,
    precision_at_1,
    recall_at_k,
    response_log_probs,
    source_scores,
    top_k_drop,
)
from captum_attnflow.evaluate.context import top_k_masks
from captum_attnflow.evaluate.context_ablation import encode_prompt
from captum_attnflow.models.language_model import build_lm_tokenizer

TEMPLATE = "{} {} near {} {}"
SOURCES = ["the keys", "to the old cabinet", "the door", "of the big houses"]
RESPONSE = "are ."
# Every subset of the four sources once, and the full prompt twice: prompts of many lengths.
KEEP = torch.tensor(list(itertools.product([True, False], repeat=4)) + [[True] * 4])
CHAT = "{% for m in messages %}[CLS] {{ m['content'] }}{% endfor %}{% if add_generation_prompt %} that{% endif %}"


@pytest.fixture(scope="module")
def tokenizer():
    return build_lm_tokenizer()


def make_lm(arch: str, vocab: int) -> nn.Module:
    torch.manual_seed(0)
    if arch == "gpt2":
        config = transformers.GPT2Config(vocab_size=vocab, n_embd=32, n_head=4, n_layer=2, n_positions=64,
                                         bos_token_id=2, eos_token_id=3, pad_token_id=0)
        return transformers.GPT2LMHeadModel(config).eval()
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                      intermediate_size=64, num_hidden_layers=2, max_position_embeddings=64,
                                      bos_token_id=2, eos_token_id=3, pad_token_id=0)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def lm(request, tokenizer):
    return make_lm(request.param, len(tokenizer))


def reference_log_prob(model, prompt_ids: list[int], response_ids: list[int]) -> float:
    """The response's log-probability from one unpadded forward pass of prompt + response."""
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        log_probs = torch.log_softmax(model(ids).logits[0].double(), -1)
    start = len(prompt_ids) - 1
    return sum(float(log_probs[start + t, token]) for t, token in enumerate(response_ids))


def formatted(keep, sources=SOURCES, template=TEMPLATE) -> str:
    """The prompt written out by hand: an ablated source is the empty string."""
    return template.format(*(source if kept else "" for source, kept in zip(sources, keep)))


def test_batched_log_probs_equal_one_forward_pass_per_prompt(lm, tokenizer):
    prompt = TextTemplateInput(TEMPLATE, values=SOURCES)
    response = tokenizer.encode(RESPONSE, add_special_tokens=False)
    values = response_log_probs(lm, tokenizer, prompt, RESPONSE, KEEP, batch_size=3)
    reference = [reference_log_prob(lm, tokenizer(formatted(row.tolist()))["input_ids"], response) for row in KEEP]
    assert values.dtype == torch.float64 and values.shape == (len(KEEP),)
    assert len({len(tokenizer(formatted(row.tolist()))["input_ids"]) for row in KEEP}) > 3  # padding in every batch
    torch.testing.assert_close(values, torch.tensor(reference, dtype=torch.float64), rtol=0, atol=1e-5)
    unbatched = response_log_probs(lm, tokenizer, prompt, torch.tensor(response), KEEP, batch_size=1)
    torch.testing.assert_close(values, unbatched, rtol=0, atol=1e-5)


def test_the_chat_template_wraps_the_prompt(tokenizer):
    chat = build_lm_tokenizer()
    chat.chat_template = CHAT
    model = make_lm("gpt2", len(chat))
    prompt = TextTemplateInput(TEMPLATE, values=SOURCES)
    response = chat.encode(RESPONSE, add_special_tokens=False)
    keep = KEEP[[0, 5, 12]]
    templated = [chat.encode(f"[CLS] {formatted(row.tolist())} that", add_special_tokens=False) for row in keep]
    assert encode_prompt(chat, formatted([True] * 4)) == templated[0]
    assert chat.convert_ids_to_tokens(templated[0])[0] == "[CLS]" and templated[0].count(chat.cls_token_id) == 1
    values = response_log_probs(model, chat, prompt, RESPONSE, keep)
    torch.testing.assert_close(values, torch.tensor([reference_log_prob(model, ids, response) for ids in templated],
                                                    dtype=torch.float64), rtol=0, atol=1e-5)
    plain = response_log_probs(model, chat, prompt, RESPONSE, keep, apply_chat_template=False)
    torch.testing.assert_close(plain, response_log_probs(model, tokenizer, prompt, RESPONSE, keep), rtol=0, atol=0)
    assert not torch.allclose(plain, values)


def test_baselines_and_mask_groups_follow_captum(lm, tokenizer):
    baselines = ["the key", "", "a door", ""]
    prompt = TextTemplateInput(TEMPLATE, values=SOURCES, baselines=baselines, mask=[4, 9, 4, 2])
    keep = torch.tensor([[True, False, True], [False, True, True], [True, True, False]])
    response = tokenizer.encode(RESPONSE, add_special_tokens=False)
    groups = prompt.formatted_mask  # the feature of each value, as Captum orders them
    texts = [TEMPLATE.format(*(value if row[groups[i]] else baselines[i] for i, value in enumerate(SOURCES))) for row in keep]
    assert {"a door" in text for text in texts} == {True, False}  # the third value, at its baseline or not
    reference = [reference_log_prob(lm, tokenizer(text)["input_ids"], response) for text in texts]
    torch.testing.assert_close(response_log_probs(lm, tokenizer, prompt, RESPONSE, keep),
                               torch.tensor(reference, dtype=torch.float64), rtol=0, atol=1e-5)


def test_a_mask_is_run_once(tokenizer):
    model = make_lm("gpt2", len(tokenizer))
    rows = []
    model.register_forward_hook(lambda module, args, kwargs, output: rows.append(kwargs["input_ids"].shape[0]),
                                with_kwargs=True)
    log_prob = ResponseLogProb(model, tokenizer, TextTemplateInput(TEMPLATE, values=SOURCES), RESPONSE, batch_size=4)
    first = log_prob(KEEP[:6])
    assert rows == [4, 2]
    again = log_prob(torch.cat([KEEP[[5, 4]], KEEP[6:8]]).int())  # two masks run before, two new, as 0/1
    assert rows == [4, 2, 2]
    assert again[:2].tolist() == first[[5, 4]].tolist()
    assert log_prob(KEEP[[-1]]).tolist() == first[[0]].tolist()  # the full prompt, scored first
    assert rows == [4, 2, 2]


def test_refuses_what_it_cannot_score(tokenizer):
    model = make_lm("gpt2", len(tokenizer))
    prompt = TextTemplateInput(TEMPLATE, values=SOURCES)
    with pytest.raises(TypeError, match="TextTemplateInput"):
        ResponseLogProb(model, tokenizer, formatted([True] * 4), RESPONSE)
    with pytest.raises(ValueError, match="no tokens"):
        ResponseLogProb(model, tokenizer, prompt, "")
    with pytest.raises(TypeError, match="integer token ids"):
        ResponseLogProb(model, tokenizer, prompt, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="batch_size"):
        ResponseLogProb(model, tokenizer, prompt, RESPONSE, batch_size=0)
    log_prob = ResponseLogProb(model, tokenizer, prompt, RESPONSE)
    with pytest.raises(ValueError, match=r"F = 4 features"):
        log_prob(torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="booleans"):
        log_prob(torch.full((1, 4), 2))
    bare = build_lm_tokenizer()
    bare.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # no beginning-of-sequence token
    with pytest.raises(ValueError, match=r"sources \[0\] ablated has no token"):
        ResponseLogProb(model, bare, TextTemplateInput("{}", values=["the keys"]), RESPONSE)(torch.zeros(1, 1))


def lookup(table: dict):
    """A "model" scoring each mask from a table keyed by its 0/1 tuple, counting its calls."""

    def forward(keep):
        forward.calls.append(keep.clone())
        return torch.tensor([table[tuple(row.int().tolist())] for row in keep], dtype=torch.float64)

    forward.calls = []
    return forward


def test_top_k_drop_by_hand():
    values = {row: float(np.random.default_rng(sum(row) * 7 + row[0]).normal()) for row in itertools.product([0, 1], repeat=4)}
    forward = lookup(values)
    # a tie between sources 1 and 3: the earlier one is removed first
    drops = top_k_drop(forward, torch.tensor([0.2, 0.9, 0.5, 0.9]), ks=[1, 2, 3, 4, 5])
    full = values[(1, 1, 1, 1)]
    expected = [full - values[(1, 0, 1, 1)], full - values[(1, 0, 1, 0)], full - values[(1, 0, 0, 0)],
                full - values[(0, 0, 0, 0)], math.nan]
    torch.testing.assert_close(drops, torch.tensor(expected, dtype=torch.float64), equal_nan=True)
    assert len(forward.calls) == 1  # the full prompt and every k in one call
    assert top_k_masks([0.9, 0.9, 0.9], ks=[1, 2]).int().tolist() == [[0, 1, 1], [0, 0, 1]]


def test_top_k_drop_on_a_model(lm, tokenizer):
    prompt = TextTemplateInput(TEMPLATE, values=SOURCES)
    response = tokenizer.encode(RESPONSE, add_special_tokens=False)
    drops = top_k_drop(ResponseLogProb(lm, tokenizer, prompt, RESPONSE), [0.1, -2.0, 3.0, 0.5], ks=[1, 3])

    def reference(keep):
        return reference_log_prob(lm, tokenizer(formatted(keep))["input_ids"], response)

    full = reference([True] * 4)
    expected = [full - reference([True, True, False, True]), full - reference([False, True, False, False])]
    torch.testing.assert_close(drops, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-5)


@pytest.mark.parametrize("scores", [[0.1, math.nan, 0.3], [[0.1, 0.2]], []])
def test_scores_must_be_one_defined_score_per_source(scores):
    with pytest.raises(ValueError, match="NaN|one score per source"):
        top_k_drop(lookup({}), torch.tensor(scores))
    with pytest.raises(ValueError, match="NaN|one score per source"):
        precision_at_1(torch.tensor(scores), 0)


def test_ks_gold_and_keep_are_checked():
    with pytest.raises(ValueError, match="positive ints"):
        top_k_masks([0.1, 0.2], ks=[0])
    with pytest.raises(ValueError, match="positive ints"):
        recall_at_k([0.1, 0.2], 0, k=1.5)
    for gold in (2, -1, [0, 0], [], 0.5):
        with pytest.raises(ValueError, match="gold"):
            precision_at_1([0.1, 0.2], gold)
    with pytest.raises(ValueError, match="F = 2"):
        lds(None, [0.1, 0.2], keep=torch.ones(3, 3), log_probs=torch.zeros(3))
    with pytest.raises(ValueError, match="log_probs without keep"):
        lds(None, [0.1, 0.2], log_probs=torch.zeros(3))
    with pytest.raises(ValueError, match=r"\(3,\)"):
        lds(None, [0.1, 0.2], keep=torch.ones(3, 2), log_probs=torch.zeros(4))
    with pytest.raises(ValueError, match="one per mask"):
        top_k_drop(lambda keep: torch.zeros(1), [0.1, 0.2])


def test_lds_is_scipys_spearman():
    generator = np.random.default_rng(3)
    keep = torch.from_numpy(generator.random((20, 6)) < 0.5)
    scores, log_probs = generator.normal(size=6), generator.normal(size=20)
    expected = stats.spearmanr(keep.numpy().astype(float) @ scores, log_probs).statistic
    assert lds(None, torch.tensor(scores), keep=keep, log_probs=torch.tensor(log_probs)) == pytest.approx(expected, abs=1e-12)

    def forward(keep):  # a "model" nonlinear in the kept sources
        return torch.tensor(np.sin(keep.numpy() @ np.arange(1.0, 7.0)))

    masks = ablation_masks(6, count=16, seed=5)
    expected = stats.spearmanr(masks.numpy() @ scores, np.sin(masks.numpy() @ np.arange(1.0, 7.0))).statistic
    assert lds(forward, scores, ablations=16, seed=5) == pytest.approx(expected, abs=1e-12)
    assert math.isnan(lds(forward, np.zeros(6)))  # a constant prediction: undefined


def test_lds_is_one_on_a_model_linear_in_the_kept_sources(tokenizer):
    """A causal "language model" whose log-probability of the next token grows with the summed
    weights of the tokens before it: the response's log-probability is a monotone function of
    the kept sources' weights, so their ranking over any ablations is exact."""
    words = ["keys", "cabinet", "door", "houses", "boys", "farmer"]
    weights = torch.tensor([1.5, -0.5, 0.25, 2.0, -1.25, 0.75], dtype=torch.float64)
    response = tokenizer.convert_tokens_to_ids(["are"])

    class Linear(nn.Module):
        def __init__(self):
            super().__init__()
            weight = torch.zeros(len(tokenizer), dtype=torch.float64)
            weight[tokenizer.convert_tokens_to_ids(words)] = weights
            self.register_buffer("weight", weight)

        def forward(self, input_ids, attention_mask):
            evidence = self.weight[input_ids].cumsum(-1) * attention_mask  # what each position has read
            logits = torch.zeros(*input_ids.shape, len(tokenizer), dtype=torch.float64)
            logits[..., response[0]] = evidence
            return logits

    prompt = TextTemplateInput("the " + " the ".join(["{}"] * len(words)) + " near the", values=words)
    log_prob = ResponseLogProb(Linear(), tokenizer, prompt, response, batch_size=5)
    assert lds(log_prob, weights, ablations=64, seed=1) == pytest.approx(1.0, abs=1e-12)
    assert lds(log_prob, -weights, ablations=64, seed=1) == pytest.approx(-1.0, abs=1e-12)
    assert lds(log_prob, weights.flip(0), ablations=64, seed=1) < 0.9
    # the drops follow the weights: the top source's removal costs most
    drops = top_k_drop(log_prob, weights, ks=[1, 2])
    assert drops[0] > 0 and drops[1] > drops[0]


def tie_breaking_average(scores: list[float], gold: list[int], k: int) -> tuple[float, float]:
    """precision@1 and recall@k averaged over every order of the sources consistent with the scores."""
    orders = [order for order in itertools.permutations(range(len(scores)))
              if all(scores[a] >= scores[b] for a, b in zip(order, order[1:]))]
    precision = np.mean([order[0] in gold for order in orders])
    recall = np.mean([len(set(order[:k]) & set(gold)) / len(gold) for order in orders])
    return float(precision), float(recall)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=6), st.data())
def test_gold_metrics_average_over_ties(scores, data):
    gold = data.draw(st.lists(st.integers(0, len(scores) - 1), min_size=1, max_size=len(scores), unique=True))
    k = data.draw(st.integers(1, len(scores)))
    precision, recall = tie_breaking_average(scores, gold, k)
    values = torch.tensor(scores, dtype=torch.float32)
    assert precision_at_1(values, gold) == pytest.approx(precision, abs=1e-12)
    assert recall_at_k(values, gold, k) == pytest.approx(recall, abs=1e-12)
    assert recall_at_k(values, gold, 1) == pytest.approx(precision_at_1(values, gold) / len(gold), abs=1e-12)


def test_gold_metrics_by_hand():
    assert precision_at_1([0.2, 0.9, 0.1], 1) == 1.0 and precision_at_1([0.2, 0.9, 0.1], [0, 2]) == 0.0
    assert precision_at_1(np.zeros(8), 3) == pytest.approx(1 / 8)  # one score for all: chance
    assert recall_at_k([0.2, 0.9, 0.1, 0.5], [0, 2], k=3) == 0.5
    assert recall_at_k([0.2, 0.9, 0.1, 0.5], torch.tensor([3]), k=2) == 1.0
    assert math.isnan(recall_at_k([0.2, 0.9], 0, k=3))  # fewer sources than k


def test_seeded_ablations_are_reproducible():
    masks = ablation_masks(40, count=500, seed=7)
    assert torch.equal(masks, ablation_masks(40, count=500, seed=7))
    assert not torch.equal(masks, ablation_masks(40, count=500, seed=8))
    assert abs(masks.double().mean().item() - 0.5) < 0.01  # 20,000 draws: 0.5 +- 0.0035 (std)
    assert abs(ablation_masks(40, count=500, keep_probability=0.8).double().mean().item() - 0.8) < 0.01
    with pytest.raises(ValueError, match="keep_probability"):
        ablation_masks(4, keep_probability=1.0)


def test_context_metrics_share_one_run_and_equal_the_metrics_alone():
    generator = np.random.default_rng(0)
    values = {row: float(generator.normal()) for row in itertools.product([0, 1], repeat=5)}
    scores = {"a": torch.tensor([0.5, 0.1, 0.9, 0.2, 0.4]), "b": torch.tensor([0.5, 0.1, 0.9, 0.3, 0.2]),
              "zero": torch.zeros(5)}
    forward = lookup(values)
    result = context_metrics(forward, scores, gold=[2, 3], ks=[1, 3], ablations=12, seed=4)
    assert len(forward.calls) == 1
    run = forward.calls[0]
    assert len(run) == len(torch.unique(run, dim=0))  # each distinct mask once
    assert list(result) == ["top-1-drop", "top-3-drop", "lds", "precision@1", "recall@3"]
    for name, value in scores.items():
        drops = top_k_drop(lookup(values), value, ks=[1, 3]).tolist()
        assert [result["top-1-drop"][name], result["top-3-drop"][name]] == drops
        alone = lds(lookup(values), value, ablations=12, seed=4)
        assert result["lds"][name] == alone or math.isnan(result["lds"][name]) and math.isnan(alone)
        assert result["precision@1"][name] == precision_at_1(value, [2, 3])
        assert result["recall@3"][name] == recall_at_k(value, [2, 3], 3)
    assert math.isnan(result["lds"]["zero"])  # a constant prediction
    assert context_metrics(lookup(values), scores, gold=[2, 3], ks=[1, 3], ablations=12, seed=4).keys() == result.keys()
    with pytest.raises(ValueError, match="same F"):
        context_metrics(forward, {"a": torch.ones(5), "b": torch.ones(4)})


def test_the_leaderboard_ranks_the_context_metrics():
    generator = np.random.default_rng(1)
    examples = [{"top-1-drop": {"good": 2 + generator.normal(), "random": generator.normal()},
                 "precision@1": {"good": 1.0, "random": float(generator.random() < 0.25)}} for _ in range(30)]
    del examples[3]["top-1-drop"]["random"]
    board = context_leaderboard(examples, n_resamples=199)
    ranking = board.ranking("top-1-drop")
    assert ranking.higher_is_better and ranking.names == ["good", "random"] and ranking.ranks == {"good": 1, "random": 2}
    random = np.array([example["top-1-drop"].get("random", np.nan) for example in examples])
    assert ranking.intervals["random"].mean == pytest.approx(np.nanmean(random))
    assert ranking.intervals["random"].count == 29
    # the directions are known by name, also to a Leaderboard built by hand
    assert Leaderboard.from_values({"recall@5": {"m": [0.1, 0.5]}, "lds": {"m": [0.2, 0.3]}}).higher_is_better == {
        "recall@5": True, "lds": True}
    with pytest.raises(TypeError, match="sequence"):
        context_leaderboard(examples[0])


def test_source_scores_take_captums_per_value_scores():
    prompt = TextTemplateInput(TEMPLATE, values=SOURCES, mask=[4, 9, 4, 2])
    scores = source_scores(prompt, [0.5, 2.0, 0.5, -1.0])
    expected = torch.zeros(3, dtype=torch.float64)
    expected[torch.tensor(prompt.formatted_mask)] = torch.tensor([0.5, 2.0, 0.5, -1.0], dtype=torch.float64)
    assert torch.equal(scores, expected)
    assert torch.equal(source_scores(TextTemplateInput(TEMPLATE, values=SOURCES), [1, 2, 3, 4]),
                       torch.tensor([1.0, 2, 3, 4], dtype=torch.float64))
    with pytest.raises(ValueError, match="within a mask group"):
        source_scores(prompt, [0.5, 2.0, 0.6, -1.0])
    with pytest.raises(ValueError, match=r"\(4,\)"):
        source_scores(prompt, [0.5, 2.0, -1.0])
