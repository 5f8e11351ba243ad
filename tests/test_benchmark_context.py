"""The context task: its peer rows against explicit references, and the task end to end."""

from __future__ import annotations

import math

import pytest
import torch
from captum.attr import TextTemplateInput

from captum_attnflow.attr.llm_inputs import template_prompt
from captum_attnflow.benchmark.context import ContextExample, context_examples, context_rows, run_context_task
from captum_attnflow.benchmark.context_methods import attntrace, leave_one_out, random_scores
from captum_attnflow.capture import extract_attentions
from captum_attnflow.evaluate import ResponseLogProb
from captum_attnflow.models.language_model import load_agreement_lm


@pytest.fixture(scope="module")
def lm():
    return load_agreement_lm()


PROMPT = TextTemplateInput("{} {} {}", values=["the keys", "to the", "cabinet"])


def test_leave_one_out_is_the_log_probability_lost_without_each_source(lm):
    model, tokenizer = lm
    scores = leave_one_out(model, tokenizer, PROMPT, " are", seed=0)
    log_prob = ResponseLogProb(model, tokenizer, PROMPT, " are")
    keep = torch.ones(4, 3, dtype=torch.bool)
    keep[1:].fill_diagonal_(False)
    values = log_prob(keep)
    torch.testing.assert_close(scores.double(), values[0] - values[1:], atol=1e-4, rtol=1e-4)


def test_attntrace_on_every_source_is_the_top_tokens_mean_of_the_averaged_attention(lm):
    """One subset holding every source: a source's score is the mean of its largest averaged
    attention weights, from the model's own eager maps averaged over layers, heads and response rows."""
    model, tokenizer = lm
    scores = attntrace(model, tokenizer, PROMPT, " are", seed=0, subsets=1, keep=1.0, top_tokens=1)
    located = template_prompt(PROMPT, tokenizer)
    answer = torch.tensor(tokenizer.encode(" are", add_special_tokens=False))
    ids = torch.cat([located.ids, answer])[None]
    maps = torch.stack(extract_attentions(model, ids))  # (L, 1, H, n, n)
    start = located.ids.numel()
    averaged = maps[:, 0, :, start:, :start].mean(dim=(0, 1, 2))  # over layers, heads, response rows
    expected = torch.stack([averaged[located.sources == source].max() for source in range(3)])
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-5)


def test_attntrace_scores_only_the_subsets_that_held_a_source(lm):
    model, tokenizer = lm
    five = TextTemplateInput("{} {} {} {} {}", values=["the keys", "to", "the", "old", "cabinet"])
    scores = attntrace(model, tokenizer, five, " are", seed=3, subsets=2, keep=0.4)
    held = (scores != 0).sum().item()
    assert 2 <= held <= 4 and torch.isfinite(scores).all()  # two subsets of two sources each


def test_the_task_scores_every_row_on_the_same_ablations(lm):
    model, tokenizer = lm
    examples = [
        ContextExample(PROMPT, " are", 0),
        ContextExample(TextTemplateInput("{} {} {}", values=["the key", "near the", "cabinets"]), " is", 0),
    ]
    into: tuple = ({}, {}, {}, {})
    notes = run_context_task(model, tokenizer, examples, ["rollout", "leave-one-out", "random"], 0, False, into, ks=(1, 3))
    values, times, counts, directions = into
    assert counts == {"context": 2} and set(times["context"]) == {"rollout", "leave-one-out", "random"}
    assert {"context: top-1-drop", "context: top-3-drop", "context: lds", "context: precision@1", "context: recall@3"} == set(directions)
    assert all(directions.values()) and notes == []
    # Removing all three sources is the same ablation for every row.
    drops = [values[(row, "context: top-3-drop", None)] for row in ("rollout", "leave-one-out", "random")]
    torch.testing.assert_close(torch.tensor(drops[0]), torch.tensor(drops[1]))
    torch.testing.assert_close(torch.tensor(drops[0]), torch.tensor(drops[2]))
    # Leave-one-out's best source is by definition the one whose removal costs most.
    loss = values[("leave-one-out", "context: top-1-drop", None)]
    assert all(loss >= values[("random", "context: top-1-drop", None)] - 1e-6)


def test_rows_by_name_and_the_floor():
    rows = context_rows(None)
    assert {"raw", "rollout", "flow", "attnlrp", "leave-one-out", "attntrace", "random"} <= set(rows)
    assert "saliency" not in rows and "blankout" not in rows
    first, again = random_scores(None, None, PROMPT, "", 5), random_scores(None, None, PROMPT, "", 5)
    assert torch.equal(first, again) and first.shape == (3,)


def test_examples_from_the_users_rows_find_the_gold_source():
    rows = {
        "context": ["Ada wrote the first program. Babbage built the engine.", "The sky is blue. Grass is green."],
        "question": ["Who wrote the first program?", "What colour is grass?"],
        "answer": ["Ada", "green"],
        "gold": [0, "Grass is green"],
    }
    examples = context_examples(rows, gold="gold")
    assert [example.gold for example in examples] == [0, 1]
    assert [example.prompt.n_itp_features for example in examples] == [2, 2]
    assert examples[1].answer == " green" and "What colour is grass?" in examples[1].prompt.to_model_input()
    assert context_examples(dict(rows, gold=[None, math.nan]), gold="gold")[0].gold is None
    with pytest.raises(ValueError, match="out of range"):
        context_examples(dict(rows, gold=[5, 0]), gold="gold")
    with pytest.raises(ValueError, match="in no source"):
        context_examples(dict(rows, gold=["Turing", 0]), gold="gold")
    with pytest.raises(ValueError, match="no column 'question'"):
        context_examples({key: value for key, value in rows.items() if key != "question"})


def test_the_users_context_rows_run_through_run_benchmark(lm):
    import datasets

    from captum_attnflow.benchmark import Columns, run_benchmark

    model, tokenizer = lm
    rows = datasets.Dataset.from_dict({
        "context": ["the keys are old. the cabinet is new.", "the key is old. the cabinets are new."],
        "question": ["the keys", "the key"], "answer": ["are", "is"], "gold": [0, 0],
    })
    result = run_benchmark(model=model, tokenizer=tokenizer, dataset=rows, columns=Columns(context="context", gold="gold"),
                           methods=["rollout", "random"], n_resamples=99, show_progress=False, name="mine")
    assert result.examples == {"mine": 2} and "mine: precision@1" in result.leaderboard.metrics
    with pytest.raises(ValueError, match="no column 'answer'"):
        run_benchmark(model=model, tokenizer=tokenizer, dataset=rows.remove_columns("answer"),
                      columns=Columns(context="context"), methods=["random"], show_progress=False)


def test_the_bundled_task_asks_the_retrieval_model_about_32_facts():
    from captum_attnflow.benchmark.context import BUNDLED_SOURCES, load_context_task

    model, tokenizer, examples = load_context_task(3, seed=2)
    assert type(model).__name__ == "Qwen3ForCausalLM" and BUNDLED_SOURCES == 32
    for example in examples:
        assert example.prompt.n_itp_features == 32
        assert f": {example.answer} (" in example.prompt.values[example.gold]
        assert sum(f": {example.answer} (" in source for source in example.prompt.values) == 1
