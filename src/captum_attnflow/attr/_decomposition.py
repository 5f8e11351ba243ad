"""What the methods built on per-layer maps of the model's internals share: reading the maps,
and the rows of their rollout."""

from __future__ import annotations

from typing import Any, Callable

from torch import Tensor

from captum_attnflow.attr._base import AttentionAttribution, pooled_rows, progress_bar
from captum_attnflow.functional import AttentionGraph, rollout_rows


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
