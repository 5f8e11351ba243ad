"""Saliency (input gradients) on the token embeddings, one score per token."""

from __future__ import annotations

from typing import Any

from captum.attr import LayerGradientXActivation
from torch import Tensor

from captum_attnflow.baselines._common import EmbeddingGradientAttribution, with_token_args


class TokenSaliency(EmbeddingGradientAttribution):
    """Input gradients, the paper's gradient reference (Abnar & Zuidema 2020, section 2, Table 2).

    The score of token :math:`i` is :math:`\\lVert \\partial f_t(x) / \\partial e_i \\rVert_2`
    (``reduce="norm"``) or :math:`\\sum_d \\partial f_t(x) / \\partial e_{i,d}`
    (``reduce="sum"``), with :math:`e_i` the output of the token embedding layer for token
    :math:`i` and :math:`f_t` the target's logit (or probability, ``probabilities=True``).
    Computed with Captum's ``LayerGradientXActivation(multiply_by_inputs=False)``, which
    returns the plain gradient of the layer output; Captum's ``Saliency`` works on float
    inputs only and cannot reach the embeddings of token ids.
    """

    @with_token_args
    def attribute(
        self,
        inputs: Tensor,
        target: Any = None,
        additional_forward_args: Any = None,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """Gradient of the target's score with respect to each token's embedding, reduced per token.
{args}

        Returns:
            Tensor: float32 (B, n) on the inputs' device, padding 0.

        Example::

            >>> import torch
            >>> from transformers import BertConfig, BertForSequenceClassification
            >>> from captum_attnflow.baselines import TokenSaliency
            >>> model = BertForSequenceClassification(BertConfig(num_hidden_layers=2,
            ...     hidden_size=32, num_attention_heads=2, intermediate_size=64)).eval()
            >>> TokenSaliency(model).attribute(torch.tensor([[101, 7592, 102]])).shape
            torch.Size([1, 3])
        """
        mask, extra_args, target = self._prepare(inputs, target, additional_forward_args, attention_mask)
        method = LayerGradientXActivation(self.scores, self.embedding_layer, multiply_by_inputs=False)
        gradients = method.attribute(inputs, target=target, additional_forward_args=extra_args)
        return self._tokens(gradients, mask, inputs)
