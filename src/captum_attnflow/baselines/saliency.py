"""Saliency (input gradients) on the token embeddings, one score per token."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from captum_attnflow.baselines._common import (
    EmbeddingGradientAttribution,
    with_embedding_constructor_args,
    with_token_args,
)


@with_embedding_constructor_args
class TokenSaliency(EmbeddingGradientAttribution):
    """Input gradients, the paper's gradient reference (Abnar & Zuidema 2020, section 2, Table 2).

    The score of token :math:`i` is :math:`\\lVert \\partial f_t(x) / \\partial e_i \\rVert_2`
    (``reduce="norm"``) or :math:`\\sum_d \\partial f_t(x) / \\partial e_{i,d}`
    (``reduce="sum"``), with :math:`e_i` the output of the token embedding layer for token
    :math:`i` and :math:`f_t` the target's logit (or probability, ``probabilities=True``).
    Computed with Captum's ``LayerGradientXActivation(multiply_by_inputs=False)``, which
    returns the plain gradient of the layer output; Captum's ``Saliency`` works on float
    inputs only and cannot reach the embeddings of token ids.

    {init}
    """

    @property
    def multiplies_by_inputs(self) -> bool:
        """False: the scores are gradients, not multiplied by the embeddings (Captum's interface)."""
        return False

    @with_token_args
    def attribute(
        self,
        inputs: Tensor,
        target: Any = None,
        additional_forward_args: Any = None,
        attention_mask: Tensor | None = None,
        contrast: Any = None,
    ) -> Tensor:
        """Gradient of the target's score with respect to each token's embedding, reduced per token.
{args}

        {returns}

        Example::

            >>> from captum_attnflow import load_agreement_model
            >>> from captum_attnflow.baselines import TokenSaliency
            >>> model, tokenizer = load_agreement_model()
            >>> batch = tokenizer(["the keys to the cabinet"], return_tensors="pt")
            >>> scores = TokenSaliency(model).attribute(batch["input_ids"], target=1)  # 1: plural
            >>> scores.shape, bool((scores > 0).all())
            (torch.Size([1, 6]), True)
        """
        return self._embedding_gradients(inputs, target, additional_forward_args, attention_mask, contrast)
