"""The whole study of Yang's "Is attention the only path?" on the bundled tasks, with its tables and plot.

:func:`run_study` trains, for each chosen tagger (Yang's 1-layer 4-head one, the 6-layer
8-head one with the bundled model's architecture) on chunking and for the bundled agreement
classifier:

1. the original (the bundled checkpoint for agreement);
2. a global adversary per :math:`\\lambda` (:mod:`~captum_attnflow.adversarial.global_adversarial`);
3. the baselines Wiegreffe & Pinter use to read those numbers: the model retrained with
   another seed, and one trained with uniform attention;
4. per-instance adversarial attention of the last layer (:mod:`~captum_attnflow.adversarial.per_instance`);
5. for the taggers, probing classifiers on the original's, two adversaries' and uniform
   attention (:mod:`~captum_attnflow.adversarial.probing`);
6. the Spearman table of raw attention, rollout and flow (:mod:`~captum_attnflow.adversarial.attributions`).

:class:`StudyResult` renders the tables as markdown, writes them as CSV and draws the
TVD-vs-JSD plot of Wiegreffe & Pinter's Figure 5.
"""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
from matplotlib.figure import Figure
from torch import nn

from captum_attnflow.adversarial.attributions import attribution_table
from captum_attnflow.adversarial.global_adversarial import ModelComparison, adversarial_models, compare_models, layer_mean
from captum_attnflow.adversarial.per_instance import per_instance_adversary
from captum_attnflow.adversarial.probing import probe_score
from captum_attnflow.adversarial.tasks import Task, agreement_task, chunking_task
from captum_attnflow.adversarial.training import copy_model, stored_attention, train, uniform_attention
from captum_attnflow.data import build_tokenizer
from captum_attnflow.models import AgreementConfig, AgreementModel, load_agreement_model
from captum_attnflow.models.tagger import TaggerConfig, TaggerModel, yang_tagger_config

DEFAULT_LAMBDAS = (0.0, 0.2, 0.5, 1.0, 2.0, 3.0)
MODELS = {
    "yang": "chunking, Yang's tagger (1 layer, 4 heads)",
    "deep": "chunking, 6-layer 8-head tagger",
    "agreement": "agreement, bundled classifier (6 layers, 8 heads)",
}
# Yang's Tables 1 and 2 (chunking F1 on real data, 1-layer 4-head tagger), shown beside ours.
YANG_F1 = {"original": 0.90, "lambda=0.2": 0.90, "lambda=3": 0.75}
YANG_PROBING_F1 = {"original": 0.90, "lambda=0.2": 0.90, "lambda=3": 0.89}


@dataclass
class FamilyResult:
    """Everything measured for one original model (a tagger or the agreement classifier).

    Attributes:
        name: key of :data:`MODELS`.
        metric: ``"F1"`` or ``"accuracy"``.
        rows: the original, the adversaries and the baselines against the original.
        per_instance: per example, the JSD reached by Jain & Wallace's attention and its TVD.
        epsilon: the TVD bound of the per-instance adversary.
        probing: probe test score by attention source (taggers only).
        attributions: rows of :func:`~captum_attnflow.adversarial.attributions.attribution_table`.
    """

    name: str
    metric: str
    rows: list[ModelComparison]
    per_instance: list[tuple[float, float]]
    epsilon: float
    probing: dict[str, float] = field(default_factory=dict)
    attributions: list[dict[str, object]] = field(default_factory=list)


