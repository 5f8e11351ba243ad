"""AttnLRP on an encoder-decoder (BART, Marian, mBART, M2M-100, T5): the rules of
:mod:`captum_attnflow.capture.lrp`, its two token embeddings the run's leaves.

The cross-attention goes through transformers' attention-function interface as the
self-attention does, so its bilinear products :math:`q k^\\top` (decoder queries, encoder keys)
and :math:`A v` (the encoder outputs' values) get the same uniform rule; relevance reaches the
source tokens through the encoder's outputs and the target prefix through the decoder's
self-attention and residual.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from captum_attnflow.capture.lrp import _NAME, LRPRun, _attnlrp_attention, _rules
from captum_attnflow.capture.seq2seq import _check_encoder_decoder
from captum_attnflow.hf.architectures import architecture_of
from captum_attnflow.hf.models import check_device
from captum_attnflow.hf.state import implementation, register_attention, unchanged


@dataclass
class Seq2SeqLRPRun(LRPRun):
    """An encoder-decoder's :class:`~captum_attnflow.capture.lrp.LRPRun`: ``embeddings`` and
    ``tokens`` its encoder's (B, n_s, D), and its second leaf.

    Attributes:
        decoder_embeddings, decoder_tokens: (B, m, D) the decoder's token embeddings, the leaf,
            and those embeddings detached.
    """

    decoder_embeddings: Tensor | None = None
    decoder_tokens: Tensor | None = None

    def relevance(self, score: Tensor, retain_graph: bool = False) -> Tensor:
        """(B, n_s + m) relevance of the source tokens, then of the decoder's inputs, for
        ``score`` (B,) (selected from ``output`` with autograd on), one backward pass."""
        leaves, tokens = (self.embeddings, self.decoder_embeddings), (self.tokens, self.decoder_tokens)
        gradients = torch.autograd.grad(score.sum(), leaves, retain_graph=retain_graph, allow_unused=True)
        return torch.cat([(t * g).sum(-1) if g is not None else t.new_zeros(t.shape[:2])
                          for t, g in zip(tokens, gradients)], -1)


def seq2seq_attnlrp_forward(
    model: nn.Module,
    input_ids: Tensor,
    decoder_input_ids: Tensor,
    attention_mask: Tensor | None = None,
    decoder_attention_mask: Tensor | None = None,
) -> Seq2SeqLRPRun:
    """Run an encoder-decoder once under AttnLRP's rules, its encoder's and its decoder's token
    embeddings the run's two leaves (:meth:`Seq2SeqLRPRun.relevance` gives (B, n_s + m)): the
    cross-attention's :math:`q k^\\top` and :math:`A v` get the uniform rule as the
    self-attention's, so relevance flows from a decoder position to the source tokens through the
    encoder's outputs and to the target prefix through the decoder's self-attention and residual.

    Args:
        model: a Hugging Face encoder-decoder of the architecture table (BART, Marian, mBART,
            M2M-100, T5).
        input_ids: (B, n_s) source ids; ``attention_mask`` (B, n_s) their padding.
        decoder_input_ids: (B, m) the decoder's inputs; ``decoder_attention_mask`` (B, m) their padding.

    Raises:
        ValueError: not an encoder-decoder of the architecture table, or one that ran no attention
            through transformers' interface.
    """
    _check_encoder_decoder(model)
    architecture, blocks = architecture_of(model, "AttnLRP")
    if architecture.cross_attention is None:
        raise ValueError(f"AttnLRP has no encoder-decoder rules for the {model.config.model_type!r} models.")
    check_device(model, input_ids)
    run = Seq2SeqLRPRun()
    register_attention(_NAME, _attnlrp_attention, sdpa_mask)  # the masks sdpa gets: bool, or None to skip
    with unchanged(model), implementation(model, _NAME) as entered, _rules(model, architecture, blocks, run, _leaves):
        # Read under the model's lock: the implementation the attention rules delegate to.
        run.attention = ALL_ATTENTION_FUNCTIONS.get(entered(model), sdpa_attention_forward)
        with torch.enable_grad():
            run.output = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                               decoder_attention_mask=decoder_attention_mask, use_cache=False)
    if not run.attended or run.decoder_embeddings is None:
        raise ValueError(
            f"{type(model).__name__} ran no attention through transformers' attention-function interface or never "
            "called its decoder's input embeddings; AttnLRP needs both."
        )
    return run


def _leaves(model: nn.Module, run: Seq2SeqLRPRun) -> list[Any]:
    """Hooks making an encoder-decoder's token embeddings the run's two leaves: the first call
    (the encoder runs first) ``run.embeddings``, the second ``run.decoder_embeddings`` (one
    module or two: the tables are often shared)."""

    def leaf(module: nn.Module, args: tuple, output: Tensor) -> Tensor | None:
        if run.decoder_embeddings is not None:
            return None
        embeddings = output.detach().requires_grad_()
        if run.embeddings is None:
            run.embeddings, run.tokens = embeddings, embeddings.detach()
        else:
            run.decoder_embeddings, run.decoder_tokens = embeddings, embeddings.detach()
        return embeddings

    tables = [model.get_encoder().get_input_embeddings(), model.get_decoder().get_input_embeddings()]
    return [table.register_forward_hook(leaf) for table in dict.fromkeys(tables)]
