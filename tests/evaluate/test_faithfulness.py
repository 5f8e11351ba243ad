"""Faithfulness metrics against slow references written from their definitions, and on a model
whose decision depends on one known token."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
import transformers
from torch import nn

from helpers import make_classifier, model_state, padded_batch
from captum_attnflow.evaluate import (
    aopc_comprehensiveness,
    aopc_sufficiency,
    deletion_area,
    log_odds,
    perturbation_auc,
    rank_methods,
    subject_first,
)

KEY = 7  # the token the hand-built model decides on


class KeyTokenClassifier(nn.Module):
    """Class 1 when token 7 is in the input, class 0 otherwise; no other token matters."""

    def forward(self, input_ids):
        present = (input_ids == KEY).any(-1).float()
        return torch.stack([2 - 4 * present, 4 * present - 2], -1)


def key_batch(seed=0, batch=6, n=12):
    """Token ids 10..59 with one 7 at a random position in every row, no padding."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 60, (batch, n), generator=generator)
    position = torch.randint(0, n, (batch,), generator=generator)
    ids[torch.arange(batch), position] = KEY
    return ids, position


def key_rankings(ids, seed=0):
    """Scores that rank the key token first (oracle), last (reversed) or anywhere (random)."""
    noise = torch.rand(ids.shape, generator=torch.Generator().manual_seed(seed))
    key = (ids == KEY).float()
    return {"oracle": key + 0.1 * noise, "random": noise, "reversed": -key + 0.1 * noise}


METRICS = {  # the function and whether higher is better
    "comprehensiveness": (aopc_comprehensiveness, True),
    "sufficiency": (aopc_sufficiency, False),
    "log-odds": (log_odds, False),
    "deletion-area": (deletion_area, True),
}


@pytest.mark.parametrize("deletion", ["remove", pytest.param(3, marks=pytest.mark.slow)])
@pytest.mark.parametrize("metric", sorted(METRICS))
def test_the_method_that_ranks_the_deciding_token_first_scores_best(metric, deletion):
    function, higher_is_better = METRICS[metric]
    ids, _ = key_batch(batch=12)
    model = KeyTokenClassifier()
    values = {name: function(model, ids, scores, deletion=deletion).numpy() for name, scores in key_rankings(ids).items()}
    ranking = rank_methods(values, higher_is_better=higher_is_better, n_resamples=199)
    assert ranking.names[0] == "oracle" and ranking.ranks["oracle"] == 1
    assert ranking.ranks["reversed"] > 1  # the oracle's lead is significant on 12 examples


def probabilities(model, ids):
    with torch.no_grad():
        return torch.softmax(model(ids[None]).logits, -1)[0].double()


def ranked_candidates(scores, real, exclude):
    candidates = [i for i in real if not exclude[i]]
    return sorted(candidates, key=lambda i: -scores[i].item())  # stable: ties keep position order


def deleted(model, ids, real, gone, deletion):
    """The target's probabilities with the positions ``gone`` deleted, one unpadded forward."""
    if deletion == "remove":
        kept = [i for i in real if i not in gone]
        return probabilities(model, ids[kept]) if kept else None
    row = ids[real].clone()
    for place, i in enumerate(real):
        if i in gone:
            row[place] = deletion
    return probabilities(model, row)


def count(fraction, m):
    return math.ceil(Fraction(str(fraction)) * m)


def per_row(reference, model, ids, mask, scores, target, exclude, *settings):
    """A reference written for one row, run on every row of the batch: ``reference(model, row
    ids, real positions, candidates best first, target, *settings)``, as float32 (B,)."""
    out = []
    for b in range(ids.shape[0]):
        real = [i for i in range(ids.shape[1]) if mask[b, i]]
        out.append(reference(model, ids[b], real, ranked_candidates(scores[b], real, exclude[b]), target[b], *settings))
    return torch.tensor(out, dtype=torch.float32)


def hand_log_odds(model, ids, real, ranked, target, fractions, deletion):
    full = probabilities(model, ids[real])[target]
    terms = [math.log(deleted(model, ids, real, set(ranked[: count(f, len(ranked))]), deletion)[target] / full) for f in fractions]
    return sum(terms) / len(terms)


