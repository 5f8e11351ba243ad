"""The experiment: held-out examples generated, sorted by length and batched, every score computed
and compared through the Evaluator under one protocol or both, gathered into a
:class:`~captum_attnflow.reproduce.Reproduction`."""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from captum_attnflow.data import generate_examples
from captum_attnflow.data.agreement import SHORT_SENTENCES
from captum_attnflow.evaluate import ComparisonResult, Evaluator
from captum_attnflow.methods import attention_methods, paper_methods
from captum_attnflow.models import load_agreement_model
from captum_attnflow.reproduce.authors import _dense_correlations
from captum_attnflow.reproduce.paper import OURS_REFERENCES, PAPER_REFERENCES
from captum_attnflow.reproduce.result import Reproduction
from captum_attnflow.reproduce.scoring import _encode, _Scorer

PROTOCOLS = ("ours", "paper")
# Held-out data: the generator's default mix, or inputs shaped like the paper's (median 7 words,
# mostly without attractors).
DATA = {"generated": {}, "short": SHORT_SENTENCES}
RANKINGS = ("average", "dense")


def reproduce(
    num_samples: int = 2000,
    seed: int = 0,
    batch_size: int = 200,
    model: Any = None,
    tokenizer: Any = None,
    include_cls: bool = False,
    progress: bool = True,
    protocol: str = "ours",
    data: str = "generated",
    ranking: str = "average",
    methods: Sequence[str] | None = None,
) -> Reproduction:
    """Compute the paper's Tables 1 and 2 and the ground-truth score on held-out generated data.

    For every example: the (L, n) scores of raw attention, rollout and flow of the CLS token
    after each layer, the references of the protocol(s), Spearman's rho of each attention
    method and layer with each reference (paper, section 2), and whether each method scores
    the subject above every attractor. Examples are sorted by length and run in batches
    through :class:`~captum_attnflow.evaluate.Evaluator`, so padding stays short; every score
    is computed once per batch (one forward pass serves the three attention methods).

    Args:
        num_samples: held-out examples (the paper: 2000).
        seed: seed of :func:`captum_attnflow.data.generate_examples` (``split="test"``, never
            a training sentence).
        batch_size: examples per batch.
        model, tokenizer: default the bundled model (:func:`captum_attnflow.load_agreement_model`);
            any :class:`~captum_attnflow.models.AgreementModel` and its tokenizer work, also one
            trained with an end token. The model runs in eval mode and is left in the mode it
            was in.
        include_cls: keep ``[CLS]`` among the ranked tokens of our protocol.
        progress: show a tqdm progress bar over the batches.
        protocol: ``"ours"`` (default) or ``"paper"``: the authors' definitions, computed
            beside ours (see the module docstring).
        data: ``"generated"`` (default, the generator's mix: median 11 words, attractors
            uniform over 0-3) or ``"short"`` (shaped like the paper's inputs:
            :data:`captum_attnflow.data.agreement.SHORT_SENTENCES`).
        ranking: ``"average"`` (default) or ``"dense"``: with ``protocol="paper"``, also the
            authors' Spearman formula (:func:`dense_rank_spearman`).
        methods: the per-layer methods of the tables, names of
            :func:`~captum_attnflow.methods.attention_methods` (default the paper's three,
            ``("raw", "rollout", "flow")``); e.g. ``("rollout", "alti", "value_zeroing")``.
            Class-specific ones (gradient-weighted rollout) explain the correct class.

    Returns:
        Reproduction: the tables (:meth:`Reproduction.to_markdown`), CSV files, a plot and the
        per-example values.

    Example::

        >>> from captum_attnflow.reproduce import reproduce
        >>> result = reproduce(num_samples=20, progress=False)  # the paper: 2000, about a minute
        >>> print(result.to_markdown())  # doctest: +ELLIPSIS
        Held-out accuracy of the model: 1.000 (20 examples), 1.000 on the 13 with attractors. Seed 0, ... s.
        <BLANKLINE>
        Table 1, our protocol (words ranked, [CLS] left out), CLS token after each layer; paper: 2000 examples
        <BLANKLINE>
        Spearman correlation with blank-out (20 examples, mean ± std)
        <BLANKLINE>
        | method | L1 | L2 | L3 | L4 | L5 | L6 |
        |---|---|---|---|---|---|---|
        | raw (ours) | 0.02 ± 0.40 | -0.00 ± 0.44 | -0.02 ± 0.36 | 0.08 ± 0.47 | 0.03 ± 0.42 | -0.05 ± 0.42 |
        | raw (paper) | 0.69 ± 0.27 | 0.10 ± 0.43 | -0.11 ± 0.49 | -0.09 ± 0.52 | 0.20 ± 0.45 | 0.29 ± 0.39 |
        | rollout (ours) | 0.02 ± 0.40 | 0.17 ± 0.35 | 0.24 ± 0.34 | 0.25 ± 0.33 | 0.26 ± 0.33 | 0.25 ± 0.33 |
        ...
        >>> paper = reproduce(num_samples=4, progress=False, protocol="paper")
        >>> paper.correlations.references
        ['blank-out', 'input gradients', '|blank-out|', 'gradient sum', 'gradient sum, float64']
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}.")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
    for name, value, allowed in (("protocol", protocol, PROTOCOLS), ("data", data, tuple(DATA)), ("ranking", ranking, RANKINGS)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}.")
    if ranking == "dense" and protocol != "paper":
        raise ValueError("ranking='dense' is the authors' Spearman formula: use it with protocol='paper'.")
    methods = paper_methods() if methods is None else tuple(methods)
    unknown = [name for name in methods if name not in attention_methods()]
    if unknown or not methods:
        raise ValueError(f"methods must be names of per-layer methods, {', '.join(attention_methods())}; got {list(methods)}.")
    if (model is None) != (tokenizer is None):
        raise ValueError("pass both model and tokenizer, or neither for the bundled model.")
    if model is None:
        model, tokenizer = load_agreement_model()
    start = time.perf_counter()
    examples = generate_examples(num_samples, seed=seed, split="test", **DATA[data])
    order = np.array(sorted(range(num_samples), key=lambda index: len(examples[index].words)))
    batches = [
        _encode([examples[i] for i in order[begin : begin + batch_size]], order[begin : begin + batch_size], tokenizer, include_cls)
        for begin in range(0, num_samples, batch_size)
    ]
    was_training = model.training
    model.eval()
    try:
        scorer = _Scorer(model, tokenizer, protocol, methods)
        explained = {name: scorer.method(name) for name in methods}
        ours = Evaluator(model, explained, {name: scorer.method(name) for name in OURS_REFERENCES},
                         exclude_special_tokens=True, show_progress=progress).run(batches)
        scores = dict(ours.scores)
        if protocol == "paper":
            # Every token ranked: the same scores, a second pass over the batches without exclusions.
            paper = Evaluator(model, explained, {name: scorer.method(name) for name in PAPER_REFERENCES},
                              show_progress=False).run(batches)
            scores.update(paper.scores)
            if ranking == "dense":
                scores.update(_dense_correlations([scorer.records[int(batch["example_ids"][0])] for batch in batches], methods))
    finally:
        model.train(was_training)
    # The Evaluator numbers examples in batch order; the reproduction keeps the generator's.
    correlations = ComparisonResult.merge([ComparisonResult(order[ours.example_ids], scores)])
    records = [scorer.records[int(batch["example_ids"][0])] for batch in batches]
    inverse = np.argsort(order)
    correct = np.concatenate([record["correct"] for record in records])[inverse]
    has_attractors = np.array([example.num_attractors > 0 for example in examples])
    subject_first, subject_tied = (
        {name: np.concatenate([record[key][name] for record in records], axis=1) for name in records[0][key]}
        for key in ("subject_first", "subject_tied")
    )
    num_attractors = np.concatenate([record["num_attractors"] for record in records])
    return Reproduction(
        correlations, subject_first, subject_tied, num_attractors, correct, has_attractors, seed,
        time.perf_counter() - start, protocol, data, ranking, include_cls, methods,
    )
