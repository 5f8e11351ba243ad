"""Context attribution metrics: is the source a method scores highest the one the response came
from? ContextCite's top-k log-probability drop and linear datamodeling score (Cohen-Wang et
al., NeurIPS 2024, section 4), and precision@1 / recall@k against gold sources.

A method gives one score per feature of the prompt (F,), F = ``prompt.n_itp_features`` (the
sources, or their ``mask`` groups; :func:`source_scores` takes Captum's per-value
``seq_attr`` there). The ablation metrics take a ``forward_func`` mapping (m, F) keep masks to
(m,) log-probabilities of the response: a
:class:`~captum_attnflow.evaluate.context_ablation.ResponseLogProb`, or any such callable.
Per example, :func:`context_metrics` scores several methods on one set of ablations; over
examples, :func:`context_leaderboard` gives every metric's means with bootstrap intervals and
paired tests (a :class:`~captum_attnflow.evaluate.Leaderboard`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from captum.attr import TextTemplateInput
from torch import Tensor

from captum_attnflow.evaluate.context_ablation import ablation_masks, check_keep
from captum_attnflow.evaluate.leaderboard import Leaderboard
from captum_attnflow.evaluate.spearman import as_scores

CONTEXTCITE_KS = (1, 3, 5)
LDS_ABLATIONS = 32


def source_scores(prompt: TextTemplateInput, scores: Any) -> Tensor:
    """Per-feature scores (F,) from per-value ones, as Captum's ``LLMAttributionResult.seq_attr``
    gives them for a template (one score per value, repeated over a ``mask`` group).

    Args:
        prompt: the prompt the scores are of.
        scores: (len(prompt.values),) one score per value.

    Returns:
        Tensor: float64 (F,), F = ``prompt.n_itp_features``, feature :math:`j` the score of its values.

    Raises:
        ValueError: not one score per value, or values of a group scored differently.

    Example::

        >>> from captum.attr import TextTemplateInput
        >>> prompt = TextTemplateInput("{} {} {}", values=["a", "b", "c"], mask=[0, 1, 0])
        >>> source_scores(prompt, [0.5, 2.0, 0.5]).tolist()
        [0.5, 2.0]
    """
    values = as_scores(scores, "scores")
    if values.shape != (prompt.n_features,):
        raise ValueError(f"scores must be ({prompt.n_features},), one per value of the prompt, got {tuple(values.shape)}.")
    if prompt.mask is None:
        return values
    first = [prompt.formatted_mask.index(feature) for feature in range(prompt.n_itp_features)]
    group = torch.tensor(prompt.formatted_mask)
    features = values[first]
    if not torch.equal(features[group], values):
        raise ValueError("scores differ within a mask group; a group is one feature and takes one score.")
    return features


def top_k_masks(scores: Any, ks: Sequence[int] = CONTEXTCITE_KS) -> Tensor:
    """The keep masks that ablate the k highest-scored sources, one row per k.

    Sources are ranked by score, highest first; equal scores keep their order (a stable
    sort: the earlier source first), so the masks are reproducible.

    Args:
        scores: (F,) one score per feature, no NaN.
        ks: the k's, positive ints.

    Returns:
        Tensor: bool (len(ks), F), False on the k top sources; a k above F gives a row of
        all True (nothing to compare; :func:`top_k_drop` makes it NaN).

    Example::

        >>> top_k_masks([0.1, 0.9, 0.5, 0.9], ks=[1, 2]).int().tolist()  # a tie: the earlier 0.9 first
        [[1, 0, 1, 1], [1, 0, 1, 0]]
    """
    scores = _check_scores(scores)
    ks = _check_ks(ks)
    order = torch.argsort(scores, descending=True, stable=True)
    keep = torch.ones(len(ks), scores.numel(), dtype=torch.bool)
    for row, k in enumerate(ks):
        if k <= scores.numel():
            keep[row, order[:k]] = False
    return keep


def top_k_drop(forward_func: Callable[[Tensor], Any], scores: Any, ks: Sequence[int] = CONTEXTCITE_KS) -> Tensor:
    """ContextCite's top-k log-probability drop: ablate the k highest-scored sources and measure
    how much the response's log-probability falls (Cohen-Wang et al., NeurIPS 2024, section 4.1).
    Higher is better.

    :math:`\\Delta_k = f(\\mathbf{1}) - f(\\mathbf{1} - e_{T_k})`, with :math:`f(z)` the
    response's total log-probability given the prompt with the sources where :math:`z = 0`
    ablated, :math:`T_k` the k top-scored sources (ties: the earlier source first, see
    :func:`top_k_masks`). ContextCite reports k = 1, 3, 5. Every k is scored in one call of
    ``forward_func`` together with the full prompt.

    Args:
        forward_func: maps a bool (m, F) keep mask to (m,) log-probabilities, e.g.
            :class:`~captum_attnflow.evaluate.context_ablation.ResponseLogProb`.
        scores: (F,) one score per feature of the prompt, no NaN.
        ks: the k's, positive ints.

    Returns:
        Tensor: float64 (len(ks),) on the CPU; NaN for a k above F (fewer sources than k).

    Example::

        >>> import torch
        >>> from captum.attr import TextTemplateInput
        >>> from captum_attnflow.evaluate import ResponseLogProb, top_k_drop
        >>> from captum_attnflow.models.language_model import load_agreement_lm
        >>> model, tokenizer = load_agreement_lm()
        >>> prompt = TextTemplateInput("{} {}", values=["the keys", "to the cabinet"])
        >>> log_prob = ResponseLogProb(model, tokenizer, prompt, "are")
        >>> subject_first, subject_last = top_k_drop(log_prob, [1.0, 0.0], ks=[1]), top_k_drop(log_prob, [0.0, 1.0], ks=[1])
        >>> bool(subject_first > subject_last)
        True
    """
    keep = top_k_masks(scores, ks)
    log_probs = _log_probs(forward_func, torch.cat([torch.ones(1, keep.shape[1], dtype=torch.bool), keep]))
    return _drops(log_probs[0], log_probs[1:], _check_ks(ks), keep.shape[1])


def lds(
    forward_func: Callable[[Tensor], Any] | None,
    scores: Any,
    ablations: int = LDS_ABLATIONS,
    seed: int = 0,
    keep: Any = None,
    log_probs: Any = None,
) -> float:
    """ContextCite's linear datamodeling score: how well the scores, read as a linear model of
    which sources are kept, rank the response's real log-probabilities under random ablations
    (Cohen-Wang et al., NeurIPS 2024, section 4.1, after Park et al. 2023). Higher is better.

    :math:`\\mathrm{LDS} = \\rho_{\\text{Spearman}}\\big((\\langle s, z_i \\rangle)_{i=1}^m,\\ (f(z_i))_{i=1}^m\\big)`,
    with :math:`z_i \\in \\{0, 1\\}^F` keep masks drawn with each source kept with probability
    1/2 (:func:`~captum_attnflow.evaluate.context_ablation.ablation_masks`), :math:`s` the
    scores and :math:`f` the response's log-probability. Spearman's :math:`\\rho` ignores a
    surrogate's intercept and scale: any method's scores are such a linear prediction.

    Several methods of one example should share one set of ablations (:math:`m` forward
    passes, not :math:`m` per method): pass the same ``keep`` and ``log_probs`` (as
    :func:`context_metrics` does), or the same :class:`ResponseLogProb` and seed (it runs a
    mask once).

    Args:
        forward_func: maps a bool (m, F) keep mask to (m,) log-probabilities; None when
            ``log_probs`` is given.
        scores: (F,) one score per feature, no NaN.
        ablations: m, the number of random masks drawn when ``keep`` is None.
        seed: the seed of their draw.
        keep: bool (m, F) precomputed masks instead of the random draw.
        log_probs: (m,) the response's log-probabilities under ``keep`` (given with it),
            instead of running ``forward_func``.

    Returns:
        float: in [-1, 1]; NaN where the prediction or the log-probabilities are constant over
        the masks (e.g. all scores equal), or a log-probability is NaN.

    Example::

        >>> import torch
        >>> from captum_attnflow.evaluate import lds
        >>> weights = torch.tensor([2.0, -1.0, 0.5, 0.0])
        >>> linear = lambda keep: keep.double() @ weights.double()  # a "model" linear in the kept sources
        >>> lds(linear, weights), lds(linear, -weights)
        (1.0, -1.0)
    """
    scores = _check_scores(scores)
    if keep is None:
        if log_probs is not None:
            raise ValueError("log_probs without keep: pass the masks they were computed on as keep=.")
        keep = ablation_masks(scores.numel(), ablations, seed)
    keep = check_keep(keep, scores.numel())
    if log_probs is None:
        if forward_func is None:
            raise ValueError("pass forward_func, or the log_probs of keep.")
        log_probs = _log_probs(forward_func, keep)
    log_probs = as_scores(log_probs, "log_probs")
    if log_probs.shape != (keep.shape[0],):
        raise ValueError(f"log_probs must be ({keep.shape[0]},), one per mask of keep, got {tuple(log_probs.shape)}.")
    return _spearman(keep.double() @ scores, log_probs)


def precision_at_1(scores: Any, gold: Any) -> float:
    """Whether the top-scored source is a gold one (the source the answer came from).

    Ties are broken at random and the expectation is taken:
    :math:`|G \\cap T| / |T|`, with :math:`T` the sources of the highest score and :math:`G`
    the gold ones; without ties, 1 or 0. Sources of equal score are equally likely to be
    picked, so a method scoring every source the same gets :math:`|G| / F`, chance.

    Args:
        scores: (F,) one score per feature, no NaN.
        gold: the gold feature (an int) or several (a sequence of ints), in 0..F-1.

    Returns:
        float: in [0, 1].

    Example::

        >>> from captum_attnflow.evaluate import precision_at_1
        >>> precision_at_1([0.1, 0.7, 0.2], gold=1), precision_at_1([0.5, 0.5, 0.2, 0.5], gold=[0, 2])
        (1.0, 0.3333333333333333)
    """
    scores = _check_scores(scores)
    gold = _check_gold(gold, scores.numel())
    top = scores == scores.max()
    return float(top[gold].sum().double() / top.sum())


def recall_at_k(scores: Any, gold: Any, k: int = 3) -> float:
    """The fraction of the gold sources among the k top-scored ones.

    Ties are broken at random and the expectation is taken: a gold source :math:`g` with
    :math:`a_g` sources scored above it and :math:`t_g` scored the same (itself included) is
    in the top k with probability :math:`\\min(1, \\max(0, (k - a_g) / t_g))`, and recall@k
    is their mean over the gold sources. recall@1 is :func:`precision_at_1` divided by the
    number of gold sources.

    Args:
        scores: (F,) one score per feature, no NaN.
        gold: the gold feature (an int) or several (a sequence of ints), in 0..F-1.
        k: a positive int.

    Returns:
        float: in [0, 1]; NaN for k above F (fewer sources than k).

    Example::

        >>> from captum_attnflow.evaluate import recall_at_k
        >>> recall_at_k([0.1, 0.7, 0.2, 0.4], gold=[1, 0], k=2), recall_at_k([0.3, 0.3, 0.3, 0.9], gold=0, k=2)
        (0.5, 0.3333333333333333)
    """
    scores = _check_scores(scores)
    gold = _check_gold(gold, scores.numel())
    (k,) = _check_ks([k], "k")
    if k > scores.numel():
        return math.nan
    own = scores[gold][:, None]
    above = (scores[None] > own).sum(-1)
    tied = (scores[None] == own).sum(-1)
    return float(((k - above) / tied.double()).clamp(0, 1).mean())


def context_metrics(
    forward_func: Callable[[Tensor], Any],
    scores: Mapping[str, Any],
    gold: Any = None,
    ks: Sequence[int] = CONTEXTCITE_KS,
    ablations: int = LDS_ABLATIONS,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Every context metric of several methods on one example, from one batch of ablations.

    The full prompt, each method's top-k ablations and the ``ablations`` random masks of LDS
    (the same for every method) are run together, each distinct mask once: :math:`1 + m` +
    at most ``len(ks)`` per method forward passes of prompt + response.

    Args:
        forward_func: maps a bool (m, F) keep mask to (m,) log-probabilities, e.g.
            :class:`~captum_attnflow.evaluate.context_ablation.ResponseLogProb`.
        scores: ``{method: (F,) scores}``, one score per feature, no NaN.
        gold: the gold feature(s) (see :func:`precision_at_1`), or None when unknown.
        ks: the k's of the top-k drop and of recall@k.
        ablations, seed: LDS's random masks, see :func:`lds`.

    Returns:
        dict: ``{metric: {method: value}}``, metrics ``"top-{k}-drop"`` for each k, ``"lds"``,
        and with a gold ``"precision@1"`` and ``"recall@{k}"`` for each k above 1 (recall@1 is
        precision@1 / :math:`|G|`); all higher is better. :func:`context_leaderboard` ranks
        them over examples.

    Example::

        >>> import torch
        >>> from captum_attnflow.evaluate import context_metrics
        >>> weights = torch.tensor([2.0, -1.0, 0.5, 0.0])
        >>> linear = lambda keep: keep.double() @ weights.double()
        >>> values = context_metrics(linear, {"right": weights, "reversed": -weights}, gold=0, ks=[1])
        >>> values["top-1-drop"], values["lds"], values["precision@1"]
        ({'right': 2.0, 'reversed': -1.0}, {'right': 1.0, 'reversed': -1.0}, {'right': 1.0, 'reversed': 0.0})
    """
    if not isinstance(scores, Mapping) or not scores:
        raise TypeError("scores must be a non-empty mapping {method: (F,) scores}.")
    ks = _check_ks(ks)
    checked = {name: _check_scores(value, f"scores[{name!r}]") for name, value in scores.items()}
    sizes = {value.numel() for value in checked.values()}
    if len(sizes) > 1:
        raise ValueError(f"every method must score the same F features, got sizes {sorted(sizes)}.")
    (size,) = sizes
    random_keep = ablation_masks(size, ablations, seed)
    top = {name: top_k_masks(value, ks) for name, value in checked.items()}
    rows = torch.cat([torch.ones(1, size, dtype=torch.bool), random_keep, *top.values()])
    unique, inverse = torch.unique(rows, dim=0, return_inverse=True)
    log_probs = _log_probs(forward_func, unique)[inverse]
    full, random_log_probs = log_probs[0], log_probs[1 : 1 + ablations]
    start = 1 + ablations
    values: dict[str, dict[str, float]] = {}
    for index, (name, value) in enumerate(checked.items()):
        drops = _drops(full, log_probs[start + index * len(ks) : start + (index + 1) * len(ks)], ks, size)
        for k, drop in zip(ks, drops.tolist()):
            values.setdefault(f"top-{k}-drop", {})[name] = drop
        values.setdefault("lds", {})[name] = lds(None, value, keep=random_keep, log_probs=random_log_probs)
        if gold is not None:
            values.setdefault("precision@1", {})[name] = precision_at_1(value, gold)
            for k in ks:
                if k > 1:  # recall@1 is precision@1 / |G|
                    values.setdefault(f"recall@{k}", {})[name] = recall_at_k(value, gold, k)
    return values