def hand_deletion_area(model, ids, real, ranked, target, steps, deletion):
    """Both curves from 0 to 100% deleted, the trapezoid rule over the whole [0, 1]."""
    m = len(ranked)
    morf, lerf = [], []
    for j in range(steps + 1):
        k = count(Fraction(j, steps), m)
        top, bottom = set(ranked[:k]), set(ranked[m - k:]) if k else set()
        most, least = deleted(model, ids, real, top, deletion), deleted(model, ids, real, bottom, deletion)
        if most is None:  # nothing left: both curves at the same point
            most = least = torch.zeros(3, dtype=torch.float64)
        morf.append(most[target].item())
        lerf.append(least[target].item())
    return np.trapezoid(np.array(lerf) - np.array(morf), dx=1 / steps)


def hand_comprehensiveness(model, ids, real, ranked, target, fractions, deletion):
    full = probabilities(model, ids[real])[target]
    drops = [full - deleted(model, ids, real, set(ranked[: count(f, len(ranked))]), deletion)[target] for f in fractions]
    return sum(drops) / len(drops)


def random_case(seed):
    model = make_classifier(seed=5)
    ids, mask = padded_batch(seed=seed, batch=4, n=11)
    scores = torch.rand(ids.shape, generator=torch.Generator().manual_seed(seed + 10))
    scores[0, 3] = scores[0, 5]  # a tie, broken by position
    exclude = torch.zeros_like(mask, dtype=torch.bool)
    exclude[:, 0] = True
    return model, ids, mask, scores, torch.tensor([0, 1, 2, 0]), exclude


@pytest.mark.parametrize("deletion", ["remove", 3])
def test_log_odds_equals_its_definition(deletion):
    model, ids, mask, scores, target, exclude = random_case(seed=1)
    fractions = (0.1, 0.28, 0.5)
    ours = log_odds(model, ids, scores, target=target, attention_mask=mask, exclude=exclude, fractions=fractions, deletion=deletion)
    expected = per_row(hand_log_odds, model, ids, mask, scores, target, exclude, fractions, deletion)
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("deletion", ["remove", 3])
@pytest.mark.parametrize("with_exclude", [True, False])
def test_deletion_area_equals_the_trapezoid_between_the_whole_curves(deletion, with_exclude):
    model, ids, mask, scores, target, exclude = random_case(seed=2)
    exclude = exclude if with_exclude else torch.zeros_like(exclude)
    ours = deletion_area(model, ids, scores, target=target, attention_mask=mask, exclude=exclude, steps=7, deletion=deletion)
    expected = per_row(hand_deletion_area, model, ids, mask, scores, target, exclude, 7, deletion)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)


def test_comprehensiveness_by_replacement_equals_its_definition():
    model, ids, mask, scores, target, exclude = random_case(seed=3)
    fractions = (0.1, 0.3, 1.0)
    ours = aopc_comprehensiveness(model, ids, scores, target=target, attention_mask=mask, exclude=exclude,
                                  fractions=fractions, deletion=4)
    expected = per_row(hand_comprehensiveness, model, ids, mask, scores, target, exclude, fractions, 4)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)


def test_replacement_names_are_looked_up_and_bad_ones_refused():
    model = make_classifier()
    ids, mask = padded_batch(batch=2, n=6)
    scores = torch.rand(2, 6)
    by_name = log_odds(model, ids, scores, attention_mask=mask, deletion="pad")  # config.pad_token_id = 0
    torch.testing.assert_close(by_name, log_odds(model, ids, scores, attention_mask=mask, deletion=0))
    with pytest.raises(ValueError, match="cannot find the mask token id"):
        log_odds(model, ids, scores, attention_mask=mask, deletion="mask")
    with pytest.raises(ValueError, match='deletion must be "remove"'):
        log_odds(model, ids, scores, attention_mask=mask, deletion="blank")
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        log_odds(model, ids, scores, attention_mask=mask, deletion=1000)
    with pytest.raises(ValueError, match="steps must be an int >= 2"):
        deletion_area(model, ids, scores, attention_mask=mask, steps=1)
    with pytest.raises(ValueError, match=r"fractions must be"):
        log_odds(model, ids, scores, attention_mask=mask, fractions=(1.5,))


