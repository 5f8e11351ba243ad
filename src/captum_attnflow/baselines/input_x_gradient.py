"""Input x gradient on the token embeddings, one score per token."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from captum_attnflow.baselines._common import (
    EmbeddingGradientAttribution,
    with_embedding_constructor_args,
    with_token_args,
)


@with_embedding_constructor_args
class TokenInputXGradient(EmbeddingGradientAttribution):
    """Input x gradient on the token embeddings (Shrikumar et al. 2016), reduced per token.

    The score of token :math:`i` is :math:`\\lVert e_i \\odot \\partial f_t(x) / \\partial e_i
    \\rVert_2` (``reduce="norm"``) or the sum over embedding dimensions (``reduce="sum"``,
    the first-order Taylor contribution of the token), with :math:`e_i` the output of the
    token embedding layer and :math:`f_t` the target's logit (or probability). Computed with
    Captum's ``LayerGradientXActivation``.

    {init}
    """

    @property
    def multiplies_by_inputs(self) -> bool:
        """True: the scores are embeddings times gradients (Captum's interface)."""
        return True

    @with_token_args
    def attribute(
        self,
        inputs: Tensor,
        target: Any = None,
        additional_forward_args: Any = None,
        attention_mask: Tensor | None = None,
        contrast: Any = None,
    ) -> Tensor:
        """Embedding times gradient of the target's score, reduced per token.
{args}

        {returns}

        Example::

            >>> import torch
            >>> from transformers import BertConfig, BertForSequenceClassification
            >>> from captum_attnflow.baselines import TokenInputXGradient
            >>> model = BertForSequenceClassification(BertConfig(num_hidden_layers=2,
            ...     hidden_size=32, num_attention_heads=2, intermediate_size=64)).eval()
            >>> ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]])
            >>> mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
            >>> scores = TokenInputXGradient(model, reduce="sum").attribute(ids, attention_mask=mask)
            >>> scores.shape, scores[1, 3].item()  # padding gets 0
            (torch.Size([2, 4]), 0.0)
        """
        return self._embedding_gradients(inputs, target, additional_forward_args, attention_mask, contrast)
