"""What the methods built on per-layer contribution maps share: rows of their rollout."""

from __future__ import annotations

from typing import Any, Callable

from torch import Tensor

from captum_attnflow.attr._base import AttentionAttribution, progress_bar
from captum_attnflow.functional import AttentionGraph, rollout_rows


class ContributionRollout(AttentionAttribution):
    """Base of ALTI and value zeroing: each layer's token-to-token contribution matrix, rows
    summing to 1 (the residual already inside), rolled out across layers without adding a residual:
    :math:`\\tilde C_l = C_l \\tilde C_{l-1}`, the row of ``position`` after ``layer``."""

    def __init__(self, forward_func: Callable[..., Any]) -> None:
        super().__init__(forward_func)

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
        inputs, args, attention_mask, _ = self._checked_inputs(inputs, additional_forward_args, attention_mask)
        with progress_bar(show_progress, inputs, type(self).__name__, "layer") as bar:
            maps = maps_of(self.forward_func, inputs, args, attention_mask, progress=bar.update)
        graph = AttentionGraph.from_fused(maps, residual_alpha=1.0, attention_mask=attention_mask)
        return rollout_rows(graph, position, layer).to(inputs.device)
