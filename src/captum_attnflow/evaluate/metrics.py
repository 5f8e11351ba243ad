"""The faithfulness metrics by name: their direction, and how the Evaluator computes each on a batch."""

from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from torch import Tensor

from captum_attnflow.evaluate.aopc import aopc_comprehensiveness, aopc_sufficiency
from captum_attnflow.evaluate.faithfulness import deletion_area, log_odds
from captum_attnflow.evaluate.ground_truth import subject_first
from captum_attnflow.evaluate.vision import perturbation_auc


def _on_tokens(function: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def call(model, batch, scores, exclude, options):
        return function(
            model, batch["input_ids"], scores, target=batch["target"], attention_mask=batch["attention_mask"],
            exclude=exclude, additional_forward_args=batch.get("additional_forward_args"), **options,
        )

    return call


def _on_ground_truth(model, batch, scores, exclude, options):
    return subject_first(scores, batch["subject_positions"], batch["attractor_positions"], **options)


def _on_pixels(model, batch, scores, exclude, options):
    return perturbation_auc(model, batch["pixel_values"], scores, target=batch["target"], **options)


@dataclass(frozen=True)
class Metric:
    """A faithfulness metric: its function, whether higher values are better, the batch keys
    it reads beside the attributions, and how a batch is passed to it."""

    function: Callable[..., Tensor]
    higher_is_better: bool
    batch_keys: tuple
    call: Callable[..., Tensor]


GROUND_TRUTH_KEYS = ("subject_positions", "attractor_positions")
_TOKENS = ("input_ids", "attention_mask")

METRICS: dict[str, Metric] = {
    "comprehensiveness": Metric(aopc_comprehensiveness, True, _TOKENS, _on_tokens(aopc_comprehensiveness)),
    "sufficiency": Metric(aopc_sufficiency, False, _TOKENS, _on_tokens(aopc_sufficiency)),
    "log-odds": Metric(log_odds, False, _TOKENS, _on_tokens(log_odds)),
    "deletion-area": Metric(deletion_area, True, _TOKENS, _on_tokens(deletion_area)),
    "subject-first": Metric(subject_first, True, GROUND_TRUTH_KEYS, _on_ground_truth),
    "positive-perturbation": Metric(perturbation_auc, False, ("pixel_values",), _on_pixels),
    "negative-perturbation": Metric(perturbation_auc, True, ("pixel_values",), _on_pixels),
}
# The context attribution metrics by name (captum_attnflow.evaluate.context: per example, from
# ablations of a prompt's sources, not the Evaluator's batches) and their direction; k a number of sources.
CONTEXT_METRICS: dict[str, bool] = {r"top-(\d+)-drop": True, "lds": True, r"precision@1": True, r"recall@(\d+)": True}
# What each metric name fixes of its function's arguments.
_FIXED = {"positive-perturbation": {"order": "positive"}, "negative-perturbation": {"order": "negative"}}
# The arguments the Evaluator passes itself.
_SUPPLIED = {"forward_func", "inputs", "attributions", "target", "attention_mask", "exclude", "additional_forward_args",
             "subject_positions", "attractor_positions", "tokenizer"}


def check_faithfulness(faithfulness: Any) -> dict[str, dict]:
    """The Evaluator's ``faithfulness`` argument as ``{name: {"metric": metric name, **options}}``,
    checked: known metrics, options their functions accept, values JSON can record (they go
    into the checkpoint's fingerprint)."""
    if faithfulness is None:
        return {}
    if isinstance(faithfulness, str):
        faithfulness = [faithfulness]
    if not isinstance(faithfulness, Mapping):
        faithfulness = {name: {} for name in faithfulness}
    checked = {}
    for name, options in faithfulness.items():
        if not isinstance(options, Mapping):
            raise TypeError(f"faithfulness[{name!r}] must be a dict of options, e.g. {{'deletion': 'mask'}}; got {options!r}.")
        options = dict(options)
        metric = options.pop("metric", name)
        if metric not in METRICS:
            raise ValueError(f"unknown faithfulness metric {metric!r}; choose from {sorted(METRICS)}.")
        accepted = set(inspect.signature(METRICS[metric].function).parameters) - _SUPPLIED - set(_FIXED.get(metric, {}))
        unknown = sorted(set(options) - accepted)
        if unknown:
            raise ValueError(f"faithfulness metric {metric!r} takes no option(s) {unknown}; it takes {sorted(accepted)}.")
        try:
            json.dumps(options)
        except TypeError as error:
            raise TypeError(
                f"the options of faithfulness metric {name!r} must be numbers, strings or lists of them "
                f"(they are recorded in checkpoints): {error}"
            ) from error
        checked[name] = {"metric": metric, **options}
    return checked


def compute_metric(
    model: Any, setting: Mapping[str, Any], batch: Mapping[str, Any], scores: Tensor, exclude: Tensor | None,
    tokenizer: Any = None,
) -> Tensor:
    """(B,) values of one checked ``setting`` (an entry of :func:`check_faithfulness`); a
    replacement token named in it (``"unk"``, ``"mask"``) is looked up on ``tokenizer`` first."""
    metric = METRICS[setting["metric"]]
    missing = [key for key in metric.batch_keys if batch.get(key) is None]
    if missing:
        hint = " (encode_examples gives them for the agreement data)" if metric.batch_keys == GROUND_TRUTH_KEYS else ""
        raise ValueError(f"faithfulness metric {setting['metric']!r} needs batch keys {missing}{hint}.")
    options = {key: value for key, value in setting.items() if key != "metric"}
    if tokenizer is not None and "tokenizer" in inspect.signature(metric.function).parameters:
        options["tokenizer"] = tokenizer
    return metric.call(model, batch, scores, exclude, {**_FIXED.get(setting["metric"], {}), **options})


def higher_is_better(metric: str) -> bool:
    """Whether higher values of the metric named ``metric`` (a key of :data:`METRICS`, or a
    context metric: ``"top-3-drop"``, ``"lds"``, ``"precision@1"``, ``"recall@5"``) are better."""
    if metric in METRICS:
        return METRICS[metric].higher_is_better
    for pattern, direction in CONTEXT_METRICS.items():
        if re.fullmatch(pattern, metric):
            return direction
    raise ValueError(f"the direction of metric {metric!r} is unknown; pass higher_is_better={{{metric!r}: True or False}}.")
