"""Adversarial training, per-instance adversaries, probing sources, the attribution table and the command."""

from __future__ import annotations

import csv
import dataclasses
import math

import pytest
import torch
from scipy.spatial.distance import jensenshannon

from captum_attnflow.adversarial.attributions import attribution_table, blank_out_scores
from captum_attnflow.adversarial.global_adversarial import adversarial_models, compare_models
from captum_attnflow.adversarial.per_instance import per_instance_adversary
from captum_attnflow.adversarial.tasks import agreement_task, chunking_task, forward
from captum_attnflow.adversarial.training import adversarial_loss, stored_attention, train, uniform_attention
from captum_attnflow.capture import inject_attention
from captum_attnflow.cli import main
from captum_attnflow.models import AgreementConfig, AgreementModel
from captum_attnflow.models.tagger import TaggerModel, yang_tagger_config


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Small matrices on a shared machine: one thread is as fast and does not fight other processes.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def task():
    return chunking_task(train_examples=512, test_examples=64)


@pytest.fixture(scope="module")
def original(task):
    torch.manual_seed(0)
    return train(TaggerModel(yang_tagger_config(attn_implementation="eager")), task, 60, lr=3e-3, progress=False)


@pytest.fixture(scope="module")
def adversaries(original, task):
    return adversarial_models(original, task, [0.0, 3.0], steps=30, lr=1e-3, progress=False)


def test_original_learns_to_chunk(original, task):
    assert task.score(original) > 0.9


def test_lambda_zero_keeps_the_predictions(original, adversaries, task):
    # With lambda = 0 the adversary only fits the original's labels from the original's weights:
    # its labels must stay the original's (tolerance: 1 % of the tagged words), its attention close.
    row = compare_models(original, adversaries[0.0], task, "adversarial", 0.0)
    assert row.same >= 0.99
    assert row.tvd < 0.05
    strong = compare_models(original, adversaries[3.0], task, "adversarial", 3.0)
    assert strong.jsd[0] > 5 * max(row.jsd[0], 0.01)
    assert strong.kl[0] > row.kl[0]


def test_adversarial_attention_rows_are_distributions(adversaries, task):
    batch = task.test[0]
    mask = batch["attention_mask"].bool()
    for model in adversaries.values():
        (attention,) = forward(model, batch, output_attentions=True).attentions
        rows = attention.permute(0, 2, 1, 3)[mask]  # (real queries, H, n)
        keys = mask[:, None, :].expand(-1, mask.shape[1], -1)[mask]  # their sentence's real keys
        assert (rows >= 0).all() and (rows[~keys[:, None, :].expand_as(rows)] == 0).all()
        assert torch.allclose(rows.sum(-1), torch.ones(rows.shape[:-1]), atol=1e-5)


def test_adversarial_loss_by_hand(original, adversaries, task):
    batch, lam = task.train[0], 0.7
    model = adversaries[3.0]
    loss = adversarial_loss(model, original, task, batch, lam)
    with torch.no_grad():
        f = forward(original, batch, output_attentions=True)
        g = forward(model, batch, output_attentions=True)
    scored = batch["labels"] != -100
    log_probs = g.logits.log_softmax(-1)
    nll = -log_probs.gather(-1, f.logits.argmax(-1, keepdim=True))[..., 0][scored].mean()
    p, q = f.attentions[0], g.attentions[0]
    rows = batch["attention_mask"].bool()[:, None, :].expand(p.shape[:-1])
    terms = torch.where(p > 0, p * (p.log() - q.clamp_min(1e-12).log()), torch.zeros_like(p)).sum(-1)
    assert loss.item() == pytest.approx((nll - lam * terms[rows].mean()).item(), rel=1e-4)


def test_uniform_and_stored_attention(original, task):
    batch = task.test[0]
    with torch.no_grad():
        own = forward(original, batch).logits
        stored = forward(original, batch, stored_attention(original)).logits
        uniform = forward(original, batch, uniform_attention, output_attentions=True)
    mask = batch["attention_mask"].bool()
    assert torch.allclose(own[mask], stored[mask], atol=1e-5)  # its own stored attention changes nothing
    lengths = batch["attention_mask"].sum(-1)
    expected = batch["attention_mask"][:, None, None, :] / lengths[:, None, None, None]
    assert torch.allclose(uniform.attentions[0], expected.expand_as(uniform.attentions[0]))


