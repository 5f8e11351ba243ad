"""AttnLRP (Achtibat et al., ICML 2024): layer-wise relevance propagation through attention, as a Captum attribution."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from captum.attr import GradientAttribution
from torch import Tensor

from captum_attnflow.attr._base import (
    _PROGRESS_DOC,
    AttentionAttribution,
    as_returned,
    explained_positions,
    given_positions,
    progress_bar,
    with_recompute_args,
)
from captum_attnflow.attr.gradient_rollout import _TARGET_DOC
from captum_attnflow.capture import seq2seq_attnlrp_forward
from captum_attnflow.capture.lrp import attnlrp_run
from captum_attnflow.capture.recompute import recomputes
from captum_attnflow.docstrings import fill_docstring
from captum_attnflow.functional.checks import POSITION_DOC, as_mask
from captum_attnflow.hf import check_token_ids, output_scores, target_scores

_ARGS_DOC = """
        Args:
            inputs (Tensor or BatchEncoding): token ids (B, n) or the tokenizer's output (its
                ``input_ids`` and ``attention_mask``); or a vision transformer's pixel values
                (B, C, H, W), whose n tokens are its class token(s) and patches."""
_ARGS_DOC += _TARGET_DOC + """
            additional_forward_args (Any, optional): extra positional arguments passed to
                ``forward_func`` after ``inputs`` (a Hugging Face model's attention mask given
                last here, Captum's way, is used as ``attention_mask``).
            position (int, list or Tensor, optional): for a language model's (B, n, V) logits,
                """ + POSITION_DOC.replace("\n            ", "\n                ") + """
                None (default): each example's last real token for a causal model, else 0.
                Each position explains its own logit; for a classifier's (B, C) scores every
                position gives the same row.
            layer: accepted for the common call of the attention methods: AttnLRP explains
                the model's output, so only -1 (the last layer) or None is accepted."""
_MASK_DOC = """
            attention_mask (Tensor, optional): (B, n), 1 on real tokens, 0 on padding (either
                side); padding gets relevance 0. Passed to a Hugging Face model as ``attention_mask``."""
_SHARES_DOC = _ARGS_DOC.split("\n            layer:")[0] + _MASK_DOC + "\n"
_ARGS_DOC += _MASK_DOC + _PROGRESS_DOC + "\n"


@with_recompute_args
class AttnLRP(AttentionAttribution, GradientAttribution):
    """AttnLRP (Achtibat, Hatefi, Dreyer, Jain, Wiegand, Lapuschkin & Samek, ICML 2024): the
    explained logit :math:`y_t` propagated back to the input tokens by layer-wise relevance
    propagation with rules for attention, in its gradient form (one forward, one backward pass).

    .. math::
        R_j = \\sum_d e_{jd}\\, \\tilde\\nabla_{e_{jd}} y_t,

    with :math:`e_j` token j's embedding (the input embedding layer's output; position and
    token-type embeddings keep their own share) and :math:`\\tilde\\nabla` the gradient with the
    paper's rules in place of some layers' Jacobians:

    * bilinear products :math:`q k^\\top` and :math:`A v`, and the gated product
      :math:`\\mathrm{act}(W_g x) \\odot W_u x`: uniform rule, each factor half the relevance
      (so queries and keys a quarter, values a half);
    * softmax: Proposition 3.1's linearisation, :math:`R_s = s \\odot (R_A - A \\sum R_A)` on the
      scores s, which is the plain gradient times input;
    * LayerNorm and RMSNorm: identity rule on the division, :math:`1/\\sigma` held constant
      (centring and affine parts as they are); element-wise activations (GELU, SiLU, tanh):
      identity rule, gradient :math:`f(x)/x`;
    * linear layers, embeddings, rotary positions, residual sums: the plain gradient (ε-rule with
      ε = 0); dropout off.

    Relevance is conserved layer by layer except for what biases keep, what the softmax
    linearisation loses (:math:`\\sum_j s_j(R_{A,j} - A_j \\sum R_A) \\ne \\sum R_A`) and, at
    the input, the position and token-type embeddings' share; so :math:`\\sum_j R_j` differs from
    :math:`y_t` by those terms (:meth:`shares` books each). Scores are signed and not
    normalised. On the bundled agreement language model, 50% of the explained logit reaches the
    tokens (positions 9%, biases 13%, softmax linearisation 29%). On tiny float64 models of
    eleven families it agrees with the authors' implementation (LXT's efficient mode on
    transformers 5) to float rounding, 1e-10 to 3e-7 of the largest relevance, but for the
    mixtures' routers, which are held constant here (``benchmarks/lxt_agreement.py``).

    The model runs with its own layers and forward values (each rule changes a gradient only);
    the rules come from transformers' attention-function interface (for the families whose
    attention runs in their own modules, hooks on their query, key and value projections) and the
    architecture table (:mod:`captum_attnflow.capture.lrp`): the model types of
    :data:`~captum_attnflow.hf.architectures.ARCHITECTURES`; an encoder-decoder's through
    :meth:`encoder_decoder_rows`. Parameters' ``.grad`` are not touched; it runs under
    ``torch.no_grad()`` too.

    Args:
        forward_func: a Hugging Face model (classifier, language model, vision transformer), or
            a module containing one that returns the score to explain. The model is left as it
            was: attention implementation, mode and hooks change only for the call.
        {recompute}
            :meth:`attribute` only: :meth:`shares` keeps every biased layer's output anyway.
    """

    def __init__(self, forward_func: Any, recompute: bool | None = None) -> None:
        AttentionAttribution.__init__(self, forward_func)
        self.recompute = recompute

    @property
    def multiplies_by_inputs(self) -> bool:
        """True: the relevance is the token embeddings times their (modified) gradient (Captum's interface)."""
        return True

    @fill_docstring(args=_ARGS_DOC)
    def attribute(
        self,
        inputs: Tensor,
        target: Any = None,
        additional_forward_args: Any = None,
        position: int | list[int] | Tensor | None = None,
        layer: int | None = -1,
        attention_mask: Tensor | None = None,
        contrast: Any = None,
        show_progress: bool | None = None,
    ) -> Tensor:
        """AttnLRP relevance of every input token for the score ``target`` (minus ``contrast``'s).
{args}
        Returns:
            Tensor: (B, n), (B, S, n) for a list or (B, S) ``position``; float32 (float64 for a
            float64 model), on the inputs' device. Padding gets 0.

        Example::

            >>> from captum_attnflow import AttnLRP, load_agreement_model
            >>> model, tokenizer = load_agreement_model()
            >>> ids = tokenizer(["the keys to the cabinet"], return_tensors="pt")["input_ids"]
            >>> relevance = AttnLRP(model).attribute(ids, target=1)  # the plural class
            >>> relevance.shape
            torch.Size([1, 6])
        """
        if layer not in (-1, None):
            raise ValueError(
                f"AttnLRP explains the model's output, not a layer's representation: pass layer=-1 or None, got {layer!r}."
            )
        rows = []
        with self._scores(inputs, target, additional_forward_args, position, attention_mask, contrast,
                          shares=False) as (inputs, run, mask, sources, has_axis, scores):
            with torch.enable_grad(), progress_bar(show_progress, inputs, "AttnLRP", "backward", scores.shape[1]) as bar:
                for s in range(scores.shape[1]):
                    rows.append(run.relevance(scores[:, s], retain_graph=s < scores.shape[1] - 1))
                    bar.update()
        batch, n = mask.shape
        result = torch.stack(rows, 1).expand(batch, sources.shape[1], n) * mask[:, None]
        result = result.to(torch.promote_types(result.dtype, torch.float32))
        return as_returned(result, has_axis, inputs)

    def encoder_decoder_rows(
        self,
        input_ids: Tensor,
        decoder_input_ids: Tensor,
        target: Tensor,
        layer: int | None = -1,
        attention_mask: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        show_progress: bool | None = None,
    ) -> Tensor:
        """AttnLRP relevance of every decoder position of an encoder-decoder (BART, Marian, mBART,
        M2M-100, T5) over the source tokens and the target prefix, each position t explained for
        its own logit, that of ``target[:, t]``.

        The encoder's and the decoder's token embeddings are the two leaves
        (:func:`~captum_attnflow.capture.seq2seq_lrp.seq2seq_attnlrp_forward`); the cross-attention's
        bilinear products :math:`q k^\\top` (decoder queries, encoder keys) and :math:`A v`
        (the encoder outputs' values) get the uniform rule, as the self-attention's. Relevance is
        conserved as on one stack: :math:`\\sum_j R_j` over the source tokens and the decoder's
        inputs differs from the logit by what the biases and the position embeddings keep and
        what the softmax linearisation loses.

        Args:
            input_ids: (B, n_s) source token ids; ``attention_mask`` (B, n_s) their padding.
            decoder_input_ids: (B, m) the decoder's inputs (start token, then the target tokens
                before each predicted one); ``decoder_attention_mask`` (B, m) their padding.
            target: (B, m) the token each decoder position predicts.
            layer: -1 or None: AttnLRP explains the model's output.
            show_progress: a tqdm bar over the decoder positions (one backward pass each); None
                (default) shows one for long inputs.

        Returns:
            Tensor: (B, m, n_s + m), float32 (float64 for a float64 model): row t over the source
            tokens, then the decoder's input tokens; padding 0.

        Example::

            >>> import torch
            >>> from transformers import MarianConfig, MarianMTModel
            >>> from captum_attnflow import AttnLRP
            >>> model = MarianMTModel(MarianConfig(vocab_size=40, d_model=16, encoder_layers=2, decoder_layers=2,
            ...     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
            ...     pad_token_id=39, decoder_start_token_id=39)).eval()
            >>> written = torch.tensor([[8, 9, 0]])
            >>> decoder = torch.tensor([[39, 8, 9]])  # the start token, then the target shifted
            >>> AttnLRP(model).encoder_decoder_rows(torch.tensor([[5, 6, 7, 0]]), decoder, written).shape
            torch.Size([1, 3, 7])
        """
        if layer not in (-1, None):
            raise ValueError(
                f"AttnLRP explains the model's output, not a layer's representation: pass layer=-1 or None, got {layer!r}."
            )
        check_token_ids(input_ids, self.forward_func)
        check_token_ids(decoder_input_ids, self.forward_func)
        batch, m = decoder_input_ids.shape
        source = as_mask(attention_mask, *input_ids.shape, input_ids.device)
        mask = torch.cat([source, as_mask(decoder_attention_mask, batch, m, input_ids.device)], 1)
        run = seq2seq_attnlrp_forward(self.forward_func, input_ids, decoder_input_ids, attention_mask, decoder_attention_mask)
        with torch.enable_grad():
            logits = output_scores(run.output)
            scores = logits.gather(-1, torch.as_tensor(target, device=logits.device).reshape(batch, m, 1))[..., 0]
        rows = []
        with torch.enable_grad(), progress_bar(show_progress, decoder_input_ids, "AttnLRP", "backward", m) as bar:
            for t in range(m):
                rows.append(run.relevance(scores[:, t], retain_graph=t < m - 1))
                bar.update()
        result = torch.stack(rows, 1) * (mask[:, None] & mask[:, source.shape[1]:, None])
        return result.to(torch.promote_types(result.dtype, torch.float32)).to(input_ids.device)

    @contextlib.contextmanager
    def _scores(self, inputs: Any, target: Any, additional_forward_args: Any, position: Any, attention_mask: Any,
                contrast: Any, shares: bool) -> Iterator[tuple[Tensor, Any, Tensor, Tensor, bool, Tensor]]:
        """Context manager: one forward pass under the rules, which stay for the block's backward
        passes. Yields the checked inputs, the run, the (B, n) mask, the (B, S) explained
        positions, whether they have an axis, and the (B, S') scores in the graph (S' = 1 for a
        classifier, whose score is the same for every position)."""
        inputs, args, attention_mask, _ = self._checked_inputs(inputs, additional_forward_args, attention_mask)
        known = given_positions(position, inputs, attention_mask)
        # The shares keep every biased layer's output anyway: nothing to save by recomputing.
        recompute = not shares and recomputes(self.recompute, self.forward_func, inputs, "AttnLRP")
        with attnlrp_run(self.forward_func, inputs, args, attention_mask, shares=shares,
                         positions=None if known is None else known[0], recompute=recompute) as run:
            batch, n = run.tokens.shape[:2]
            mask = as_mask(attention_mask, batch, n, run.tokens.device)
            sources, has_axis = known if known is not None else explained_positions(position, mask, lambda: run.causal)
            # A language model's positions each explain their own logit (one backward each); a
            # classifier's score is the same for all.
            count = sources.shape[1] if output_scores(run.output).dim() == 3 else 1
            with torch.enable_grad():  # scores selected in the graph also under a caller's torch.no_grad()
                scores = target_scores(run.output, target, run.logit_rows(sources), contrast)[:, :count]  # (B, S')
            yield inputs, run, mask, sources, has_axis, scores

    @fill_docstring(args=_SHARES_DOC)
    def shares(
        self,
        inputs: Tensor,
        target: Any = None,
        additional_forward_args: Any = None,
        position: int | list[int] | Tensor | None = None,
        attention_mask: Tensor | None = None,
        contrast: Any = None,
    ) -> dict[str, Tensor]:
        """Where the explained score goes under AttnLRP's rules: to the tokens (the sum of
        :meth:`attribute`'s relevance), to the other embeddings (position, token type), to the
        biases, or lost by the softmax linearisation; the four add up to the score.
{args}
        Returns:
            dict: ``"score"``, ``"tokens"``, ``"other_embeddings"``, ``"biases"``, ``"softmax"``,
            each (B,), or (B, S) for a list or (B, S) ``position``; float64.

        Raises:
            ValueError: a layer with a bias whose share is not its output's (only linear layers
                and LayerNorms carry biases in the families of the architecture table).

        Example::

            >>> from captum_attnflow import AttnLRP, load_agreement_model
            >>> model, tokenizer = load_agreement_model()
            >>> ids = tokenizer(["the keys to the cabinet"], return_tensors="pt")["input_ids"]
            >>> shares = AttnLRP(model).shares(ids, target=1)  # the plural class's logit
            >>> {name: round(float(value), 2) for name, value in shares.items()}
            {'score': 5.63, 'tokens': 0.74, 'other_embeddings': 0.39, 'biases': 0.09, 'softmax': 4.4}
        """
        parts = []
        with self._scores(inputs, target, additional_forward_args, position, attention_mask, contrast,
                          shares=True) as (_, run, mask, sources, has_axis, scores), torch.enable_grad():
            for s in range(scores.shape[1]):
                parts.append({"score": scores[:, s].detach(),
                              **run.shares(scores[:, s], retain_graph=s < scores.shape[1] - 1)})
        result = {name: torch.stack([part[name] for part in parts], 1).double().expand(*sources.shape)
                  for name in parts[0]}
        return {name: value if has_axis else value[:, 0] for name, value in result.items()}
