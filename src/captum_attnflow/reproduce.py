"""Reproduce Tables 1 and 2 of Abnar & Zuidema (2020) on the bundled verb-number model.

Section 2 of the paper correlates, for 2000 held-out examples, the attention-based token
scores of the CLS embedding after each layer (raw attention, rollout, flow) with two
references computed on the model's output: blank-out (Table 1) and input gradients
(Table 2). :func:`reproduce` runs the same experiment on held-out generated data
(:func:`captum_attnflow.data.generate_examples` with ``split="test"``) and adds a score
with a ground truth no paper table has: how often a method ranks the verb's subject above
every agreement attractor.

Choices the paper leaves open, made here:

* both references explain the correct class (the paper: "the predicted probability of the
  correct class" for blank-out); blank-out replaces a token by ``[UNK]`` and takes the drop
  in that probability, input gradients are the L2 norm of the gradient of the class logit
  with respect to each token embedding (:class:`~captum_attnflow.baselines.TokenSaliency`);
* Spearman's rho is taken over the words of the sentence, leaving out ``[CLS]`` (set
  ``include_cls=True`` to keep it); undefined correlations (constant scores) are left out of
  the means and counted;
* raw attention is the head mean of the CLS row, rollout and flow use the paper's
  :math:`A = 0.5 W + 0.5 I` graph with head-mean fusion.
"""

from __future__ import annotations

import csv
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor
from tqdm.auto import tqdm

from captum_attnflow.attr import AttentionFlow, AttentionRollout, RawAttention
from captum_attnflow.baselines import BlankOut, TokenSaliency
from captum_attnflow.data import encode_examples, generate_examples
from captum_attnflow.evaluate import ComparisonResult, compare
from captum_attnflow.hf import extract_attentions
from captum_attnflow.models import load_agreement_model

ATTENTION_METHODS = ("raw", "rollout", "flow")
REFERENCES = ("blank-out", "input gradients")

# The paper's Tables 1 and 2 (2000 test examples of its verb-number model): per method, the
# mean and std of Spearman's rho for layers L1-L6. Reference values, printed beside ours.
PAPER_TABLES: dict[str, dict[str, tuple[tuple[float, float], ...]]] = {
    "blank-out": {
        "raw": ((0.69, 0.27), (0.10, 0.43), (-0.11, 0.49), (-0.09, 0.52), (0.20, 0.45), (0.29, 0.39)),
        "rollout": ((0.32, 0.26), (0.38, 0.27), (0.51, 0.26), (0.62, 0.26), (0.70, 0.25), (0.71, 0.24)),
        "flow": ((0.32, 0.26), (0.44, 0.29), (0.70, 0.25), (0.70, 0.22), (0.71, 0.22), (0.70, 0.22)),
    },
    "input gradients": {
        "raw": ((0.53, 0.33), (0.16, 0.38), (-0.06, 0.42), (0.00, 0.47), (0.24, 0.40), (0.46, 0.35)),
        "rollout": ((0.22, 0.31), (0.27, 0.32), (0.39, 0.32), (0.47, 0.32), (0.53, 0.32), (0.54, 0.31)),
        "flow": ((0.22, 0.31), (0.31, 0.34), (0.54, 0.32), (0.61, 0.28), (0.60, 0.28), (0.61, 0.28)),
    },
}
TABLE_NUMBERS = {"blank-out": 1, "input gradients": 2}
# Sequences per blank-out forward pass. Larger passes are slower per sequence on CPU, not
# faster: their activations outgrow the caches (the GELU's temporaries alone are 50 MB at
# 2400 sequences), and blank-out took 2x the CPU time with all positions of a 200-example
# batch in one pass than with one position per pass.
BLANK_OUT_SEQUENCES = 256
# Scores this close count as tied in the ground truth: flow gives many tokens the source's
# whole unit of flow, equal up to float32 rounding of the attention rows (~1e-7).
TIE_ATOL = 1e-6


