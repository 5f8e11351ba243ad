"""Run attribution methods over a dataset, compare them with references and measure their
faithfulness, on one or many processes."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from captum_attnflow.evaluate._deletion import shared_forward_passes
from captum_attnflow.evaluate.batches import _batch_size, _inputs, _to
from captum_attnflow.evaluate.checkpoints import (
    _check_same_examples,
    _example_hashes,
    _load_checkpoint,
    _part_path,
    _save_final,
    _write_checkpoint,
)
from captum_attnflow.evaluate.compare import compare
from captum_attnflow.evaluate.metrics import METRICS, check_faithfulness, compute_metric
from captum_attnflow.evaluate.processes import _check_not_sharded, _gather, _gather_hashes, _process_group
from captum_attnflow.evaluate.results import ComparisonResult
from captum_attnflow.evaluate.spearman import as_scores
from captum_attnflow.hf import input_device, model_call
from captum_attnflow.methods import method_entry


class Evaluator:
    """Compare attribution methods with reference methods over a dataset, per example and layer,
    and measure how faithful each method is to the model.

    Each entry of ``methods`` and ``references`` (``{name: method}``) is one of

    * an attribution object with ``.attribute(inputs, ...)``: ours or any Captum-style class
      returning one score per token. It is called as
      ``method.attribute(input_ids, target=..., attention_mask=..., position=..., layer=None,
      show_progress=False)``, passing only the keyword arguments its ``attribute`` accepts:
      ``layer=None`` makes :class:`~captum_attnflow.AttentionRollout`,
      :class:`~captum_attnflow.AttentionFlow` and :class:`~captum_attnflow.RawAttention`
      return (L, B, n), one table column per layer; ``position`` comes from the batch when
      it has one.
    * an attribution class, e.g. ``AttentionRollout``: instantiated as ``cls(model)``.
    * a callable ``method(batch) -> (B, n) or (L, B, n)`` receiving the batch (tensors on the
      model's device, ``"target"`` added), for anything else, e.g. a fixed layer:
      ``lambda batch: rollout.attribute(batch["input_ids"], layer=3, attention_mask=batch["attention_mask"])``;
    * a name of :data:`~captum_attnflow.methods.METHODS` or
      :data:`~captum_attnflow.methods.EXTRA_METHODS` (``"alti"``, ``"gradient_rollout"``,
      ``"integrated_gradients"``, ...), built for ``model`` (and ``tokenizer``, which
      blank-out reads its unknown token from). ``methods`` and ``references`` may then be
      lists of names: ``Evaluator(model, ["rollout", "alti"], ["blankout"], tokenizer=tokenizer)``.

    A batch's ``"additional_forward_args"`` (a tuple, e.g. a sentence-embedding wrapper's
    reference embeddings) is passed to every method whose ``attribute`` takes it and to the
    token metrics, Captum's way: after the inputs.

    References must give (B, n). The explained class is ``batch[target]`` (default key
    ``"labels"``, the paper's "correct class") when the batch has it, else each example's
    predicted class; the faithfulness metrics measure the same class. A vision transformer's
    batches carry ``pixel_values`` (B, C, H, W) instead of ``input_ids``.

    ``faithfulness`` adds, beside the correlations, per-example faithfulness values of every
    method (every layer of a per-layer one) to the result's ``metrics``, ranked with
    confidence intervals and paired tests by :meth:`ComparisonResult.leaderboard`. It is a
    list of names from :data:`~captum_attnflow.evaluate.METRICS`:

    * ``"comprehensiveness"``, ``"sufficiency"``: ERASER's AOPC,
      :func:`~captum_attnflow.evaluate.aopc_comprehensiveness`, :func:`~captum_attnflow.evaluate.aopc_sufficiency`;
    * ``"log-odds"``: :func:`~captum_attnflow.evaluate.log_odds`;
    * ``"deletion-area"``: the area between the LeRF and MoRF curves, :func:`~captum_attnflow.evaluate.deletion_area`;
    * ``"subject-first"``: the ground truth of the agreement data (batches need
      ``subject_positions`` and ``attractor_positions``, as :func:`~captum_attnflow.data.encode_examples`
      gives them), :func:`~captum_attnflow.evaluate.subject_first`;
    * ``"positive-perturbation"``, ``"negative-perturbation"``: for vision transformers,
      :func:`~captum_attnflow.evaluate.perturbation_auc`;

    or a dict ``{name: options}`` of keyword arguments for the metric's function, e.g.
    ``{"comprehensiveness": {"deletion": "mask"}, "log-odds": {"fractions": [0.1, 0.2]}}``;
    ``"metric"`` among the options picks the metric for a name of your own, so one run can
    hold both ``{"comprehensiveness": {}, "comprehensiveness, mask": {"metric":
    "comprehensiveness", "deletion": "mask"}}``. Token metrics treat the tokens of
    ``special_tokens_mask`` as ``exclude`` when ``exclude_special_tokens`` is set. The
    options are recorded in the checkpoint: resuming with others is refused.

    Args:
        model: the model the methods explain; batches are moved to its device.
        methods: ``{name: method}``, the attributions to judge.
        references: ``{name: method}``, e.g. ``{"blank-out": BlankOut(model), "grad": TokenSaliency(model)}``.
        exclude_special_tokens: leave out tokens where ``batch["special_tokens_mask"]`` is 1
            (CLS, SEP) from the correlations; the batch must then carry that mask (tokenizers
            return it with ``return_special_tokens_mask=True``).
        target: the batch key holding the explained classes.
        show_progress: a tqdm bar over the batches (on the main process only).
        faithfulness: metric names, or ``{name: options}``, as above; None (default): none.
            references may then be empty (``{}``), to measure faithfulness alone.
        tokenizer: the model's tokenizer, for the methods given by name (blank-out's unknown
            token) and the metrics' replacement tokens by name (``deletion="mask"``); None:
            the model's config.

    Example::

        >>> import torch
        >>> from transformers import BertConfig, BertForSequenceClassification
        >>> from captum_attnflow import AttentionRollout, RawAttention
        >>> from captum_attnflow.baselines import BlankOut
        >>> from captum_attnflow.evaluate import Evaluator
        >>> model = BertForSequenceClassification(BertConfig(vocab_size=50, num_hidden_layers=2,
        ...     hidden_size=32, num_attention_heads=2, intermediate_size=64)).eval()
        >>> batches = [{"input_ids": torch.randint(5, 50, (4, 8))} for _ in range(2)]
        >>> result = Evaluator(model, {"raw": RawAttention, "rollout": AttentionRollout},
        ...     {"blank-out": BlankOut(model, token=1)}, show_progress=False).run(batches)
        >>> len(result)
        8
        >>> measured = Evaluator(model, {"raw": RawAttention, "rollout": AttentionRollout}, {},
        ...     faithfulness=["sufficiency", "deletion-area"], show_progress=False).run(batches)
        >>> len(measured.metrics)  # 2 methods x 2 layers x 2 metrics, 8 values each
        8
        >>> sorted(measured.leaderboard(n_resamples=99).ranking("sufficiency").names)
        ['raw L1', 'raw L2', 'rollout L1', 'rollout L2']
    """

    def __init__(
        self,
        model: Any,
        methods: Mapping[str, Any],
        references: Mapping[str, Any],
        exclude_special_tokens: bool = False,
        target: str = "labels",
        show_progress: bool = True,
        faithfulness: Any = None,
        tokenizer: Any = None,
    ) -> None:
        self.faithfulness = check_faithfulness(faithfulness)
        methods, references = _by_name(methods), _by_name(references)
        if not isinstance(methods, Mapping) or not isinstance(references, Mapping) or not methods or not (references or self.faithfulness):
            raise TypeError(
                "methods and references must be non-empty mappings {name: method} or lists of method names "
                "(references may be {} when faithfulness= names metrics)."
            )
        self.model = model
        self.tokenizer = tokenizer
        self.methods = {name: self._instantiate(name, method) for name, method in methods.items()}
        self.references = {name: self._instantiate(name, method) for name, method in references.items()}
        self.exclude_special_tokens = exclude_special_tokens
        self.target = target
        self.show_progress = show_progress

    def run(self, data: Iterable[Mapping[str, Any]], checkpoint: str | Path | None = None, save_every: int = 10) -> ComparisonResult:
        """Evaluate every batch of ``data`` and return the per-example comparison.

        Args:
            data: an iterable of batches (a list, a generator, a torch ``DataLoader``), each a
                dict with ``input_ids`` (B, n), optionally ``attention_mask``, ``labels``,
                ``position``, ``special_tokens_mask``. Examples are numbered in iteration
                order, so iterate in a fixed order (``shuffle=False``) to resume or merge.
            checkpoint: a ``.npz`` path. Scores found there (and in the ``.part<rank>.npz``
                files an interrupted run leaves) are reused and their batches skipped; the
                final result is saved there. Files are written whole or not at all (a
                temporary file, then a rename), and progress is saved when the run is
                interrupted (Ctrl-C, an error). A checkpoint records the methods and a hash of
                every example's tokens: resuming with other methods or other data is refused.
            save_every: write this process's partial scores every this many batches.

        Returns:
            ComparisonResult: Spearman correlations per example for every (method, reference,
            layer) and, with ``faithfulness``, the metrics' values per example for every
            (method, metric, layer), examples numbered from 0 in iteration order.

        Under ``accelerate launch --multi_gpu --num_processes w script.py`` (or ``torchrun``, any
        launcher setting ``WORLD_SIZE``), process ``r`` of ``w`` evaluates batches
        ``r, r + w, ...`` and the per-example scores are gathered, so every process returns
        the same result as a single-process run. Move the model to ``accelerator.device``
        (``PartialState().device``) first; a model on the CPU joins the processes over gloo, so
        the same command spreads the work over CPU cores on a machine without GPUs. Pass
        ``data`` itself, not ``accelerator.prepare(data)``: the Evaluator shards it.

        Example::

            >>> from captum_attnflow import AttentionRollout, load_agreement_model
            >>> from captum_attnflow.baselines import BlankOut
            >>> from captum_attnflow.data import encode_examples, generate_examples
            >>> model, tokenizer = load_agreement_model()
            >>> examples = generate_examples(16, split="test")
            >>> batches = [encode_examples(examples[start : start + 8], tokenizer) for start in (0, 8)]
            >>> evaluator = Evaluator(model, {"rollout": AttentionRollout},
            ...     {"blank-out": BlankOut(model, tokenizer=tokenizer)}, show_progress=False)
            >>> result = evaluator.run(batches)  # the explained class: batch["labels"]
            >>> len(result), [layer for (_, _, layer) in result.scores]
            (16, [1, 2, 3, 4, 5, 6])
        """
        rank, world = _process_group(_device(self.model))
        _check_not_sharded(data, world)
        fingerprint = self.fingerprint()
        done, hashes = (
            _load_checkpoint(checkpoint, fingerprint) if checkpoint is not None else (_empty_result(), {})
        )
        done_ids = set(done.example_ids.tolist())
        parts: list[ComparisonResult] = []
        offset = 0
        total = len(data) if hasattr(data, "__len__") else None
        bar = tqdm(data, total=total, desc="evaluating", disable=not self.show_progress or rank != 0)
        try:
            for index, batch in enumerate(bar):
                size = _batch_size(batch)
                ids = np.arange(offset, offset + size)
                offset += size
                if index % world != rank:
                    continue
                batch_hashes = _example_hashes(batch)
                if done_ids.issuperset(ids.tolist()):
                    _check_same_examples(checkpoint, ids, batch_hashes, hashes)
                    continue
                try:
                    parts.append(self.evaluate_batch(batch, example_ids=ids))
                except (TypeError, ValueError) as error:
                    raise type(error)(f"batch {index} (examples {ids[0]}..{ids[-1]}): {error}") from error
                hashes.update(zip(ids.tolist(), batch_hashes))
                if checkpoint is not None and len(parts) % save_every == 0:
                    # `done` goes in too: this file replaces the one it may have been loaded from.
                    _write_checkpoint(ComparisonResult.merge([done, *parts]), _part_path(checkpoint, rank), fingerprint, hashes)
        except BaseException:
            if checkpoint is not None and parts:  # keep what was computed: an interrupted run resumes from it
                _write_checkpoint(ComparisonResult.merge([done, *parts]), _part_path(checkpoint, rank), fingerprint, hashes)
            raise
        finally:
            bar.close()
        mine = ComparisonResult.merge([done, *parts])
        result = ComparisonResult.merge(_gather(mine)) if world > 1 else mine
        if checkpoint is not None:
            all_hashes = _gather_hashes(hashes) if world > 1 else hashes
            _save_final(result, checkpoint, rank, world, fingerprint, all_hashes)
        return result

    def fingerprint(self) -> str:
        """What a checkpoint must have been written with to be resumed: the names and classes
        of the methods and references, the comparison settings and the faithfulness metrics
        with their options."""
        described = {
            kind: {name: _describe(method) for name, method in mapping.items()}
            for kind, mapping in (("methods", self.methods), ("references", self.references))
        }
        described.update(exclude_special_tokens=self.exclude_special_tokens, target=self.target)
        if self.faithfulness:  # absent otherwise: checkpoints written before the option still resume
            described.update(faithfulness=self.faithfulness)
        return json.dumps(described, sort_keys=True)

    def evaluate_batch(self, batch: Mapping[str, Any], example_ids: Any = None) -> ComparisonResult:
        """Run every method and reference on one batch and compare them.

        Args:
            batch: a dict with ``input_ids`` (B, n) and optionally ``attention_mask``, the
                target key, ``position``, ``special_tokens_mask`` (as in :meth:`run`).
            example_ids: (B,) ids of the examples; default ``0..B-1``.

        Returns:
            ComparisonResult: the batch's correlations, to :meth:`ComparisonResult.merge`
            with others.

        Example::

            >>> import torch
            >>> from captum_attnflow import AttentionRollout, RawAttention, load_agreement_model
            >>> from captum_attnflow.baselines import TokenSaliency
            >>> model, tokenizer = load_agreement_model()
            >>> batch = dict(tokenizer(["the keys to the cabinet", "the key near the cabinets"],
            ...     padding=True, return_tensors="pt"), labels=torch.tensor([1, 0]))
            >>> evaluator = Evaluator(model, {"raw": RawAttention, "rollout": AttentionRollout},
            ...     {"grad": TokenSaliency(model)}, show_progress=False)
            >>> part = evaluator.evaluate_batch(batch, example_ids=[40, 41])
            >>> part.example_ids.tolist(), part.methods, len(part.scores)  # 2 methods x 6 layers
            ([40, 41], ['raw', 'rollout'], 12)
        """
        batch = self._prepare(batch)
        # The model runs in eval mode for every method, alone, and comes back as it was.
        with model_call(self.model):
            attributions = {name: self._attribute(name, method, batch) for name, method in self.methods.items()}
            references = {name: self._attribute(name, method, batch) for name, method in self.references.items()}
        exclude = batch.get("special_tokens_mask") if self.exclude_special_tokens else None
        ids = np.arange(_batch_size(batch)) if example_ids is None else np.asarray(example_ids, dtype=np.int64)
        scores = (
            compare(attributions, references, mask=batch["attention_mask"], exclude=exclude, example_ids=ids).scores
            if references else {}
        )
        directions = {name: METRICS[setting["metric"]].higher_is_better for name, setting in self.faithfulness.items()}
        return ComparisonResult(ids, scores, self._faithfulness(attributions, batch, exclude), directions)

    def _faithfulness(self, attributions: dict, batch: dict, exclude: Tensor | None) -> dict:
        """``{(method, metric, layer): (B,) float64}`` for every method, layer and metric; a row
        that several of them delete the same way runs through the model once."""
        values = {}
        with shared_forward_passes(), model_call(self.model):
            for method, scores in attributions.items():
                scores = as_scores(scores, f"attributions[{method!r}]").to(_device(self.model))
                layers = [(None, scores)] if scores.dim() != 3 else [(i + 1, layer) for i, layer in enumerate(scores)]
                for name, setting in self.faithfulness.items():
                    for layer, layer_scores in layers:
                        try:
                            value = compute_metric(self.model, setting, batch, layer_scores, exclude, self.tokenizer)
                        except (TypeError, ValueError) as error:
                            raise type(error)(f"faithfulness {name!r} of method {method!r}: {error}") from error
                        values[(method, name, layer)] = value.detach().cpu().double().numpy()
        return values

    def _instantiate(self, name: str, method: Any) -> Any:
        if inspect.isclass(method):
            return method(self.model)
        if isinstance(method, str):
            return method_entry(method).build(self.model, self.tokenizer)
        if not hasattr(method, "attribute") and not callable(method):
            raise TypeError(
                f"method {name!r} must have .attribute(inputs, ...), be an attribution class, a callable "
                f"method(batch) -> scores or a method name; got {type(method).__name__}."
            )
        return method

    def _prepare(self, batch: Mapping[str, Any]) -> dict:
        if not isinstance(batch, Mapping) or ("input_ids" not in batch and "pixel_values" not in batch):
            raise TypeError(
                "each batch must be a dict with 'input_ids' (B, n) (or an image model's 'pixel_values') and "
                f"optionally 'attention_mask', 'labels', 'position'; got {type(batch).__name__}"
                + (f" with keys {list(batch)}" if isinstance(batch, Mapping) else "")
            )
        device = _device(self.model)
        prepared = {key: _to(value, device) for key, value in batch.items()}
        if prepared.get("attention_mask") is None and "input_ids" in prepared:
            prepared["attention_mask"] = torch.ones_like(prepared["input_ids"])
        prepared.setdefault("attention_mask", None)  # images have no padding
        if self.exclude_special_tokens and "special_tokens_mask" not in prepared:
            raise ValueError(
                "exclude_special_tokens=True needs batch['special_tokens_mask']: tokenize with "
                "return_special_tokens_mask=True."
            )
        prepared["target"] = prepared.get(self.target)
        return prepared

    @staticmethod
    def _attribute(name: str, method: Any, batch: dict) -> Any:
        if not hasattr(method, "attribute"):
            return method(batch)
        accepted = inspect.signature(method.attribute).parameters
        offered = {
            "target": batch["target"],
            "attention_mask": batch["attention_mask"],
            "position": batch.get("position"),
            "layer": None,
            "show_progress": False,  # the Evaluator's bar is the one to watch
            "additional_forward_args": batch.get("additional_forward_args"),
        }
        kwargs = {key: value for key, value in offered.items() if key in accepted}
        for key in ("position", "attention_mask", "additional_forward_args"):  # absent from the batch; images have no mask
            if key in kwargs and kwargs[key] is None:
                del kwargs[key]
        try:
            return method.attribute(_inputs(batch), **kwargs)
        except (TypeError, ValueError) as error:
            raise type(error)(f"method {name!r} failed: {error}") from error


def _by_name(methods: Any) -> Any:
    """A list of method names as ``{name: name}``; anything else as it is."""
    if isinstance(methods, (list, tuple)) and all(isinstance(name, str) for name in methods):
        return {name: name for name in methods}
    return methods


def _device(model: Any) -> torch.device:
    """Where the model takes its batches (the first device of a model dispatched by accelerate)."""
    return input_device(model) or torch.device("cpu")


def _empty_result() -> ComparisonResult:
    return ComparisonResult(np.zeros(0, np.int64))


def _describe(method: Any) -> str:
    kind = method if inspect.isclass(method) else type(method)
    return f"{kind.__module__}.{kind.__qualname__}"