def test_replacement_keeps_per_token_arguments_aligned():
    """Replacing keeps positions, so a per-token argument may go along; removing refuses it."""

    class Masked(nn.Module):
        def forward(self, input_ids, weights):
            return torch.stack([((input_ids == KEY) * weights).sum(-1), torch.zeros(input_ids.shape[0])], -1)

    ids, _ = key_batch(batch=3, n=5)
    weights = torch.ones(3, 5)
    scores = key_rankings(ids)["oracle"]
    values = log_odds(Masked(), ids, scores, additional_forward_args=(weights,), deletion=1, target=0)
    assert values.shape == (3,) and bool((values < 0).all())
    with pytest.raises(ValueError, match="per-token tensor"):
        log_odds(Masked(), ids, scores, additional_forward_args=(weights,), target=0)


def test_metrics_leave_the_model_as_it_was():
    model = make_classifier()
    model.train()
    before = model_state(model)
    ids, mask = padded_batch(batch=2, n=6)
    log_odds(model, ids, torch.rand(2, 6), attention_mask=mask)
    deletion_area(model, ids, torch.rand(2, 6), attention_mask=mask, steps=3)
    assert model_state(model) == before


def hand_subject_first(scores, subject, attractors, atol=1e-6):
    out = []
    for row, s, positions in zip(scores.tolist(), subject.tolist(), attractors.tolist()):
        rivals = [row[p] for p in positions if p >= 0]
        if not rivals:
            out.append(math.nan)
        elif row[s] > max(rivals) + atol:
            out.append(1.0)
        elif row[s] < max(rivals) - atol:
            out.append(0.0)
        else:
            out.append(0.5)
    return torch.tensor(out, dtype=torch.float64)


def test_subject_first_equals_its_definition():
    generator = torch.Generator().manual_seed(0)
    scores = torch.rand(50, 8, generator=generator).round(decimals=1)  # ties happen
    subject = torch.randint(1, 8, (50,), generator=generator)
    attractors = torch.randint(-1, 8, (50, 3), generator=generator)
    attractors[attractors == subject[:, None]] = -1
    attractors[0] = -1
    torch.testing.assert_close(subject_first(scores, subject, attractors), hand_subject_first(scores, subject, attractors), equal_nan=True)
    with pytest.raises(ValueError, match="token positions"):
        subject_first(scores, subject + 10, attractors)
    with pytest.raises(ValueError, match=r"subject_positions must be \(B,\)"):
        subject_first(scores, subject[:3], attractors)


def tiny_vit(seed=0):
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    config = ViTConfig(image_size=8, patch_size=2, num_channels=3, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=64, num_labels=3, initializer_range=0.5)
    return ViTForImageClassification(config).eval()


def hand_perturbation_auc(model, pixels, scores, order, steps, baseline, patch):
    out = []
    for b in range(pixels.shape[0]):
        with torch.no_grad():
            target = model(pixels[b:b + 1]).logits.argmax(-1).item()
        patch_scores = scores[b, 1:].tolist()
        grid = pixels.shape[-1] // patch
        ranked = sorted(range(len(patch_scores)), key=lambda p: -patch_scores[p] if order == "positive" else patch_scores[p])
        hits = []
        for j in range(steps):
            image = pixels[b].clone()
            fill = image.mean(dim=(1, 2)) if baseline == "mean" else torch.full((3,), float(baseline))
            for p in ranked[: math.ceil(Fraction(j, steps) * len(ranked))]:
                row, column = divmod(p, grid)
                image[:, row * patch:(row + 1) * patch, column * patch:(column + 1) * patch] = fill[:, None, None]
            with torch.no_grad():
                hits.append(float(model(image[None]).logits.argmax(-1).item() == target))
        out.append(np.trapezoid(hits, dx=1 / steps))
    return torch.tensor(out, dtype=torch.float32)


@pytest.mark.parametrize("order, baseline", [("positive", 0.0), ("negative", "mean")])
def test_perturbation_auc_equals_its_definition(order, baseline):
    model = tiny_vit()
    pixels = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    scores = torch.rand(4, 17, generator=torch.Generator().manual_seed(2))
    ours = perturbation_auc(model, pixels, scores, order=order, steps=5, baseline=baseline)
    torch.testing.assert_close(ours, hand_perturbation_auc(model, pixels, scores, order, 5, baseline, 2))