@dataclass
class Reproduction:
    """What :func:`reproduce` measured.

    Attributes:
        correlations: per-example Spearman correlations of each attention method (layers
            1..L) with each reference, see :class:`captum_attnflow.evaluate.ComparisonResult`.
        subject_first: method -> bool (L, M) for attention methods, (1, M) for the references:
            whether the method scores the subject strictly above every attractor, on the M
            examples with at least one attractor.
        subject_tied: the same shapes: whether the subject's score equals the highest
            attractor score within ``TIE_ATOL`` (1e-6), so neither above nor below it.
        num_attractors: (M,) the number of attractors of those examples.
        correct: (N,) bool, whether the model predicts the verb's number of each example.
        has_attractors: (N,) bool.
        seed: the seed of the generated held-out examples.
        seconds: wall-clock time of the run.
        num_samples: N, the number of examples (property).

    Example::

        >>> from captum_attnflow.reproduce import reproduce
        >>> result = reproduce(num_samples=20, progress=False)
        >>> result.num_samples, result.subject_first["rollout"].shape  # (L, M): M examples with attractors
        (20, (6, 13))
        >>> [round(float(value), 3) for value in result.ground_truth()["rollout"]]
        [0.462, 0.769, 0.923, 1.0, 0.923, 0.923]
    """

    correlations: ComparisonResult
    subject_first: dict[str, np.ndarray]
    subject_tied: dict[str, np.ndarray]
    num_attractors: np.ndarray
    correct: np.ndarray
    has_attractors: np.ndarray
    seed: int
    seconds: float

    @property
    def num_samples(self) -> int:
        """N, the number of held-out examples."""
        return len(self.correct)

    def ground_truth(self) -> dict[str, np.ndarray]:
        """Method -> fraction of examples with attractors whose subject it ranks first, per layer
        ((L,) for attention methods, (1,) for the references), plus ``"chance"``: the expected
        fraction for scores in random order, the mean of 1 / (1 + attractors).

        Returns:
            dict[str, numpy.ndarray]: ``{"raw", "rollout", "flow"}`` (L,), ``{"blank-out",
            "input gradients", "chance"}`` (1,); example in the class docstring.
        """
        fractions = {name: first.mean(1) for name, first in self.subject_first.items()}
        fractions["chance"] = np.array([np.mean(1.0 / (1.0 + self.num_attractors))])
        return fractions

    def ground_truth_ties(self) -> dict[str, np.ndarray]:
        """Method -> fraction of examples with attractors where the subject's score ties with the
        highest attractor score (within 1e-6), per layer: neither a success nor a failure in
        :meth:`ground_truth`. Flow ties often: it gives every token that can absorb it the
        source's whole unit of flow.

        Returns:
            dict[str, numpy.ndarray]: ``{"raw", "rollout", "flow"}`` (L,), ``{"blank-out",
            "input gradients"}`` (1,).

        Example::

            >>> result = reproduce(num_samples=20, progress=False)
            >>> [round(float(value), 3) for value in result.ground_truth_ties()["flow"]]
            [0.0, 0.0, 0.0, 0.538, 0.538, 0.538]
        """
        return {name: tied.mean(1) for name, tied in self.subject_tied.items()}

    def table(self, reference: str) -> list[dict]:
        """Rows (method, layer, ours mean / std / count, paper mean / std) for one reference.

        Args:
            reference: ``"blank-out"`` (Table 1) or ``"input gradients"`` (Table 2).

        Returns:
            list[dict]: one row per (attention method, layer), the keys of
            :meth:`ComparisonResult.summary` plus ``paper_mean`` and ``paper_std`` (NaN
            beyond the paper's 6 layers).

        Example::

            >>> result = reproduce(num_samples=20, progress=False)
            >>> row = result.table("blank-out")[0]
            >>> row["method"], row["layer"], row["count"], row["paper_mean"]
            ('raw', 1, 20, 0.69)
        """
        rows = []
        for row in self.correlations.summary():
            if row["reference"] != reference:
                continue
            paper = PAPER_TABLES[reference][row["method"]]
            paper_mean, paper_std = paper[row["layer"] - 1] if row["layer"] <= len(paper) else (np.nan, np.nan)
            rows.append(dict(row, paper_mean=paper_mean, paper_std=paper_std))
        return rows

    def to_markdown(self) -> str:
        """Tables 1 and 2 (ours and the paper's), the ground-truth score and the model's accuracy.

        Returns:
            str: markdown, as written to ``reproduction.md`` by :meth:`save`; example in
            :func:`reproduce`.
        """
        accuracy = self.correct.mean()
        with_attractors = self.correct[self.has_attractors].mean() if self.has_attractors.any() else np.nan
        blocks = [
            f"Held-out accuracy of the model: {accuracy:.3f} ({self.num_samples} examples), "
            f"{with_attractors:.3f} on the {int(self.has_attractors.sum())} with attractors. "
            f"Seed {self.seed}, {self.seconds:.0f} s."
        ]
        for reference in REFERENCES:
            blocks.append(self._spearman_markdown(reference))
        blocks.append(self._ground_truth_markdown())
        return "\n\n".join(blocks)

    def _spearman_markdown(self, reference: str) -> str:
        rows = self.table(reference)
        layers = sorted({row["layer"] for row in rows})
        lines = [
            f"Table {TABLE_NUMBERS[reference]}: Spearman correlation with {reference}, "
            f"CLS token after each layer (mean ± std over {self.num_samples} examples; paper: 2000)",
            "",
            "| method | " + " | ".join(f"L{layer}" for layer in layers) + " |",
            "|---|" + "---|" * len(layers),
        ]
        for method in ATTENTION_METHODS:
            mine = {row["layer"]: row for row in rows if row["method"] == method}
            ours = [f"{mine[layer]['mean']:.2f} ± {mine[layer]['std']:.2f}" for layer in layers]
            paper = [f"{mine[layer]['paper_mean']:.2f} ± {mine[layer]['paper_std']:.2f}" for layer in layers]
            lines.append(f"| {method} (ours) | " + " | ".join(ours) + " |")
            lines.append(f"| {method} (paper) | " + " | ".join(paper) + " |")
        undefined = {row["method"]: row["nan_count"] for row in rows if row["nan_count"]}
        if undefined:
            counts = ", ".join(f"{method} {count}" for method, count in undefined.items())
            lines += ["", f"Left out as undefined (constant scores), most in any layer: {counts}."]
        return "\n".join(lines)

    def _ground_truth_markdown(self) -> str:
        fractions = self.ground_truth()
        count = len(self.num_attractors)
        layers = len(fractions[ATTENTION_METHODS[0]])
        lines = [
            f"Ground truth: fraction of the {count} examples with attractors where the method scores "
            "the subject above every attractor",
            "",
            "| method | " + " | ".join(f"L{layer}" for layer in range(1, layers + 1)) + " |",
            "|---|" + "---|" * layers,
        ]
        for method in ATTENTION_METHODS:
            lines.append(f"| {method} | " + " | ".join(f"{value:.3f}" for value in fractions[method]) + " |")
        lines += ["", "| reference | model output |", "|---|---|"]
        for name in (*REFERENCES, "chance"):
            lines.append(f"| {name} | {fractions[name][0]:.3f} |")
        tied = {name: values for name, values in self.ground_truth_ties().items() if values.any()}
        if tied:
            listed = "; ".join(f"{name} " + ", ".join(f"{value:.3f}" for value in values) for name, values in tied.items())
            lines += ["", f"Tied with the highest-scored attractor (within {TIE_ATOL:g}), neither above nor below: {listed}."]
        return "\n".join(lines)

    def to_csv(self, directory: str | Path) -> list[Path]:
        """Write ``table1_blank_out.csv``, ``table2_input_gradients.csv`` and ``ground_truth.csv``.

        Args:
            directory: an existing directory.

        Returns:
            list[Path]: the three files, in that order (the tables' rows are :meth:`table`'s).
        """
        directory = Path(directory)
        paths = []
        for reference in REFERENCES:
            path = directory / f"table{TABLE_NUMBERS[reference]}_{reference.replace('-', '_').replace(' ', '_')}.csv"
            fields = ["method", "reference", "layer", "mean", "std", "count", "nan_count", "paper_mean", "paper_std"]
            _write_csv(path, fields, self.table(reference))
            paths.append(path)
        path = directory / "ground_truth.csv"
        ties = self.ground_truth_ties()
        rows = [
            dict(method=name, layer=index + 1 if name in ATTENTION_METHODS else "", fraction=value,
                 tied_fraction=ties[name][index] if name in ties else "", examples=len(self.num_attractors))
            for name, values in self.ground_truth().items()
            for index, value in enumerate(values)
        ]
        _write_csv(path, ["method", "layer", "fraction", "tied_fraction", "examples"], rows)
        paths.append(path)
        return paths

    def plot(self) -> Figure:
        """Three panels: Spearman with blank-out and with input gradients per layer (ours as lines
        with a ±std band, the paper's as dotted lines), and the ground-truth score per layer.

        Returns:
            matplotlib.figure.Figure: a figure not registered with pyplot (nothing to close).
        """
        figure = Figure(figsize=(15, 4), layout="constrained")
        axes = figure.subplots(1, 3)
        for ax, reference in zip(axes[:2], REFERENCES):
            rows = self.table(reference)
            for index, method in enumerate(ATTENTION_METHODS):
                mine = sorted((row for row in rows if row["method"] == method), key=lambda row: row["layer"])
                layers = np.array([row["layer"] for row in mine])
                mean = np.array([row["mean"] for row in mine])
                std = np.array([row["std"] for row in mine])
                ax.plot(layers, mean, marker="o", color=f"C{index}", label=f"{method} (ours)")
                ax.fill_between(layers, mean - std, mean + std, color=f"C{index}", alpha=0.15)
                ax.plot(layers, [row["paper_mean"] for row in mine], linestyle=":", marker="x",
                        color=f"C{index}", label=f"{method} (paper)")
            ax.set_xticks(layers, [f"L{layer}" for layer in layers])
            ax.set_ylim(-1, 1)
            ax.set_title(f"Table {TABLE_NUMBERS[reference]}: Spearman with {reference}")
            ax.legend(fontsize="small")
        fractions = self.ground_truth()
        ties = self.ground_truth_ties()
        for index, method in enumerate(ATTENTION_METHODS):
            layers = np.arange(1, len(fractions[method]) + 1)
            axes[2].plot(layers, fractions[method], marker="o", color=f"C{index}", label=method)
            if ties[method].any():
                axes[2].plot(layers, fractions[method] + ties[method], linestyle=":", color=f"C{index}",
                             label=f"{method}, above or tied")
        for index, name in enumerate((*REFERENCES, "chance"), start=len(ATTENTION_METHODS)):
            axes[2].axhline(fractions[name][0], linestyle="--", color=f"C{index}", label=name)
        axes[2].set_xticks(layers, [f"L{layer}" for layer in layers])
        axes[2].set_ylim(0, 1)
        axes[2].set_title("subject scored above every attractor")
        axes[2].legend(fontsize="small")
        return figure

    def save(self, directory: str | Path) -> list[Path]:
        """Write ``reproduction.md``, the CSV files, ``reproduction.png`` and the per-example
        correlations ``correlations.npz`` into ``directory`` (created if needed).

        Args:
            directory: where to write; ``captum-attnflow reproduce --out DIR`` uses this.

        Returns:
            list[Path]: the files written.

        Example::

            >>> import tempfile
            >>> result = reproduce(num_samples=20, progress=False)
            >>> with tempfile.TemporaryDirectory() as folder:
            ...     print([path.name for path in result.save(folder)])
            ['reproduction.md', 'table1_blank_out.csv', 'table2_input_gradients.csv', 'ground_truth.csv', 'reproduction.png', 'correlations.npz']
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        markdown = directory / "reproduction.md"
        markdown.write_text(self.to_markdown() + "\n")
        figure_path = directory / "reproduction.png"
        self.plot().savefig(figure_path, dpi=120)
        correlations = directory / "correlations.npz"
        self.correlations.save(correlations)
        return [markdown, *self.to_csv(directory), figure_path, correlations]


def reproduce(
    num_samples: int = 2000,
    seed: int = 0,
    batch_size: int = 200,
    model: Any = None,
    tokenizer: Any = None,
    include_cls: bool = False,
    progress: bool = True,
) -> Reproduction:
    """Compute the paper's Tables 1 and 2 and the ground-truth score on held-out generated data.

    For every example: the (L, n) scores of raw attention, rollout and flow of the CLS token
    after each layer, blank-out and input gradients of the correct class, Spearman's rho of
    each attention method and layer with each reference (paper, section 2), and whether each
    method scores the subject above every attractor. Examples are sorted by length and run
    in batches, so padding stays short.

    Args:
        num_samples: held-out examples (the paper: 2000).
        seed: seed of :func:`captum_attnflow.data.generate_examples` (``split="test"``, never
            a training sentence).
        batch_size: examples per batch.
        model, tokenizer: default the bundled model (:func:`captum_attnflow.load_agreement_model`);
            any :class:`~captum_attnflow.models.AgreementModel` and its tokenizer work. The model
            runs in eval mode and is left in the mode it was in.
        include_cls: keep ``[CLS]`` among the ranked tokens.
        progress: show a tqdm progress bar over the examples.

    Returns:
        Reproduction: the tables (:meth:`Reproduction.to_markdown`), CSV files, a plot and the
        per-example values.

    Example::

        >>> from captum_attnflow.reproduce import reproduce
        >>> result = reproduce(num_samples=20, progress=False)  # the paper: 2000, about a minute
        >>> print(result.to_markdown())  # doctest: +ELLIPSIS
        Held-out accuracy of the model: 1.000 (20 examples), 1.000 on the 13 with attractors. Seed 0, ... s.
        <BLANKLINE>
        Table 1: Spearman correlation with blank-out, CLS token after each layer (mean ± std over 20 examples; paper: 2000)
        <BLANKLINE>
        | method | L1 | L2 | L3 | L4 | L5 | L6 |
        |---|---|---|---|---|---|---|
        | raw (ours) | 0.02 ± 0.40 | -0.00 ± 0.44 | -0.02 ± 0.36 | 0.08 ± 0.47 | 0.03 ± 0.42 | -0.05 ± 0.42 |
        | raw (paper) | 0.69 ± 0.27 | 0.10 ± 0.43 | -0.11 ± 0.49 | -0.09 ± 0.52 | 0.20 ± 0.45 | 0.29 ± 0.39 |
        | rollout (ours) | 0.02 ± 0.40 | 0.17 ± 0.35 | 0.24 ± 0.34 | 0.25 ± 0.33 | 0.26 ± 0.33 | 0.25 ± 0.33 |
        ...
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}.")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
    if (model is None) != (tokenizer is None):
        raise ValueError("pass both model and tokenizer, or neither for the bundled model.")
    if model is None:
        model, tokenizer = load_agreement_model()
    start = time.perf_counter()
    examples = generate_examples(num_samples, seed=seed, split="test")
    order = sorted(range(num_samples), key=lambda index: len(examples[index].words))
    was_training = model.training
    model.eval()
    try:
        batches = []
        with tqdm(total=num_samples, desc="reproduce", unit="example", disable=not progress) as bar:
            for begin in range(0, num_samples, batch_size):
                indices = order[begin : begin + batch_size]
                batches.append(_run_batch(model, tokenizer, [examples[i] for i in indices], indices, include_cls))
                bar.update(len(indices))
    finally:
        model.train(was_training)
    correlations = ComparisonResult.merge(batch["correlations"] for batch in batches)
    inverse = np.argsort(np.concatenate([batch["indices"] for batch in batches]))
    correct = np.concatenate([batch["correct"] for batch in batches])[inverse]
    has_attractors = np.array([example.num_attractors > 0 for example in examples])
    subject_first, subject_tied = (
        {name: np.concatenate([batch[key][name] for batch in batches], axis=1) for name in batches[0][key]}
        for key in ("subject_first", "subject_tied")
    )
    num_attractors = np.concatenate([batch["num_attractors"] for batch in batches])
    return Reproduction(
        correlations, subject_first, subject_tied, num_attractors, correct, has_attractors, seed,
        time.perf_counter() - start,
    )


