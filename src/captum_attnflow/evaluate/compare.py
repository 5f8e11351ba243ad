"""Compare attributions from any source with reference attributions, per example and layer."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch
from torch import Tensor

from captum_attnflow.evaluate.results import ComparisonResult
from captum_attnflow.evaluate.spearman import as_scores, spearman


def compare(
    attributions: Mapping[str, Any],
    references: Mapping[str, Any],
    mask: Any = None,
    exclude: Any = None,
    example_ids: Any = None,
) -> ComparisonResult:
    """Spearman correlation of every attribution method with every reference, per example.

    Args:
        attributions: ``{name: scores}``, scores a tensor or array of shape (B, n) or, for a
            method with one map per layer (e.g. ``AttentionRollout(...).attribute(layer=None)``),
            (L, B, n). Any library's attributions work once reduced to one score per token.
        references: ``{name: (B, n) scores}``, e.g. blank-out and input gradients. A method
            with the same name as a reference is not compared with itself.
        mask: optional (B, n), 1/True on real tokens (the tokenizer's attention_mask).
        exclude: optional (B, n), 1/True on tokens to leave out, e.g. the tokenizer's
            ``special_tokens_mask`` for CLS/SEP.
        example_ids: optional (B,) ints identifying the examples (default 0..B-1); results of
            different batches merge by these.

    Returns:
        ComparisonResult: per-example correlations for each (method, reference, layer),
        layer 1..L for (L, B, n) methods and None for (B, n) ones. Rows without two real
        tokens, with constant or NaN scores give NaN, counted in the summaries.

    Example::

        >>> import torch
        >>> from captum_attnflow.evaluate import compare
        >>> result = compare({"random": torch.rand(3, 2, 5)}, {"reference": torch.rand(2, 5)})
        >>> [row["layer"] for row in result.summary()]
        [1, 2, 3]
    """
    if not isinstance(attributions, Mapping) or not isinstance(references, Mapping):
        raise TypeError("attributions and references must be mappings {name: scores}, e.g. {'rollout': scores}.")
    if not attributions or not references:
        raise ValueError("pass at least one attribution method and one reference.")
    methods = {name: _token_scores(values, f"attributions[{name!r}]") for name, values in attributions.items()}
    refs = {name: _token_scores(values, f"references[{name!r}]") for name, values in references.items()}
    for name, values in refs.items():
        if values.dim() != 2:
            raise ValueError(
                f"reference {name!r} must be (B, n) scores, one per token, got shape {tuple(values.shape)}"
                + (_PER_DIMENSION_FIX if values.dim() == 3 else ".")
            )
    shape = next(iter(refs.values())).shape
    for kind, mapping in (("reference", refs), ("method", methods)):
        for name, values in mapping.items():
            if values.dim() == 3 and tuple(values.shape[:2]) == tuple(shape) and tuple(values.shape[-2:]) != tuple(shape):
                raise ValueError(
                    f"{kind} {name!r} has shape {tuple(values.shape)}: (B, n, d) scores per embedding dimension"
                    + _PER_DIMENSION_FIX
                )
            if values.dim() not in (2, 3) or tuple(values.shape[-2:]) != tuple(shape):
                raise ValueError(
                    f"{kind} {name!r} has shape {tuple(values.shape)} but the references are (B, n) = "
                    f"{tuple(shape)}: every method must give (B, n) or (L, B, n) scores for the same "
                    "batch and tokenization (same B, same n)."
                )
    keep = _token_mask(mask, exclude, shape)
    ids = np.arange(shape[0]) if example_ids is None else np.asarray(as_scores(example_ids, "example_ids"), np.int64)
    if ids.shape != (shape[0],):
        raise ValueError(f"example_ids must have shape (B,) = ({shape[0]},), got {ids.shape}.")
    scores = {}
    for method, values in methods.items():
        layers = [(None, values)] if values.dim() == 2 else [(i + 1, v) for i, v in enumerate(values)]
        for reference, reference_values in refs.items():
            if reference == method:
                continue
            for layer, layer_values in layers:
                scores[(method, reference, layer)] = spearman(layer_values, reference_values, keep).numpy()
    if not scores:
        raise ValueError("nothing to compare: every method is also the only reference it would be compared with.")
    return ComparisonResult(ids, scores)


_PER_DIMENSION_FIX = (
    "; reduce them to one score per token first, e.g. scores.sum(-1) (signed) or scores.norm(dim=-1)."
)


def _token_scores(values: Any, name: str) -> Tensor:
    """Scores as a float64 tensor, refusing a Captum ``(attributions, delta)`` pair with the fix."""
    if isinstance(values, tuple) and len(values) == 2 and all(isinstance(v, Tensor) for v in values):
        raise TypeError(
            f"{name} is a tuple of two tensors, like the (attributions, delta) Captum returns for "
            "return_convergence_delta=True; pass the attributions alone, e.g. result[0]."
        )
    return as_scores(values, name)


def _token_mask(mask: Any, exclude: Any, shape: torch.Size) -> Tensor:
    keep = torch.ones(tuple(shape), dtype=torch.bool)
    for name, values, wanted in (("mask", mask, True), ("exclude", exclude, False)):
        if values is None:
            continue
        values = as_scores(values, name).bool()
        if values.shape != keep.shape:
            raise ValueError(f"{name} must have shape (B, n) = {tuple(shape)}, got {tuple(values.shape)}.")
        keep &= values if wanted else ~values
    return keep