@dataclass
class StudyResult:
    """The tables and plot of :func:`run_study`.

    Attributes:
        families: one :class:`FamilyResult` per original model.
        settings: the arguments of the run.
    """

    families: list[FamilyResult]
    settings: dict[str, object]

    def to_markdown(self) -> str:
        """The four tables (models, probing, per-instance, attributions) as markdown."""
        lines = ["### Global adversaries and baselines", ""]
        lines += [
            "| model | run | score | same label | TVD | JSD (mean over layers) | KL (mean) | JSD per layer |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for family in self.families:
            for row in family.rows:
                run = row.name if row.lam is None else f"adversary lambda={row.lam:g}"
                lines.append(
                    f"| {MODELS[family.name]} | {run} | {family.metric} {row.score:.3f} | {row.same:.3f} | "
                    f"{row.tvd:.4f} | {layer_mean(row.jsd):.3f} | {layer_mean(row.kl):.2f} | "
                    + " / ".join(f"{value:.2f}" for value in row.jsd) + " |"
                )
        probing = [family for family in self.families if family.probing]
        if probing:
            lines += ["", "### Probing classifiers (chunk F1; Yang's Table 2 on real data beside)", ""]
            lines += ["| model | attention | F1 | Yang |", "| --- | --- | ---: | ---: |"]
            for family in probing:
                for source, score in family.probing.items():
                    yang = YANG_PROBING_F1.get(source, math.nan) if family.name == "yang" else math.nan
                    lines.append(f"| {MODELS[family.name]} | {source} | {score:.3f} | {_number(yang)} |")
        lines += ["", "### Per-instance adversarial attention (last layer, all heads)", ""]
        lines += ["| model | examples | epsilon | mean JSD | median JSD | JSD > 0.5 | mean TVD |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for family in self.families:
            values = torch.tensor([j for j, _ in family.per_instance])
            tvds = torch.tensor([t for _, t in family.per_instance])
            lines.append(
                f"| {MODELS[family.name]} | {len(values)} | {family.epsilon:g} | {values.mean():.3f} | "
                f"{values.median():.3f} | {(values > 0.5).float().mean():.2f} | {tvds.mean():.4f} |"
            )
        lines += ["", "### Attributions: mean Spearman per layer", ""]
        for family in self.families:
            layers = sorted({row["layer"] for row in family.attributions})
            lines += [f"{MODELS[family.name]}:", ""]
            lines += ["| model | comparison | method | " + " | ".join(f"L{l}" for l in layers) + " |"]
            lines += ["| --- | --- | --- | " + " | ".join("---:" for _ in layers) + " |"]
            table: dict[tuple, dict[int, float]] = {}
            for row in family.attributions:
                table.setdefault((row["model"], row["comparison"], row["method"]), {})[row["layer"]] = row["spearman"]
            for (model, comparison, method), values in table.items():
                lines.append(f"| {model} | {comparison} | {method} | " + " | ".join(_number(values.get(l, math.nan)) for l in layers) + " |")
            lines.append("")
        return "\n".join(lines).rstrip() + "\n"

    def plot(self) -> Figure:
        """TVD of predictions against mean JSD of attention (Wiegreffe & Pinter's Figure 5), one panel per model."""
        figure = Figure(figsize=(4.2 * len(self.families), 3.8), layout="constrained")
        axes = figure.subplots(1, len(self.families), squeeze=False)[0]
        for ax, family in zip(axes, self.families):
            adversaries = [row for row in family.rows if row.lam is not None]
            x = [layer_mean(row.jsd) for row in adversaries]
            y = [row.tvd for row in adversaries]
            ax.plot(x, y, ":o", color="tab:blue", label="adversary (lambda)")
            for row, xi, yi in zip(adversaries, x, y):
                ax.annotate(f"{row.lam:g}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=8)
            for row in family.rows:
                if row.name == "other seed":
                    ax.plot(layer_mean(row.jsd), row.tvd, "^", color="tab:green", markersize=9, label="other seed")
                if row.name == "uniform":
                    ax.plot(layer_mean(row.jsd), row.tvd, "s", color="tab:red", markersize=8, label="uniform attention")
            if family.per_instance:
                values = torch.tensor(family.per_instance)
                ax.plot(values[:, 0].mean(), values[:, 1].mean(), "+", color="black", markersize=12, mew=2,
                        label="per-instance (last layer)")
            ax.axvline(math.log(2), color="grey", linewidth=0.8, linestyle="--")
            ax.set_xlim(0, 0.72)
            ax.set_xlabel("attention JSD to original (mean over layers)")
            ax.set_ylabel("prediction TVD to original")
            ax.set_title(MODELS[family.name], fontsize=9)
            ax.legend(fontsize=7)
        return figure

    def save(self, directory: str | Path) -> list[Path]:
        """Write ``adversarial.md``, ``models.csv``, ``probing.csv``, ``per_instance.csv``,
        ``attributions.csv`` and ``adversarial.png`` to ``directory``; return their paths."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / "adversarial.md"]
        paths[0].write_text(self.to_markdown())
        rows = []
        for family in self.families:
            for row in family.rows:
                record = {"model": family.name, "metric": family.metric, **asdict(row)}
                record["jsd"] = " ".join(f"{v:.6f}" for v in row.jsd)
                record["kl"] = " ".join(f"{v:.6f}" for v in row.kl)
                rows.append(record)
        paths.append(_write_csv(out / "models.csv", rows))
        paths.append(_write_csv(out / "probing.csv", [
            {"model": f.name, "attention": source, "f1": score} for f in self.families for source, score in f.probing.items()
        ]))
        paths.append(_write_csv(out / "per_instance.csv", [
            {"model": f.name, "example": i, "jsd": j, "tvd": t, "epsilon": f.epsilon}
            for f in self.families for i, (j, t) in enumerate(f.per_instance)
        ]))
        paths.append(_write_csv(out / "attributions.csv", [{"family": f.name, **row} for f in self.families for row in f.attributions]))
        paths.append(out / "adversarial.png")
        self.plot().savefig(paths[-1], dpi=120)
        return paths


def run_study(
    models: Sequence[str] = ("yang", "deep", "agreement"),
    lambdas: Sequence[float] = DEFAULT_LAMBDAS,
    train_examples: int = 4096,
    test_examples: int = 512,
    batch_size: int = 32,
    train_steps: int = 150,
    adversary_steps: int = 80,
    agreement_steps: int = 600,
    lr: float = 2e-3,
    per_instance_examples: int = 32,
    per_instance_steps: int = 100,
    epsilon: float = 0.01,
    attribution_batches: int = 1,
    seed: int = 0,
    progress: bool = True,
    agreement_model: nn.Module | None = None,
) -> StudyResult:
    """Run the study (module docstring) and return its tables.

    Args:
        models: which originals: ``"yang"``, ``"deep"`` (chunking taggers), ``"agreement"``
            (the bundled classifier, or ``agreement_model``).
        lambdas: the :math:`\\lambda` grid of the global adversaries.
        train_examples, test_examples, batch_size: sizes of each task's data (generated).
        train_steps: steps of every tagger trained from scratch (originals, other seed,
            uniform, probes).
        adversary_steps: steps of each adversary (initialised at the original's weights).
        agreement_steps: steps of the agreement classifiers trained from scratch (other seed,
            uniform); the task needs more than chunking (the bundled model had 3000 of 64).
        lr: peak learning rate of the models trained from scratch; adversaries use half.
        per_instance_examples, per_instance_steps, epsilon: size, optimisation steps and TVD
            bound of the per-instance adversary.
        attribution_batches: test batches (``batch_size`` sentences each) of the attribution table.
        seed: seed of data, initialisation and batch order; the baseline uses ``seed + 1``.
        progress: progress bars on training.
        agreement_model: the agreement classifier to study, default the bundled one.

    Returns:
        StudyResult

    Example::

        >>> result = run_study(models=("yang",), lambdas=(0.0, 1.0), train_examples=32, test_examples=8,
        ...     batch_size=8, train_steps=4, adversary_steps=2, per_instance_examples=2, per_instance_steps=2,
        ...     progress=False)  # a smoke run; the defaults are the study
        >>> [row.name for row in result.families[0].rows]
        ['original', 'adversarial', 'adversarial', 'other seed', 'uniform']
    """
    settings = {key: value for key, value in locals().items() if key not in ("progress", "agreement_model")}
    unknown = set(models) - set(MODELS)
    if unknown or not models:
        raise ValueError(f"models must be a non-empty selection of {sorted(MODELS)}, got {list(models)}.")
    if not lambdas or any(lam < 0 for lam in lambdas):
        raise ValueError(f"lambdas must be a non-empty list of values >= 0, got {list(lambdas)}.")
    sizes = dict(train_examples=train_examples, test_examples=test_examples, batch_size=batch_size, seed=seed)
    tasks: dict[str, Task] = {}
    families = []
    for name in models:
        task_name = "agreement" if name == "agreement" else "chunking"
        if task_name not in tasks:
            tasks[task_name] = (agreement_task if task_name == "agreement" else chunking_task)(**sizes)
        task = tasks[task_name]
        make = _factory(name)
        scratch_steps = agreement_steps if name == "agreement" else train_steps
        if name == "agreement":
            original = copy_model(agreement_model if agreement_model is not None else load_agreement_model()[0]).eval()
        else:
            torch.manual_seed(seed)
            original = train(make(), task, train_steps, lr, seed, progress=progress, desc=f"{name} original")
        rows = [compare_models(original, original, task, "original")]
        adversaries = adversarial_models(
            original, task, list(lambdas), adversary_steps, lr / 2, seed, progress, f"{name} adversary"
        )
        rows += [compare_models(original, model, task, "adversarial", lam) for lam, model in adversaries.items()]
        torch.manual_seed(seed + 1)
        other = train(make(), task, scratch_steps, lr, seed + 1, progress=progress, desc=f"{name} other seed")
        rows.append(compare_models(original, other, task, "other seed"))
        torch.manual_seed(seed)
        uniform = train(
            make(), task, scratch_steps, lr, seed, attention=uniform_attention, progress=progress, desc=f"{name} uniform"
        )
        rows.append(compare_models(original, uniform, task, "uniform", attention=uniform_attention))

        found = []
        for batch in task.test:
            if len(found) >= per_instance_examples:
                break
            result = per_instance_adversary(original, task, batch, layer=-1, epsilon=epsilon, steps=per_instance_steps)
            found += list(zip(result.jsd.tolist(), result.tvd.tolist()))
        family = FamilyResult(name, task.metric, rows, found[:per_instance_examples], epsilon)

        low, high = min((lam for lam in lambdas if lam > 0), default=None), max(lambdas)
        if task.per_token:
            sources = {"original": stored_attention(original)}
            if low is not None:
                sources[f"lambda={low:g}"] = stored_attention(adversaries[low])
            if high > 0 and high != low:
                sources[f"lambda={high:g}"] = stored_attention(adversaries[high])
            sources["uniform"] = uniform_attention
            family.probing = {
                source: probe_score(make, task, attention, train_steps, lr, seed, progress, f"{name} probe {source}")
                for source, attention in sources.items()
            }
        compared = {f"lambda={lam:g}": model for lam, model in adversaries.items()}
        compared["other seed"] = other
        family.attributions = attribution_table(original, compared, task, attribution_batches)
        families.append(family)
    return StudyResult(families, settings)


def _factory(name: str) -> Callable[[], nn.Module]:
    if name == "yang":
        return lambda: TaggerModel(yang_tagger_config(attn_implementation="eager"))
    if name == "deep":
        return lambda: TaggerModel(TaggerConfig(attn_implementation="eager"))
    return lambda: AgreementModel(AgreementConfig(vocab_size=len(build_tokenizer()), attn_implementation="eager"))


def _number(value: float) -> str:
    return "" if math.isnan(value) else f"{value:.2f}"


def _write_csv(path: Path, rows: list[dict[str, object]]) -> Path:
    with path.open("w", newline="") as handle:
        if rows:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return path
