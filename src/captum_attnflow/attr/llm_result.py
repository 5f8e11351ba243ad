"""The result of :class:`~captum_attnflow.attr.llm.LLMAttentionAttribution`: Captum's
``LLMAttributionResult`` with the shares outside the prompt, an HTML view, words and save/load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from captum.attr import LLMAttributionResult
from torch import Tensor

from captum_attnflow.saving import load_result, save_result
from captum_attnflow.words import groups_from_tokens, groups_with_tokenizer, reduce_groups, spell

_KIND = "LLMAttentionAttributionResult"
_TENSORS = (
    "seq_attr", "token_attr", "output_attr", "sink_attr", "decoder_start_attr", "template_attr", "source_share",
    "target_share",
)


class LLMAttentionAttributionResult(LLMAttributionResult):
    """Captum's :class:`~captum.attr.LLMAttributionResult` with the shares that fall outside the prompt.

    ``token_attr`` (n_out, n_in), ``seq_attr`` (n_in), ``input_tokens``, ``output_tokens``,
    ``plot_token_attr()`` and ``plot_seq_attr()`` are Captum's. Added:

    Attributes:
        output_attr: (n_out, n_out), ``[t, k]`` the score of output token ``k`` (as an input
            of later positions) for the position that predicts output token ``t``; 0 for
            ``k >= t``, which that position cannot see.
        sink_attr: (n_out,), the score of the first prompt token (BOS, or the first word when
            the tokenizer adds none), also when ``drop_sink=True`` leaves it out of ``token_attr``.
        decoder_start_attr: (n_out,) for an encoder-decoder, the score of the decoder's start
            token; None for a decoder-only model.
        template_attr: (n_out,) for a ``TextTemplateInput``, the score of the prompt tokens in no
            source (the template's own text, special tokens, a chat template's text; the first
            token with ``drop_sink=True``); None for a prompt of tokens. Summed with the sources
            (each mask group once) it gives the prompt's whole score.
        source_share, target_share: (n_out,) for an encoder-decoder, the sum of each output
            token's scores over the source tokens (all of them, ``skip_tokens`` included) and over
            the target prefix (the start token and the earlier output tokens): ALTI+'s source and
            target contributions (Ferrando et al., EMNLP 2022), which sum to 1 for ALTI, value
            zeroing and rollout. None for a decoder-only model.
        decoder_start_token: the decoder's start token as the tokenizer spells it (encoder-decoders).
        method: the attention method's class name ("AttentionRollout").
        model_name: the model's ``config.name_or_path``.

    For a ``TextTemplateInput`` the columns are its sources, as Captum's ``LLMAttribution`` gives
    them: ``input_tokens`` its values, ``token_attr`` (n_out, F) and ``seq_attr`` (F,) a score per
    value (the values of one mask group share the group's).

    A result is viewed as HTML (:meth:`to_html`, ``_repr_html_`` in a notebook: rows the
    output tokens, columns the prompt tokens or sources), merged into words
    (:meth:`aggregate_words`, both axes; the output alone for sources) and saved and loaded (:meth:`save`,
    :meth:`load`; no pickle).

    Example::

        >>> import tempfile, torch
        >>> from captum_attnflow.attr import LLMAttentionAttributionResult
        >>> result = LLMAttentionAttributionResult(
        ...     input_tokens=["<s>", "▁the", "▁ke", "ys"], output_tokens=["▁are", "▁green"],
        ...     seq_attr=torch.tensor([0.5, 0.1, 0.2, 0.2]), token_attr=torch.tensor([[0.6, 0.1, 0.2, 0.1], [0.4, 0.1, 0.2, 0.3]]),
        ...     output_attr=torch.tensor([[0.0, 0.0], [0.2, 0.0]]), sink_attr=torch.tensor([0.6, 0.4]))
        >>> words = result.aggregate_words()  # "▁ke" + "ys" is one word
        >>> words.input_tokens, [[round(value, 2) for value in row] for row in words.token_attr.tolist()]
        (['<s>', 'the', 'keys'], [[0.6, 0.1, 0.3], [0.4, 0.1, 0.5]])
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     files = result.save(f"{folder}/generated", compress=True)
        ...     LLMAttentionAttributionResult.load(files[0]) == result
        True
    """

    def __init__(
        self,
        *,
        input_tokens: list[str],
        output_tokens: list[str],
        seq_attr: Tensor,
        token_attr: Tensor,
        output_attr: Tensor,
        sink_attr: Tensor,
        decoder_start_attr: Tensor | None = None,
        template_attr: Tensor | None = None,
        inp: Any = None,
        method: str = "",
        model_name: str = "",
        source_share: Tensor | None = None,
        target_share: Tensor | None = None,
        decoder_start_token: str = "",
    ) -> None:
        super().__init__(
            input_tokens=input_tokens, output_tokens=output_tokens, seq_attr=seq_attr, token_attr=token_attr, inp=inp
        )
        self.output_attr = output_attr
        self.sink_attr = sink_attr
        self.decoder_start_attr = decoder_start_attr
        self.template_attr = template_attr
        self.method = method
        self.model_name = model_name
        self.source_share = source_share
        self.target_share = target_share
        self.decoder_start_token = decoder_start_token

    def _shown_input(self) -> str:
        """The page's input line: the whole prompt of a ``TextTemplateInput`` (its sources and
        the template's own text, the question), else the prompt's or the source's tokens."""
        if self.source_share is not None:
            return "source: " + " ".join(self.input_tokens)
        if self.template_attr is not None and hasattr(self.inp, "to_model_input"):
            return "prompt: " + " ".join(str(self.inp.to_model_input()).split())
        return "prompt: " + " ".join(self.input_tokens)

    def to_html(self, path: str | Path | None = None, title: str | None = None) -> str:
        """A self-contained HTML view: one row per output token, one cell per prompt token,
        coloured by ``token_attr`` (see :mod:`captum_attnflow.visualize.html`); written to
        ``path`` as a whole page when given. An encoder-decoder's rows hold the source tokens in
        red, then its target prefix (the start token and the earlier output tokens) in green, on
        one scale, each row labelled with its source share.

        Returns:
            str: the HTML (a fragment without ``path``, the page with it).
        """
        from captum_attnflow.visualize.html import Section, attribution_html

        rows = [f"{t + 1}: {token}" for t, token in enumerate(self.output_tokens)]
        # A model loaded from a local directory is named by that directory, not its whole path.
        model = Path(self.model_name).name if self.model_name and Path(self.model_name).is_dir() else self.model_name
        name = " ".join(part for part in (self.method, model) if part)
        scores = self.token_attr.detach().float().cpu()
        if self.source_share is None:
            unit = "score of the prompt token" if self.template_attr is None else "score of the source"
            section = Section(name, rows, self.input_tokens, scores.numpy(), unit)
        else:
            prefix = [self.decoder_start_token or "<start>", *self.output_tokens[:-1]]
            scores = torch.cat([scores, self.decoder_start_attr.detach().float().cpu()[:, None],
                                self.output_attr.detach().float().cpu()[:, :-1]], 1)
            shares = self.source_share.detach().float().cpu().tolist()
            rows = [f"{row} (source {share:.2f})" for row, share in zip(rows, shares)]
            groups = (("source", len(self.input_tokens)), ("target prefix", len(prefix)))
            section = Section(name, rows, [*self.input_tokens, *prefix], scores.numpy(), "score", groups)
        page = attribution_html(
            [section], title=title or self._shown_input(),
            prediction="output: " + " ".join(self.output_tokens), full_page=path is not None,
        )
        if path is not None:
            Path(path).write_text(page, encoding="utf-8")
        return page

    def _repr_html_(self) -> str:
        return self.to_html()

    def aggregate_words(self, tokenizer: Any = None, reduce: str = "sum") -> "LLMAttentionAttributionResult":
        """The result with sub-word pieces merged into words on both axes, prompt and output.

        Columns (prompt pieces) and rows (output pieces) of ``token_attr`` and ``output_attr``
        are reduced over each word by ``reduce`` (``"sum"``, ``"max"`` or ``"mean"``, as
        :func:`~captum_attnflow.words.aggregate_words`); ``sink_attr``, ``decoder_start_attr``,
        ``template_attr``, ``source_share`` and ``target_share`` over the output words;
        ``seq_attr`` is the mean of the new rows, as before. Words come from ``tokenizer`` (the
        text encoded again, its word ids used when it gives back the same pieces), else from the
        pieces' markers (``##``, ``Ġ``, ``▁``); special tokens stay apart. When the columns are sources (a
        ``TextTemplateInput``), they stay as they are and only the output is merged.
        """
        sources = self.template_attr is not None
        if tokenizer is not None:
            output = groups_with_tokenizer(self.output_tokens, tokenizer)
            prompt = None if sources else groups_with_tokenizer(self.input_tokens, tokenizer)
            special = getattr(tokenizer, "all_special_tokens", [])
        else:
            # the prompt's first token, when special (BOS); a source's text is not a token
            special = [] if sources else [token for token in self.input_tokens[:1] if token.startswith(("<", "["))]
            output = groups_from_tokens(self.output_tokens, special)
            prompt = None if sources else groups_from_tokens(self.input_tokens, special)
        columns = self.token_attr if prompt is None else reduce_groups(self.token_attr, prompt, reduce, -1)
        token_attr = reduce_groups(columns, output, reduce, 0)
        optional = {
            name: None if getattr(self, name) is None else reduce_groups(getattr(self, name), output, reduce, 0)
            for name in ("decoder_start_attr", "template_attr", "source_share", "target_share")
        }
        return LLMAttentionAttributionResult(
            input_tokens=list(self.input_tokens) if prompt is None else _words(self.input_tokens, prompt, tokenizer, special),
            output_tokens=_words(self.output_tokens, output, tokenizer, special),
            seq_attr=token_attr.mean(0), token_attr=token_attr,
            output_attr=reduce_groups(reduce_groups(self.output_attr, output, reduce, -1), output, reduce, 0),
            sink_attr=reduce_groups(self.sink_attr, output, reduce, 0),
            **optional, inp=self.inp, method=self.method, model_name=self.model_name,
            decoder_start_token=self.decoder_start_token,
        )

    def save(self, path: str | Path, compress: bool = False) -> list[Path]:
        """Write the tokens, scores, method and model name as JSON + safetensors (one zip with
        ``compress=True``), see :mod:`captum_attnflow.saving`; ``inp`` is not saved. Returns the
        files written (example in the class docstring)."""
        tensors = {name: getattr(self, name) for name in _TENSORS if getattr(self, name) is not None}
        fields = dict(input_tokens=list(self.input_tokens), output_tokens=list(self.output_tokens), method=self.method,
                      model_name=self.model_name, decoder_start_token=self.decoder_start_token)
        return save_result(path, _KIND, fields, tensors, compress)

    @classmethod
    def load(cls, path: str | Path) -> "LLMAttentionAttributionResult":
        """Read a result written by :meth:`save`.

        Raises:
            ValueError: not such a file (a damaged one included), or one of a newer format version.
        """
        fields, arrays = load_result(path, _KIND)
        tensors = {name: torch.from_numpy(arrays[name]) if name in arrays else None for name in _TENSORS}
        return cls(**fields, **tensors)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LLMAttentionAttributionResult):
            return NotImplemented
        for name in _TENSORS:
            mine, theirs = getattr(self, name), getattr(other, name)
            if (mine is None) != (theirs is None) or mine is not None and not torch.equal(torch.as_tensor(mine), torch.as_tensor(theirs)):
                return False
        return (list(self.input_tokens), list(self.output_tokens), self.method, self.model_name, self.decoder_start_token) == (
            list(other.input_tokens), list(other.output_tokens), other.method, other.model_name, other.decoder_start_token
        )


def _words(tokens: list[str], groups: list[list[int]], tokenizer: Any, special: list[str]) -> list[str]:
    if tokenizer is None:
        return spell(tokens, groups)
    return [
        tokens[group[0]] if len(group) == 1 and tokens[group[0]] in special
        else tokenizer.convert_tokens_to_string([tokens[j] for j in group]).strip()
        for group in groups
    ]