def context_leaderboard(examples: Sequence[Mapping[str, Mapping[str, float]]], **kwargs: Any) -> Leaderboard:
    """The context metrics of several methods over examples, with bootstrap intervals and paired tests.

    Args:
        examples: one :func:`context_metrics` result per example, ``{metric: {method: value}}``;
            a method or metric missing from an example counts as undefined there (NaN, left
            out of its mean and of the paired tests of that example).
        kwargs: passed to :class:`~captum_attnflow.evaluate.Leaderboard` (``alpha``,
            ``confidence``, ``n_resamples``, ``seed``).

    Returns:
        Leaderboard: one ranking per metric (every metric higher is better): means with
        bootstrap intervals (:func:`~captum_attnflow.evaluate.bootstrap_interval`), Wilcoxon
        signed-rank tests of every pair (:func:`~captum_attnflow.evaluate.paired_test`),
        Holm-adjusted; its tables, CSV, forest plots and files.

    Example::

        >>> from captum_attnflow.evaluate import context_leaderboard
        >>> examples = [{"precision@1": {"ours": 1.0, "random": value}} for value in (0.0, 0.0, 1.0, 0.0, 0.0, 0.0)]
        >>> board = context_leaderboard(examples, n_resamples=99)
        >>> board.ranking("precision@1").names, board.ranking("precision@1").intervals["ours"].mean
        (['ours', 'random'], 1.0)
    """
    if isinstance(examples, Mapping) or not examples:
        raise TypeError("examples must be a non-empty sequence of context_metrics results, one per example.")
    metrics = list(dict.fromkeys(metric for example in examples for metric in example))
    values = {}
    for metric in metrics:
        methods = list(dict.fromkeys(method for example in examples for method in example.get(metric, {})))
        values[metric] = {
            method: np.array([example.get(metric, {}).get(method, math.nan) for example in examples], dtype=np.float64)
            for method in methods
        }
    return Leaderboard.from_values(values, **kwargs)


