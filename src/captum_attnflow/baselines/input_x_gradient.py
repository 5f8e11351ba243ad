"""Input x gradient on the token embeddings, one score per token."""

from __future__ import annotations

from typing import Any

from captum.attr import LayerGradientXActivation
from torch import Tensor

from captum_attnflow.baselines._common import EmbeddingGradientAttribution, with_token_args


class TokenInputXGradient(EmbeddingGradientAttribution):
    """Input x gradient on the token embeddings (Shrikumar et al. 2016), reduced per token.

    The score of token :math:`i` is :math:`\\lVert e_i \\odot \\partial f_t(x) / \\partial e_i
    \\rVert_2` (``reduce="norm"``) or the sum over embedding dimensions (``reduce="sum"``,
    the first-order Taylor contribution of the token), with :math:`e_i` the output of the
    token embedding layer and :math:`f_t` the target's logit (or probability). Computed with
    Captum's ``LayerGradientXActivation``.
    """

    @with_token_args
    def attribute(
        self,
        inputs: Tensor,
        target: Any = None,
        additional_forward_args: Any = None,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """Embedding times gradient of the target's score, reduced per token.
{args}

        Returns:
            Tensor: float32 (B, n) on the inputs' device, padding 0.

        Example::

            >>> import torch
            >>> from transformers import BertConfig, BertForSequenceClassification
            >>> from captum_attnflow.baselines import TokenInputXGradient
            >>> model = BertForSequenceClassification(BertConfig(num_hidden_layers=2,
            ...     hidden_size=32, num_attention_heads=2, intermediate_size=64)).eval()
            >>> TokenInputXGradient(model, reduce="sum").attribute(torch.tensor([[101, 7592, 102]])).shape
            torch.Size([1, 3])
        """
        mask, extra_args, target = self._prepare(inputs, target, additional_forward_args, attention_mask)
        method = LayerGradientXActivation(self.scores, self.embedding_layer, multiply_by_inputs=True)
        products = method.attribute(inputs, target=target, additional_forward_args=extra_args)
        return self._tokens(products, mask, inputs)
