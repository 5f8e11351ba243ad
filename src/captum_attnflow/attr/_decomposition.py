"""What the methods built on per-layer maps of the model's internals share: reading the maps,
and the rows of their rollout."""

from __future__ import annotations

from typing import Any, Callable

from torch import Tensor

from captum_attnflow.attr._base import AttentionAttribution, pooled_rows, progress_bar
from captum_attnflow.capture.seq2seq_decomposition import Seq2SeqMaps
from captum_attnflow.docstrings import fill_docstring
from captum_attnflow.functional import AttentionGraph, rollout_rows
from captum_attnflow.functional.encoder_decoder import encoder_decoder_contributions
from captum_attnflow.hf import check_token_ids

_ENCODER_DECODER_ARGS = """
        Args:
            input_ids: (B, n_s) source token ids; ``attention_mask`` (B, n_s) marks their padding
                (1 real, 0 padding).
            decoder_input_ids: (B, m) the decoder's inputs: its start token, then the target
                tokens before each predicted one; ``decoder_attention_mask`` (B, m) their padding.
            layer: the decoder layer, 1..L_d or negative from the top (-1, the last); None for all.
            show_progress: a tqdm bar over the blocks; None (default) shows one for long inputs.
"""

# Fills ``{args}`` in the ``encoder_decoder_rows`` docstrings.
with_encoder_decoder_args = fill_docstring(args=_ENCODER_DECODER_ARGS)


class LayerMapsAttribution(AttentionAttribution):
    """Base of the methods that read one (B, n, n) token-to-token map per layer from the model's
    internals (value vectors, output projections, LayerNorms), not its attention weights alone:
    the attention norms, ALTI and value zeroing. No ``lean`` argument: where the lean capture
    applies (:func:`~captum_attnflow.capture.lean.supports_lean`) the model runs its own attention and
    each layer's per-head probabilities are recomputed from its queries and keys in blocks of
    rows, elsewhere eager attention gives them, one layer at a time
    (:mod:`captum_attnflow.capture.decomposition`)."""

    def __init__(self, forward_func: Callable[..., Any]) -> None:
        super().__init__(forward_func)

    def _layer_maps(
        self,
        maps_of: Callable[..., Tensor],
        inputs: Any,
        additional_forward_args: Any,
        attention_mask: Tensor | None,
        show_progress: bool | None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Check the inputs and compute ``maps_of``'s (L, B, n, n) maps, a progress bar counting
        the layers: ``(maps, the checked inputs, attention_mask)``."""
        inputs, args, attention_mask, _ = self._checked_inputs(inputs, additional_forward_args, attention_mask)
        with progress_bar(show_progress, inputs, type(self).__name__, "layer") as bar:
            maps = maps_of(self.forward_func, inputs, args, attention_mask, progress=bar.update)
        return maps, inputs, attention_mask

    def _encoder_decoder_maps(
        self,
        maps_of: Callable[..., Seq2SeqMaps],
        input_ids: Tensor,
        decoder_input_ids: Tensor,
        attention_mask: Tensor | None,
        decoder_attention_mask: Tensor | None,
        show_progress: bool | None,
    ) -> Seq2SeqMaps:
        """Check the token ids and compute ``maps_of``'s maps of an encoder-decoder, a progress bar
        counting its blocks."""
        check_token_ids(input_ids, self.forward_func)
        check_token_ids(decoder_input_ids, self.forward_func)
        with progress_bar(show_progress, input_ids, type(self).__name__, "block") as bar:
            return maps_of(self.forward_func, input_ids, decoder_input_ids, attention_mask, decoder_attention_mask,
                           progress=bar.update)


class ContributionRollout(LayerMapsAttribution):
    """Base of ALTI and value zeroing: each layer's token-to-token contribution matrix, rows
    summing to 1 (the residual already inside), rolled out across layers without adding a residual:
    :math:`\\tilde C_l = C_l \\tilde C_{l-1}`, the row of ``position`` after ``layer``."""

    def _rolled_out(
        self,
        maps_of: Callable[..., Tensor],
        inputs: Any,
        additional_forward_args: Any,
        position: Any,
        layer: int | None,
        attention_mask: Tensor | None,
        show_progress: bool | None,
    ) -> Tensor:
        maps, inputs, attention_mask = self._layer_maps(maps_of, inputs, additional_forward_args, attention_mask, show_progress)
        graph = AttentionGraph.from_fused(maps, residual_alpha=1.0, attention_mask=attention_mask)
        position, weights = self._pooled_position(position, inputs, attention_mask)
        return pooled_rows(rollout_rows(graph, position, layer), weights).to(inputs.device)

    def _encoder_decoder_rolled_out(
        self,
        maps_of: Callable[..., Seq2SeqMaps],
        input_ids: Tensor,
        decoder_input_ids: Tensor,
        layer: int | None,
        attention_mask: Tensor | None,
        decoder_attention_mask: Tensor | None,
        show_progress: bool | None,
    ) -> Tensor:
        """The encoder-decoder's per-layer maps composed over the joint graph
        (:func:`~captum_attnflow.functional.encoder_decoder.encoder_decoder_contributions`)."""
        maps = self._encoder_decoder_maps(maps_of, input_ids, decoder_input_ids, attention_mask, decoder_attention_mask,
                                          show_progress)
        rows = encoder_decoder_contributions(maps.encoder, maps.decoder, layer, attention_mask, decoder_attention_mask)
        return rows.to(input_ids.device)