def test_perturbation_auc_rewards_the_patch_the_decision_depends_on():
    class BrightCorner(nn.Module):
        """Class 1 when the top-left 2 x 2 patch is bright."""

        config = type("Config", (), {"patch_size": 2})()

        def forward(self, pixels):
            bright = pixels[:, :, :2, :2].mean(dim=(1, 2, 3))
            return torch.stack([torch.zeros_like(bright), bright - 0.5], -1)

    pixels = torch.zeros(3, 3, 8, 8)
    pixels[:, :, :2, :2] = 1.0
    oracle = torch.zeros(3, 17)
    oracle[:, 1] = 1.0  # the top-left patch, after [CLS]
    positive = perturbation_auc(BrightCorner(), pixels, oracle, order="positive")
    negative = perturbation_auc(BrightCorner(), pixels, oracle, order="negative")
    assert positive.tolist() == pytest.approx([0.05] * 3)  # lost at the first blanked patch: half a step
    assert negative.tolist() == pytest.approx([0.9] * 3)  # kept until the last patch left
    with pytest.raises(ValueError, match=r"attributions must be \(B, n\) = \(3, 17\)"):
        perturbation_auc(BrightCorner(), pixels, oracle[:, 1:])
    with pytest.raises(ValueError, match="order must be"):
        perturbation_auc(BrightCorner(), pixels, oracle, order="both")
    with pytest.raises(TypeError, match="pixel values"):
        perturbation_auc(BrightCorner(), pixels.long(), oracle)


def test_a_wrapper_taking_attention_mask_gets_the_shortened_rows_mask():
    # Removal shortens rows and pads their ends: a wrapper reading the last real token (as a
    # language model explained at its next word does) must see the new mask, not the old one.
    class LastToken(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask=None):
            logits = self.model(input_ids, attention_mask=attention_mask).logits
            return logits[torch.arange(len(logits)), attention_mask.sum(-1) - 1]

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=40, n_embd=16, n_layer=2, n_head=2)).eval()
    ids = torch.randint(1, 40, (3, 7))
    scores = torch.rand(3, 7)
    value = aopc_comprehensiveness(LastToken(model), ids, scores, target=0, fractions=[0.3], softmax=False)
    with torch.no_grad():
        full = model(ids).logits[:, -1, 0]
        kept = scores.argsort(dim=-1, descending=True, stable=True)[:, 3:].sort(dim=-1).values  # ceil(0.3 * 7) = 3 removed
        shortened = model(ids.gather(1, kept)).logits[:, -1, 0]
    torch.testing.assert_close(value, full - shortened, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("deletion", ["remove", 3])
def test_shared_forward_passes_run_each_row_once_and_change_no_value(deletion):
    from captum_attnflow.evaluate._deletion import shared_forward_passes

    model = make_classifier()
    rows = []
    model.register_forward_hook(lambda module, args, kwargs, output: rows.append(len(output.logits)), with_kwargs=True)
    ids, mask = padded_batch(seed=3)
    rankings = [torch.rand(ids.shape, generator=torch.Generator().manual_seed(seed)) for seed in range(3)]
    calls = [(function, scores) for function, _ in METRICS.values() for scores in rankings + rankings]

    def run():
        rows.clear()
        values = [function(model, ids, scores, target=1, attention_mask=mask, deletion=deletion) for function, scores in calls]
        return values, sum(rows)

    alone, alone_rows = run()
    with shared_forward_passes():
        shared, shared_rows = run()
    for a, b in zip(alone, shared):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, equal_nan=True)
    # The repeated rankings are free; the full input runs once for all metrics.
    assert shared_rows < alone_rows / 2


def test_a_softmax_over_a_single_score_is_refused_with_the_fix():
    from captum_attnflow.baselines import BlankOut

    def one_score(input_ids):
        return input_ids.float().mean(-1, keepdim=True)  # (B, 1): a similarity, not a logit

    ids = torch.randint(10, 60, (2, 6))
    with pytest.raises(ValueError, match="always 1.*softmax=False"):
        aopc_comprehensiveness(one_score, ids, torch.rand(2, 6), target=0)
    with pytest.raises(ValueError, match="always 1.*softmax=False"):
        BlankOut(one_score, token=3).attribute(ids, target=0)
    assert aopc_comprehensiveness(one_score, ids, torch.rand(2, 6), target=0, softmax=False).shape == (2,)