def _log_probs(forward_func: Callable[[Tensor], Any], keep: Tensor) -> Tensor:
    values = as_scores(forward_func(keep), "forward_func's output")
    if values.shape != (keep.shape[0],):
        raise ValueError(
            f"forward_func must return ({keep.shape[0]},) log-probabilities, one per mask, got shape {tuple(values.shape)}."
        )
    return values


def _drops(full: Tensor, ablated: Tensor, ks: list[int], size: int) -> Tensor:
    drops = full - ablated
    return drops.masked_fill(torch.tensor(ks) > size, math.nan)


def _spearman(x: Tensor, y: Tensor) -> float:
    if x.numel() < 2 or bool(torch.isnan(y).any()) or bool((x == x[0]).all()) or bool((y == y[0]).all()):
        return math.nan  # undefined; scipy would warn
    from scipy import stats  # on first use: importing scipy.stats takes a while

    return float(stats.spearmanr(x.numpy(), y.numpy()).statistic)


def _check_scores(scores: Any, name: str = "scores") -> Tensor:
    values = as_scores(scores, name)
    if values.dim() != 1 or values.numel() == 0:
        raise ValueError(f"{name} must be (F,) one score per source, got shape {tuple(values.shape)}.")
    if bool(torch.isnan(values).any()):
        raise ValueError(f"{name} contain NaN; the ranking of the sources is undefined.")
    return values


def _check_ks(ks: Any, name: str = "ks") -> list[int]:
    ks = list(ks) if isinstance(ks, (list, tuple, range)) else ks
    if not isinstance(ks, list) or not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"{name} must be positive ints, got {ks!r}.")
    return ks


def _check_gold(gold: Any, size: int) -> Tensor:
    indices = torch.as_tensor(gold).detach().cpu()
    if indices.dim() == 0:
        indices = indices[None]
    if (
        indices.dim() != 1 or indices.numel() == 0 or indices.dtype == torch.bool or indices.dtype.is_floating_point
        or bool(((indices < 0) | (indices >= size)).any()) or indices.unique().numel() != indices.numel()
    ):
        raise ValueError(f"gold must be a feature index in 0..{size - 1} or a list of distinct ones, got {gold!r}.")
    return indices.long()
