"""The benchmark's tasks explain what they say they explain, and a small leaderboard runs end to end."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import torch

from captum_attnflow import AttentionRollout, extract_attentions
from captum_attnflow.benchmark import TASKS, BenchmarkResult, run_benchmark
from captum_attnflow.benchmark.runner import _attribute
from captum_attnflow.benchmark.tasks import sentence_pairs
from captum_attnflow.data import CHUNK_TAGS
from captum_attnflow.evaluate import Leaderboard
from captum_attnflow.functional import rollout
from captum_attnflow.methods import METHODS


@pytest.fixture(scope="module")
def loaded():
    return {name: task.load(5, 0) for name, task in TASKS.items()}


def _scores(model, batch):
    with torch.no_grad():
        output = model(batch["input_ids"], *batch.get("additional_forward_args", ()), attention_mask=batch["attention_mask"])
    return getattr(output, "logits", output)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_each_task_gives_held_out_batches_the_model_scores(loaded, name):
    model, tokenizer, batches = loaded[name]
    assert sum(len(batch["input_ids"]) for batch in batches) == 5
    for batch in batches:
        scores = _scores(model, batch)
        assert scores.shape[0] == len(batch["input_ids"]) and scores.dim() == 2
        assert batch["labels"].max() < scores.shape[1]
        special = batch["special_tokens_mask"].bool() & batch["attention_mask"].bool()
        assert special[:, 0].all()  # [CLS] is never ranked nor deleted
        if name == "lm":  # the correct copula above the other one
            copulas = tokenizer.convert_tokens_to_ids(["is", "are"])
            wrong = torch.tensor([copulas[1 - copulas.index(label)] for label in batch["labels"].tolist()])
            rows = torch.arange(len(scores))
            assert (scores[rows, batch["labels"]] > scores[rows, wrong]).float().mean() >= 0.8
        elif name != "similarity":
            assert (scores.argmax(-1) == batch["labels"]).float().mean() >= 0.8  # the models are accurate


def test_the_tagger_task_explains_each_word_at_its_position(loaded):
    model, tokenizer, batches = loaded["chunking"]
    batch = batches[0]
    tagger = model.model
    with torch.no_grad():
        every_position = tagger(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    rows = torch.arange(len(batch["input_ids"]))
    torch.testing.assert_close(_scores(model, batch), every_position[rows, batch["position"]])
    # The first sentence's words, one row each, [CLS] at 0.
    assert batch["position"].tolist()[:3] == [1, 2, 3]
    assert all(CHUNK_TAGS[label].startswith(("B-", "I-", "O")) for label in batch["labels"].tolist())


def test_the_similarity_task_is_the_cosine_of_the_pairs_embeddings(loaded):
    model, tokenizer, batches = loaded["similarity"]
    batch = batches[0]
    pairs = sentence_pairs()
    first = tokenizer.batch_decode(batch["input_ids"], skip_special_tokens=True)
    chosen = [next(pair for pair in pairs if pair[0].lower().startswith(text[:12])) for text in first]
    encoder = model.encoder
    embeddings = []
    with torch.no_grad():
        for sentences in zip(*chosen):
            for sentence in sentences:
                ids = tokenizer(sentence, return_tensors="pt")["input_ids"]
                embeddings.append(encoder(ids).last_hidden_state[0].mean(0))
    pairs_embeddings = torch.stack(embeddings).view(2, len(chosen), -1)
    expected = torch.nn.functional.cosine_similarity(pairs_embeddings[0], pairs_embeddings[1], dim=-1)
    torch.testing.assert_close(_scores(model, batch)[:, 0], expected, atol=1e-5, rtol=1e-5)


def test_pooled_attention_scores_are_the_mean_of_every_positions_row(loaded):
    model, tokenizer, batches = loaded["similarity"]
    batch = dict(batches[0], target=batches[0]["labels"])
    scores = _attribute(AttentionRollout(model), METHODS["rollout"], TASKS["similarity"], batch)
    mask = batch["attention_mask"]
    attentions = extract_attentions(model, batch["input_ids"], batch["additional_forward_args"], attention_mask=mask)
    maps = rollout(attentions, attention_mask=mask)  # (L, B, n, n)
    expected = (maps * mask[None, :, :, None]).sum(2) / mask.sum(-1)[None, :, None]
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-4)


def test_a_small_leaderboard_ranks_methods_on_every_task_and_resumes(tmp_path):
    kwargs = dict(methods=["rollout", "saliency", "random"], examples=4, n_resamples=99, show_progress=False)
    result = run_benchmark(tasks=["agreement", "chunking"], checkpoint_dir=tmp_path, **kwargs)
    metrics = result.leaderboard.metrics
    assert "agreement: subject-first" in metrics and "chunking: deletion-area" in metrics
    assert "chunking: subject-first" not in metrics
    names = result.leaderboard.ranking("chunking: comprehensiveness").names
    assert len(names) == 4 and {"random", "rollout L4", "saliency"} < set(names)
    assert any(name.startswith("rollout, best L") for name in names)
    assert result.examples == {"agreement": 4, "chunking": 4}
    assert set(result.seconds["chunking"]) == {"rollout", "saliency", "random"}
    resumed = run_benchmark(tasks=["agreement", "chunking"], checkpoint_dir=tmp_path, **kwargs)
    assert resumed.seconds["chunking"] == {}  # nothing ran again
    for metric in metrics:
        for name in result.leaderboard.ranking(metric).names:
            np.testing.assert_allclose(
                resumed.leaderboard.ranking(metric).intervals[name].mean, result.leaderboard.ranking(metric).intervals[name].mean
            )
    paths = result.save(tmp_path / "out")
    assert all(path.stat().st_size > 0 for path in paths)
    assert {"leaderboard_agreement.png", "leaderboard_chunking.png", "report.html"} <= {path.name for path in paths}
    assert Leaderboard.load(tmp_path / "out" / "leaderboard.json") == result.leaderboard
    report = (tmp_path / "out" / "report.html").read_text()
    # the diagram across the tasks and one figure per task; 2 examples a task
    assert report.count("data:image/png;base64,") == 3 and report.count('<div class="caf-view"') == 4
    across = result.critical_difference()
    assert across.blocks == metrics  # every metric of every task is a block
    assert set(across.names) == {"rollout (last layer)", "rollout (best layer)", "saliency", "random"}
    assert "critical_difference.png" in {path.name for path in paths} and "Across the tasks" in result.to_markdown()
    assert resumed.shown == {"agreement": [], "chunking": []}  # resumed past the first batch: nothing to show
    table = result.leaderboard.to_markdown().split("chunking: comprehensiveness")[1]
    order = result.leaderboard.ranking("chunking: comprehensiveness").names
    listed = [line.split(" | ")[0].lstrip("| ") for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:5]
    assert listed == order  # tables by mean, best first


def test_unknown_names_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="methods are .*alti.*tasks are agreement, lm, similarity, chunking"):
        run_benchmark(tasks=["sst2"], methods=["lime"])


def test_the_diagram_across_tasks_takes_every_task_and_one_name_per_method():
    """Entries of different depths (rollout L6, rollout L4) and the context task's rows (rollout
    through the wrapper, at the last layer) are one method; what some task lacks is left out."""
    rng = np.random.default_rng(0)
    entries = {
        "agreement: comprehensiveness": ["rollout L6", "rollout, best L2", "attnlrp", "saliency", "random"],
        "chunking: comprehensiveness": ["rollout L4", "rollout, best L1", "attnlrp", "saliency", "random"],
        "context: lds": ["rollout", "attnlrp", "leave-one-out", "random"],
    }
    values = {(name, metric, None): rng.normal(0.5 - 0.1 * i, 0.05, 8) for metric, names in entries.items()
              for i, name in enumerate(names)}
    board = Leaderboard(values, higher_is_better=dict.fromkeys(entries, True), n_resamples=99)
    result = BenchmarkResult(board, {}, {"agreement": 8, "chunking": 8, "context": 8})
    across = result.critical_difference()
    assert across.blocks == list(entries)
    assert sorted(across.names) == ["attnlrp", "random", "rollout (last layer)"]
    assert sorted(across.left_out) == ["leave-one-out", "rollout (best layer)", "saliency"]
    assert across.average_ranks["rollout (last layer)"] == 1.0 and across.average_ranks["random"] == 3.0
