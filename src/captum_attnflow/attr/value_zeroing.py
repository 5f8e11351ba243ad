"""Value zeroing (Mohebbi, Zuidema, Chrupała & Alishahi, EACL 2023) as a Captum attribution."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from captum_attnflow.attr._base import with_internals_args
from captum_attnflow.attr._decomposition import ContributionRollout
from captum_attnflow.capture.decomposition import value_zeroing_maps


class ValueZeroing(ContributionRollout):
    """Value zeroing (Mohebbi et al. 2023): how much token i's output of a layer changes when the
    layer may not read token j's value.

    .. math::
        C_l[i, j] = 1 - \\cos(\\tilde x^{(j)}_i, x_i),

    with :math:`x_i` token i's output of layer l (after the feed-forward and norms) and
    :math:`\\tilde x^{(j)}_i` the same with token j's value vectors set to zero in every head of
    layer l; rows are divided by their sum over real tokens. The per-layer matrices are rolled
    out without a residual (the residual is already inside what is measured),
    :math:`\\tilde C_l = C_l \\tilde C_{l-1}`, the row of ``position`` after ``layer``.

    Attention is linear in the values, so the attention output for every zeroed j follows from
    one forward pass; only the rest of each block runs again, n variants of n tokens per layer
    (:func:`captum_attnflow.capture.decomposition.value_zeroing_maps`): n² token evaluations of the
    feed-forward a layer, which is its cost (n times a forward's feed-forward). Needs the model's
    blocks: the model types of :data:`captum_attnflow.hf.architectures.ARCHITECTURES`.

    Args:
        forward_func: a Hugging Face model of a supported type, or a module containing one.
    """

    @with_internals_args()
    def attribute(
        self,
        inputs: Tensor,
        target: Any = None,
        additional_forward_args: Any = None,
        position: int | list[int] | Tensor | None = None,
        layer: int | None = -1,
        attention_mask: Tensor | None = None,
        show_progress: bool | None = None,
    ) -> Tensor:
        """Value zeroing of ``position`` after ``layer``.
{args}
        Returns:
            Tensor: float32 {shapes} Each row sums to 1 over real tokens; padding gets 0.

        Example::

            >>> from captum_attnflow import ValueZeroing, load_agreement_model
            >>> model, tokenizer = load_agreement_model()
            >>> ids = tokenizer(["the keys to the cabinet"], return_tensors="pt")["input_ids"]
            >>> scores = ValueZeroing(model).attribute(ids)  # [CLS] after the last layer
            >>> scores.shape, round(float(scores.sum()), 4)
            (torch.Size([1, 6]), 1.0)
        """
        return self._rolled_out(
            value_zeroing_maps, inputs, additional_forward_args, position, layer, attention_mask, show_progress
        )