def _run_batch(
    model: Any, tokenizer: Any, examples: Sequence, indices: Sequence[int], include_cls: bool
) -> dict[str, Any]:
    """Scores, correlations and ground-truth checks of one batch of examples."""
    batch = encode_examples(examples, tokenizer)
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    with torch.no_grad():
        predictions = model(ids, attention_mask=mask).logits.argmax(-1)
    # One forward pass serves the three attention methods: they accept any callable that
    # returns the attentions.
    attentions = extract_attentions(model, ids, attention_mask=mask)
    attention_scores = {
        name: method(lambda _: attentions).attribute(ids, layer=None, attention_mask=mask)
        for name, method in (("raw", RawAttention), ("rollout", AttentionRollout), ("flow", AttentionFlow))
    }
    references = {
        "blank-out": BlankOut(model, tokenizer=tokenizer).attribute(
            ids, target=labels, attention_mask=mask, perturbations_per_eval=max(1, BLANK_OUT_SEQUENCES // len(ids))
        ),
        "input gradients": TokenSaliency(model).attribute(ids, target=labels, attention_mask=mask),
    }
    exclude = torch.zeros_like(mask, dtype=torch.bool)
    if not include_cls:
        exclude[:, 0] = True
    correlations = compare(attention_scores, references, mask=mask, exclude=exclude, example_ids=indices)

    attractors = batch["attractor_positions"]
    with_attractors = (attractors >= 0).any(1)
    subject_first, subject_tied = {}, {}
    for name, scores in {**attention_scores, **{k: v[None] for k, v in references.items()}}.items():
        above, tied = _subject_versus_attractors(scores, batch["subject_positions"], attractors)
        subject_first[name] = above[:, with_attractors].numpy()
        subject_tied[name] = tied[:, with_attractors].numpy()
    return dict(
        correlations=correlations,
        subject_first=subject_first,
        subject_tied=subject_tied,
        num_attractors=(attractors >= 0).sum(1)[with_attractors].numpy(),
        correct=(predictions == labels).numpy(),
        indices=np.asarray(indices),
    )


def _subject_versus_attractors(scores: Tensor, subjects: Tensor, attractors: Tensor) -> tuple[Tensor, Tensor]:
    """(L, B) bool twice: the subject's score is above every attractor's, and it ties with the
    highest of them (within ``TIE_ATOL``); "above" excludes ties.

    Args:
        scores: (L, B, n). subjects: (B,) positions. attractors: (B, K) positions, -1 for none.
    """
    num_layers = scores.shape[0]
    subject = scores.gather(2, subjects[None, :, None].expand(num_layers, -1, 1))[..., 0]
    at_attractors = scores.gather(2, attractors.clamp(min=0)[None].expand(num_layers, -1, -1))
    best_attractor = at_attractors.masked_fill(attractors[None] < 0, float("-inf")).amax(2)
    tied = (subject - best_attractor).abs() <= TIE_ATOL
    return (subject > best_attractor) & ~tied, tied


def _write_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fields)
        writer.writeheader()
        writer.writerows(rows)