def test_per_instance_adversary_keeps_the_prediction(original, task):
    batch = {key: value[:6] for key, value in task.test[1].items()}
    found = per_instance_adversary(original, task, batch, epsilon=0.02, steps=25)
    assert (found.tvd <= 0.02).all() and (found.jsd > 0).all()
    mask = batch["attention_mask"].bool()
    # Recompute the found attention's effect independently: inject it, compare predictions.
    with torch.no_grad():
        before = forward(original, batch).logits.softmax(-1)
        with inject_attention(original, lambda layer, w: found.attention):
            after = forward(original, batch).logits.softmax(-1)
    scored = batch["labels"] != -100
    for b in range(6):
        tvd = 0.5 * (before[b] - after[b]).abs().sum(-1)[scored[b]].max()
        assert tvd.item() == pytest.approx(found.tvd[b].item(), abs=1e-5)
        with torch.no_grad():
            (reference,) = forward(original, {k: v[b : b + 1] for k, v in batch.items()}, output_attentions=True).attentions
        n = int(mask[b].sum())
        values = [
            jensenshannon(reference[0, h, i, :n].double().numpy(), found.attention[b, h, i, :n].double().numpy()) ** 2
            for h in range(4) for i in range(n)
        ]
        assert found.jsd[b].item() == pytest.approx(sum(values) / len(values), abs=1e-5)
        rows = found.attention[b, :, :n, :n].sum(-1)
        assert torch.allclose(rows, torch.ones_like(rows), atol=1e-5) and (found.attention[b, :, :, n:] == 0).all()
    with pytest.raises(ValueError, match="epsilon"):
        per_instance_adversary(original, task, batch, epsilon=0.0)


def test_tagger_blank_out_by_hand(original, task):
    batch = {key: value[:2] for key, value in task.test[0].items()}
    drops = blank_out_scores(original, task, batch)
    ids, mask = batch["input_ids"][1:2], batch["attention_mask"][1:2]
    n = int(mask.sum())
    ids, mask = ids[:, :n], mask[:, :n]
    with torch.no_grad():
        probabilities = original(ids, attention_mask=mask).logits.softmax(-1)[0]
        predicted = probabilities.argmax(-1)
        for j in range(n):
            blanked = ids.clone()
            blanked[0, j] = 1  # [UNK]
            after = original(blanked, attention_mask=mask).logits.softmax(-1)[0]
            expected = probabilities[torch.arange(n), predicted] - after[torch.arange(n), predicted]
            assert torch.allclose(drops[1, :n, j], expected, atol=1e-5)


def test_attribution_table_of_an_identical_copy(original, adversaries, task):
    small = dataclasses.replace(task, test=[{key: value[:4] for key, value in task.test[0].items()}])
    rows = attribution_table(original, {"copy": original, "lambda=3": adversaries[3.0]}, small)
    copy = {row["method"]: row["spearman"] for row in rows if row["model"] == "copy" and row["comparison"] == "vs original"}
    assert copy == {"raw": 1.0, "rollout": 1.0, "flow": 1.0}
    own = {(r["model"], r["method"]): r["spearman"] for r in rows if r["comparison"] == "vs own blank-out"}
    assert own[("copy", "rollout")] == own[("original", "rollout")]
    assert all(-1 <= rho <= 1 for rho in own.values())


def test_agreement_adversary_on_a_classifier():
    torch.manual_seed(0)
    task = agreement_task(train_examples=64, test_examples=16, batch_size=16)
    config = AgreementConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=32, attn_implementation="eager")
    original = AgreementModel(config).eval()
    adversary = adversarial_models(original, task, [1.0], steps=3, progress=False)[1.0]
    row = compare_models(original, adversary, task, "adversarial", 1.0)
    assert len(row.jsd) == 2 and all(0 <= v <= math.log(2) for v in row.jsd) and 0 <= row.tvd <= 1


def test_the_command_on_a_tiny_grid(tmp_path, capsys):
    threads = torch.get_num_threads()
    status = main([
        "adversarial", "--models", "yang", "--lambdas", "0", "2", "--train-examples", "64", "--test-examples", "16",
        "--batch-size", "16", "--train-steps", "3", "--adversary-steps", "2", "--per-instance-examples", "4",
        "--per-instance-steps", "2", "--out", str(tmp_path), "--no-progress",
    ])
    assert status == 0
    printed = capsys.readouterr().out
    assert "adversary lambda=2" in printed and "Probing classifiers" in printed
    names = {path.name for path in tmp_path.iterdir()}
    assert names == {"adversarial.md", "models.csv", "probing.csv", "per_instance.csv", "attributions.csv", "adversarial.png"}
    with (tmp_path / "models.csv").open() as handle:
        runs = [(row["name"], row["lam"]) for row in csv.DictReader(handle)]
    assert runs == [("original", ""), ("adversarial", "0.0"), ("adversarial", "2.0"), ("other seed", ""), ("uniform", "")]
    with (tmp_path / "per_instance.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == 4
    assert torch.get_num_threads() == threads  # the command restores the thread count it changed


def test_command_errors():
    with pytest.raises(SystemExit):
        main(["adversarial", "--models", "bert"])
    assert main(["adversarial", "--lambdas", "-1", "--no-progress"]) == 1
