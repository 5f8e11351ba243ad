"""Attention attributions of generated text, as Captum's ``LLMAttribution`` returns them."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from captum.attr import Attribution, TextTemplateInput, TextTokenInput
from torch import Tensor, nn

from captum_attnflow.attr.alti import ALTI
from captum_attnflow.attr.attention_norm import AttentionNorm
from captum_attnflow.attr.attnlrp import AttnLRP
from captum_attnflow.attr.flow import AttentionFlow
from captum_attnflow.attr.gradient_rollout import GradientWeightedRollout
from captum_attnflow.attr.llm_inputs import (
    TemplatePrompt,
    TokenPreparation,
    check_options,
    default,
    pad,
    pad_id,
    sum_over_sources,
)
from captum_attnflow.attr.llm_result import LLMAttentionAttributionResult
from captum_attnflow.attr.raw_attention import RawAttention
from captum_attnflow.attr.rollout import AttentionRollout
from captum_attnflow.attr.value_zeroing import ValueZeroing
from captum_attnflow.capture import seq2seq_attentions
from captum_attnflow.functional.encoder_decoder import (
    encoder_decoder_flow,
    encoder_decoder_raw_attention,
    encoder_decoder_rollout,
)
from captum_attnflow.hf import input_device

try:  # transformers is a dependency, but keep the import error readable
    from transformers import PreTrainedModel
except ImportError:  # pragma: no cover
    PreTrainedModel = ()  # type: ignore[assignment,misc]

_JOINT_GRAPH = {
    RawAttention: encoder_decoder_raw_attention,
    AttentionRollout: encoder_decoder_rollout,
    AttentionFlow: encoder_decoder_flow,
}


class LLMAttentionAttribution(TokenPreparation, Attribution):
    """An attention method's scores of a language model's prompt for each token it writes.

    Mirrors Captum's :class:`~captum.attr.LLMAttribution`: wrap an attention method and a
    tokenizer, call :meth:`attribute` with a prompt and a target (or none, to generate one),
    get an :class:`~captum.attr.LLMAttributionResult`.

    * A decoder-only model (GPT-2, Llama, ... ``*ForCausalLM``) runs once on prompt + target.
      Output token :math:`t` is predicted at position :math:`p_t = n_{in} - 1 + t`, and row
      :math:`t` of ``token_attr`` is exactly what ``method.attribute(ids, position=p_t,
      layer=layer, ...)`` gives on prompt + target, restricted to the prompt: no renormalisation;
      the share on earlier output tokens is ``result.output_attr``.
    * An encoder-decoder (T5, BART, ``*ForConditionalGeneration``) runs once on the prompt
      (encoder) and the decoder start token + target (decoder); row :math:`t` is decoder
      position :math:`t` in the joint graph of encoder self-, decoder self- and cross-attention
      (:mod:`captum_attnflow.functional.encoder_decoder`), after decoder layer ``layer``.
    * :class:`~captum_attnflow.GradientWeightedRollout` explains each output token by the
      gradient of its own logit at the position that writes it (all positions from one forward
      pass and batched backward passes); on an encoder-decoder with Chefer et al.'s co-attention
      rules (:meth:`~captum_attnflow.GradientWeightedRollout.encoder_decoder_rows`).
      :class:`~captum_attnflow.AttnLRP` does the same (one backward pass per output token, its
      relevance not normalised; on an encoder-decoder over the source and the target prefix,
      :meth:`~captum_attnflow.AttnLRP.encoder_decoder_rows`).
      :class:`~captum_attnflow.ValueZeroing`, :class:`~captum_attnflow.ALTI` and
      :class:`~captum_attnflow.AttentionNorm` explain the models of the architecture table; on an
      encoder-decoder ALTI is ALTI+ (Ferrando et al., EMNLP 2022) and value zeroing composes on
      the same joint graph (:meth:`~captum_attnflow.ALTI.encoder_decoder_rows`), the norms are
      one decoder layer's, as raw attention.
    * A Captum ``TextTemplateInput`` is explained per source, its values, with any of these
      methods: a value's score is the sum of its tokens' scores,
      :math:`S_{t,f} = \\sum_{j \\in f} x_{t,j}` (a token across a boundary counted once, for the
      value holding most of its characters; see
      :func:`~captum_attnflow.attr.llm_inputs.token_sources`), and the template's own text is in
      no source but in ``result.template_attr``. The result is shaped as Captum's
      ``LLMAttribution`` gives it for a template (``input_tokens`` the values).

    On an encoder-decoder, ``token_attr`` holds the scores of the source tokens, ``output_attr``
    and ``decoder_start_attr`` those of the target prefix, and ``source_share`` and
    ``target_share`` their sums per output token: the source's and the target prefix's
    contributions, which sum to 1 for ALTI+, value zeroing and rollout.

    Args:
        attr_method: a :class:`~captum_attnflow.RawAttention`,
            :class:`~captum_attnflow.AttentionRollout`, :class:`~captum_attnflow.AttentionFlow`,
            :class:`~captum_attnflow.GradientWeightedRollout`, :class:`~captum_attnflow.ValueZeroing`,
            :class:`~captum_attnflow.ALTI`, :class:`~captum_attnflow.AttentionNorm` or
            :class:`~captum_attnflow.AttnLRP` built on the Hugging Face model itself.
        tokenizer: the model's tokenizer.

    Raises:
        TypeError: another method, or a model that is neither a causal LM nor an encoder-decoder.
    """

    SUPPORTED_METHODS = (
        RawAttention, AttentionRollout, AttentionFlow, GradientWeightedRollout, ValueZeroing, ALTI, AttentionNorm,
        AttnLRP,
    )

    def __init__(self, attr_method: Attribution, tokenizer: Any) -> None:
        if not isinstance(attr_method, self.SUPPORTED_METHODS):
            raise TypeError(
                f"LLMAttentionAttribution wraps {', '.join(m.__name__ for m in self.SUPPORTED_METHODS)}, got "
                f"{type(attr_method).__name__}; for Captum's own methods use captum.attr.LLMAttribution."
            )
        model = attr_method.forward_func
        self.encoder_decoder = bool(getattr(getattr(model, "config", None), "is_encoder_decoder", False))
        if not isinstance(model, PreTrainedModel) or not (self.encoder_decoder or model.can_generate()):
            raise TypeError(
                f"{type(attr_method).__name__} must be built on a Hugging Face language model: a causal LM "
                "(e.g. GPT2LMHeadModel, LlamaForCausalLM) or an encoder-decoder (e.g. T5ForConditionalGeneration), "
                f"got {type(model).__name__}."
            )
        super().__init__(model)
        self.attr_method = attr_method
        self.model: nn.Module = model
        self.tokenizer = tokenizer

    def attribute(
        self,
        inp: str | TextTokenInput | TextTemplateInput | Sequence[str | TextTokenInput | TextTemplateInput],
        target: str | Tensor | None | Sequence[str | Tensor | None] = None,
        layer: int = -1,
        max_new_tokens: int = 25,
        receptive_field: bool = False,
        drop_sink: bool = False,
        padding_side: str | None = None,
        contrast_target: str | Tensor | None | Sequence[str | Tensor | None] = None,
        **kwargs: Any,
    ) -> LLMAttentionAttributionResult | list[LLMAttentionAttributionResult]:
        """Scores of the prompt tokens for every output token, from one forward pass.

        Args:
            inp: the prompt: a string (tokenized with special tokens, as
                ``TextTokenInput`` does), Captum's ``TextTokenInput`` (its ``skip_tokens``
                leave columns out) or Captum's ``TextTemplateInput``, explained per source (its
                values, a list or a dict; values of one ``mask`` group are one source, each
                given the group's score; ``baselines`` are not used). A template is filled,
                put in the tokenizer's chat template when it has one (the prompt as the user's
                message, then the assistant's turn, as ``apply_chat_template(...,
                add_generation_prompt=True)``; a string prompt is not), tokenized by a fast
                tokenizer with character offsets, and each value's characters located in the
                text. A list of prompts, of any of these kinds, runs as one padded batch and
                returns a list of results.
            target: the output to explain: a string (tokenized without special tokens), a
                1-D tensor of token ids, or None to generate greedily (``max_new_tokens``).
                A list, one per prompt, for a list of prompts.
            layer: explain the positions after this layer, 1..L or negative from the top
                (of the decoder for an encoder-decoder). Default: -1, the last.
            max_new_tokens: the longest generated target; generation also stops at the model's
                last position.
            receptive_field: divide each score by the number of positions that can attend to
                the token within the explained position's context: for position :math:`p`
                and token :math:`j \\le p` of a causal model, :math:`p - j + 1`. Causal
                attention lets early tokens collect attention by construction (the first
                token is visible to every position); this undoes that count. Rows then no
                longer sum to 1. Decoder-only models; default False.
            drop_sink: leave the first prompt token (BOS, the usual attention sink) out of
                ``input_tokens``, ``token_attr`` and ``seq_attr``; its scores stay in
                ``result.sink_attr``. Default False.
            padding_side: ``"left"`` or ``"right"`` for a list of prompts of a decoder-only
                model (both give the same scores); None uses the tokenizer's. Encoder-decoders
                pad the source on the right.
            contrast_target: a contrastive explanation (Yin & Neubig, EMNLP 2022; inseq's
                ``contrast_targets``) with :class:`~captum_attnflow.GradientWeightedRollout` or
                :class:`~captum_attnflow.AttnLRP` on a decoder-only model: output token :math:`t` is explained by the gradient of
                its logit minus the logit of contrast token :math:`t` at the same position,
                why the model wrote ``"are"`` rather than ``"is"``. A string or token ids as
                ``target`` (a list, one per prompt); as many tokens as a given target, and a
                generated target is cut to its length. None (default): not contrastive.
            **kwargs: passed to the method's ``attribute``: ``show_progress`` for every method,
                ``head_fusion`` and ``residual_alpha`` for raw attention, rollout and flow,
                ``normalize`` for flow; for an encoder-decoder ``show_progress`` (the joint graph's
                raw attention and rollout take milliseconds and show none), and ``head_fusion``
                and ``residual_alpha`` (default: the method's) for the joint graph.

        Returns:
            LLMAttentionAttributionResult: ``token_attr`` (n_out, n_in) as described above;
            ``seq_attr`` (n_in) the mean of its rows, the average share of each prompt token
            over the output; ``output_attr``, ``sink_attr``, ``decoder_start_attr`` (see the
            class); ``input_tokens`` and ``output_tokens`` as ``tokenizer.convert_ids_to_tokens``
            gives them. For a ``TextTemplateInput``, F values: ``input_tokens`` the values,
            ``token_attr`` (n_out, F) the sums over each value's tokens, ``seq_attr`` (F,) the
            mean of its rows and ``template_attr`` (n_out,) the tokens in no value. A list of
            them for a list of prompts.

        Raises:
            ValueError: an empty prompt (only special tokens), token ids outside the model's
                vocabulary, a prompt (and target) longer than the model's positions, an empty
                target; a template whose values cannot be located in its text (a conversion
                or format spec that changes them, a chat template that rewrites the prompt).
            TypeError: a prompt of another type; a target that is neither text, integer token
                ids nor None; a keyword the method does not take; a template with a slow
                tokenizer (no character offsets).

        Example::

            >>> import torch
            >>> from captum_attnflow import AttentionRollout
            >>> from captum_attnflow.attr.llm import LLMAttentionAttribution
            >>> from captum_attnflow.models.language_model import load_agreement_lm
            >>> model, tokenizer = load_agreement_lm()
            >>> explainer = LLMAttentionAttribution(AttentionRollout(model), tokenizer)
            >>> result = explainer.attribute("the keys to the cabinet", target="are .")
            >>> result.input_tokens, result.output_tokens
            (['[CLS]', 'the', 'keys', 'to', 'the', 'cabinet'], ['are', '.'])
            >>> ids = tokenizer("the keys to the cabinet are .", return_tensors="pt")["input_ids"]
            >>> single = AttentionRollout(model).attribute(ids, position=5)  # the position that writes "are"
            >>> bool(torch.allclose(result.token_attr[0], single[0, :6]))
            True
            >>> fig, ax = result.plot_token_attr()  # Captum's heatmap

            Receptive-field normalisation takes the first token's advantage away:

            >>> result.input_tokens[result.token_attr[0].argmax()]
            '[CLS]'
            >>> fair = explainer.attribute("the keys to the cabinet", target="are .", receptive_field=True)
            >>> fair.input_tokens[fair.token_attr[0].argmax()]
            'cabinet'

            Why "are" rather than "is"? The gradient of the difference of their logits:

            >>> from captum_attnflow import GradientWeightedRollout
            >>> why = LLMAttentionAttribution(GradientWeightedRollout(model), tokenizer)
            >>> why.attribute("the keys to the cabinet", target="are", contrast_target="is").token_attr.shape
            torch.Size([1, 6])

            Scores per source: Captum's ``TextTemplateInput``, each value one source. The
            template's text (`` to ``) and ``[CLS]`` belong to none:

            >>> from captum.attr import TextTemplateInput
            >>> prompt = TextTemplateInput("{} to {}", values=["the keys", "the cabinet"])
            >>> sources = explainer.attribute(prompt, target="are .")
            >>> sources.input_tokens, sources.token_attr.shape
            (['the keys', 'the cabinet'], torch.Size([2, 2]))
            >>> bool(torch.allclose(sources.token_attr[:, 0], result.token_attr[:, 1:3].sum(1)))  # "the", "keys"
            True
            >>> bool(torch.allclose(sources.template_attr, result.token_attr[:, [0, 3]].sum(1)))  # "[CLS]", "to"
            True
        """
        single = not isinstance(inp, (list, tuple))
        prompts = [inp] if single else list(inp)
        if not prompts:
            raise ValueError("inp is an empty list: pass a prompt string or TextTokenInput.")
        targets = [target] if single else ([None] * len(prompts) if target is None else list(target))
        if len(targets) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(targets)} targets: pass one target (or None) per prompt.")
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise TypeError(f"layer must be one layer, an int (1..L or negative), got {layer!r}.")
        if receptive_field and self.encoder_decoder:
            raise ValueError(
                "receptive_field=True is for decoder-only models, whose causal attention favours early tokens; "
                "an encoder attends to every source token, so leave it False for an encoder-decoder."
            )
        inputs = [self._text_input(prompt) for prompt in prompts]
        device = input_device(self.model)
        prompt_ids = [self._prompt_ids(text, device) for text in inputs]
        output_ids = [self._target_ids(ids, t, max_new_tokens, device) for ids, t in zip(prompt_ids, targets)]
        if contrast_target is not None:
            contrasts = [contrast_target] if single else list(contrast_target)
            output_ids, kwargs["contrast"] = self._contrast_ids(prompt_ids, output_ids, targets, contrasts, device)
        if self.encoder_decoder:
            rows = self._encoder_decoder_rows(prompt_ids, output_ids, layer, kwargs)
        else:
            rows = self._decoder_rows(prompt_ids, output_ids, layer, padding_side, kwargs)
        results = [
            self._result(text, ids, out, row, receptive_field, drop_sink)
            for text, ids, out, row in zip(inputs, prompt_ids, output_ids, rows)
        ]
        return results[0] if single else results


    def _contrast_ids(
        self, prompts: list[Tensor], outputs: list[Tensor], targets: list, contrasts: list, device: torch.device
    ) -> tuple[list[Tensor], list[Tensor]]:
        """The outputs (generated ones cut to their contrast's length) and the contrast token ids."""
        if not isinstance(self.attr_method, (GradientWeightedRollout, AttnLRP)) or self.encoder_decoder:
            raise TypeError(
                "contrast_target explains the difference of two logits by its gradient: wrap GradientWeightedRollout or AttnLRP "
                f"built on a decoder-only model, got {type(self.attr_method).__name__}"
                + (" on an encoder-decoder." if self.encoder_decoder else ".")
            )
        if len(contrasts) != len(prompts) or any(c is None for c in contrasts):
            raise ValueError(f"got {len(prompts)} prompts but contrast_target {contrasts!r}: pass one contrast per prompt.")
        ids = [self._target_ids(prompt, c, 0, device) for prompt, c in zip(prompts, contrasts)]
        cut = []
        for output, contrast, target in zip(outputs, ids, targets):
            if contrast.numel() > output.numel() or (target is not None and contrast.numel() != output.numel()):
                raise ValueError(
                    f"the contrast has {contrast.numel()} tokens and the target {output.numel()}: each output token is "
                    "explained against the contrast token at the same place, give both the same number of tokens."
                )
            cut.append(output[: contrast.numel()])
        return cut, ids

    def _decoder_rows(
        self, prompts: list[Tensor], outputs: list[Tensor], layer: int, padding_side: str | None, kwargs: dict
    ) -> list[Tensor]:
        """Per example, (n_out, n_in + n_out): the method's row at each predicting position, padding removed."""
        side = padding_side or getattr(self.tokenizer, "padding_side", "right")
        if side not in ("left", "right"):
            raise ValueError(f'padding_side must be "left" or "right", got {side!r}.')
        sequences = [torch.cat([p, o]) for p, o in zip(prompts, outputs)]
        ids, mask, offsets = pad(sequences, pad_id(self.tokenizer, self.model), side)
        lengths = torch.tensor([o.numel() for o in outputs], device=ids.device)
        starts = torch.tensor([off + p.numel() - 1 for off, p in zip(offsets, prompts)], device=ids.device)
        # All predicting positions in one call, (B, max n_out): examples with fewer output tokens
        # repeat their last one; those rows are dropped below.
        steps = torch.arange(int(lengths.max()), device=ids.device)
        position = starts[:, None] + torch.minimum(lengths[:, None] - 1, steps[None, :])
        # Every method runs the model once and explains all predicting positions from that pass
        # (the paper's methods on the lean capture where the model allows it: no per-head map).
        if isinstance(self.attr_method, (GradientWeightedRollout, AttnLRP)):  # each position explains the token it writes
            kwargs = {"target": ids.gather(1, position + 1), **kwargs}
            if kwargs.get("contrast") is not None:  # the contrast token at the same place, (B, max n_out)
                contrast, _, _ = pad(kwargs["contrast"], 0, "right")
                kwargs["contrast"] = contrast.gather(1, position - starts[:, None])
        check_options(self.attr_method, kwargs)
        # (B, max n_out, N)
        scores = self.attr_method.attribute(ids, position=position, layer=layer, attention_mask=mask, **kwargs)
        return [
            scores[b, : o.numel(), off : off + s.numel()]
            for b, (o, s, off) in enumerate(zip(outputs, sequences, offsets))
        ]

    def _encoder_decoder_rows(
        self, prompts: list[Tensor], outputs: list[Tensor], layer: int, kwargs: dict
    ) -> list[Tensor]:
        """Per example, (n_out, n_in + n_out): the joint-graph row of each decoder position."""
        gradient = isinstance(self.attr_method, (GradientWeightedRollout, AttnLRP))
        joint = type(self.attr_method) in _JOINT_GRAPH
        options = {"show_progress"} | ({"head_fusion", "residual_alpha"} if joint else set())
        unknown = set(kwargs) - options
        if unknown:
            raise TypeError(
                f"unexpected arguments {sorted(unknown)} for an encoder-decoder with {type(self.attr_method).__name__}: "
                f"it takes {', '.join(sorted(options))}."
            )
        show_progress = kwargs.pop("show_progress", None)
        start = self.model.config.decoder_start_token_id
        if start is None:
            raise ValueError(f"{type(self.model).__name__}.config.decoder_start_token_id is None; set it to run the decoder.")
        pad_token = pad_id(self.tokenizer, self.model)
        source, source_mask, _ = pad(prompts, pad_token, "right")
        decoder_inputs = [torch.cat([o.new_tensor([start]), o[:-1]]) for o in outputs]
        decoder, decoder_mask, _ = pad(decoder_inputs, pad_token, "right")
        if gradient:  # each position explained for the token it writes
            written, _, _ = pad(outputs, pad_token, "right")
            scores = self.attr_method.encoder_decoder_rows(
                source, decoder, written, layer, source_mask, decoder_mask, show_progress=show_progress
            )
        elif not joint:  # the decompositions' per-layer maps on the joint graph (ALTI+)
            scores = self.attr_method.encoder_decoder_rows(
                source, decoder, layer, source_mask, decoder_mask, show_progress=show_progress
            )
        else:
            options = {"residual_alpha": default(self.attr_method, "residual_alpha"), **kwargs}
            if isinstance(self.attr_method, AttentionFlow):  # the joint graph's products take no time to show
                options["show_progress"] = show_progress
            maps = seq2seq_attentions(self.model, source, decoder, source_mask, decoder_mask)
            scores = _JOINT_GRAPH[type(self.attr_method)](
                maps.encoder, maps.decoder, maps.cross, layer=layer,
                attention_mask=source_mask, decoder_attention_mask=decoder_mask, **options,
            ).to(source.device)
        n = source.shape[1]
        return [
            torch.cat([scores[b, : o.numel(), : p.numel()], scores[b, : o.numel(), n : n + o.numel()]], -1)
            for b, (p, o) in enumerate(zip(prompts, outputs))
        ]

    def _result(
        self, text: TextTokenInput | TemplatePrompt, prompt: Tensor, output: Tensor, rows: Tensor, receptive_field: bool,
        drop_sink: bool,
    ) -> LLMAttentionAttributionResult:
        """Split (n_out, n_in + n_out) rows into the prompt's, the outputs' and the sink's shares."""
        n_in, n_out = prompt.numel(), output.numel()
        rows = rows.float()  # on the model's device, as Captum's LLM results are
        device = rows.device
        if receptive_field:
            # position n_in - 1 + t predicts output t; positions j..p can attend to token j
            predicting = torch.arange(n_out, device=device)[:, None] + n_in - 1
            rows = rows / (predicting - torch.arange(n_in + n_out, device=device)[None, :] + 1).clamp_min(1)
        prompt_rows, later = rows[:, :n_in], rows[:, n_in:]
        decoder_start = source_share = target_share = None
        start_token = ""
        if self.encoder_decoder:
            # the decoder's inputs are its start token and every output token but the last
            decoder_start = later[:, 0].clone()
            source_share, target_share = prompt_rows.sum(-1), later.sum(-1)
            start_token = self.tokenizer.convert_ids_to_tokens([self.model.config.decoder_start_token_id])[0] or ""
            later = torch.cat([later[:, 1:], later.new_zeros(n_out, 1)], 1)
        if isinstance(text, TemplatePrompt):
            sources = text.sources.to(device).clone()
            if drop_sink:
                sources[0] = -1
            # the mask groups' scores, each value given its group's, as Captum's format_attr does
            token_attr = text.inp.format_attr(sum_over_sources(prompt_rows, sources, text.inp.n_itp_features))
            input_tokens, template_attr = list(text.inp.values), prompt_rows[:, sources < 0].sum(1)
        else:
            columns = torch.ones(n_in, dtype=torch.bool) if text.itp_mask is None else text.itp_mask[0].cpu().bool().clone()
            columns = columns.to(device)
            if drop_sink:
                columns[0] = False
            token_attr = prompt_rows[:, columns]
            input_tokens = self.tokenizer.convert_ids_to_tokens(prompt[columns.to(prompt.device)].tolist())
            template_attr = None
        return LLMAttentionAttributionResult(
            input_tokens=input_tokens,
            output_tokens=self.tokenizer.convert_ids_to_tokens(output.tolist()),
            seq_attr=token_attr.mean(0),
            token_attr=token_attr,
            output_attr=later,
            sink_attr=prompt_rows[:, 0].clone(),
            decoder_start_attr=decoder_start,
            template_attr=template_attr,
            inp=text.inp if isinstance(text, TemplatePrompt) else text,
            method=type(self.attr_method).__name__,
            model_name=str(getattr(getattr(self.model, "config", None), "name_or_path", "") or ""),
            source_share=source_share,
            target_share=target_share,
            decoder_start_token=start_token,
        )
