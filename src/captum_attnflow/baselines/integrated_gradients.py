"""Integrated gradients on the token embeddings, one score per token."""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

import torch
from captum.attr import LayerIntegratedGradients
from torch import Tensor, nn

from captum_attnflow.baselines._common import (
    EmbeddingGradientAttribution,
    run_captum,
    with_embedding_constructor_args,
    with_token_args,
)
from captum_attnflow.hf import token_id


@with_embedding_constructor_args
class TokenIntegratedGradients(EmbeddingGradientAttribution):
    """Integrated gradients (Sundararajan et al. 2017) on the token embeddings, reduced per token.

    For embeddings :math:`e` of the inputs and :math:`e'` of the baseline tokens, Captum's
    ``LayerIntegratedGradients`` gives per embedding dimension
    :math:`(e_{i,d} - e'_{i,d}) \\int_0^1 \\partial f_t(e' + a (e - e')) / \\partial e_{i,d}\\, da`;
    the token's score is the L2 norm over :math:`d` (``reduce="norm"``) or the sum
    (``reduce="sum"``, whose total over tokens approximates :math:`f_t(x) - f_t(x')`).

    {init}
        tokenizer: where ``attribute``'s baseline token names (``"pad"``, ``"unk"``, ``"mask"``)
            are looked up first; None: the model's config.
    """

    def __init__(
        self,
        forward_func: Callable[..., Any],
        reduce: str = "norm",
        probabilities: bool = False,
        embedding_layer: nn.Module | None = None,
        tokenizer: Any = None,
    ) -> None:
        super().__init__(forward_func, reduce, probabilities, embedding_layer)
        self.tokenizer = tokenizer

    @property
    def multiplies_by_inputs(self) -> bool:
        """True: the scores are (embedding - baseline embedding) times the integrated gradient (Captum's interface)."""
        return True

    def has_convergence_delta(self) -> bool:
        """True: ``return_convergence_delta=True`` gives Captum's completeness error (Captum's interface)."""
        return True

    @with_token_args
    def attribute(
        self,
        inputs: Tensor,
        baselines: int | str | Tensor = "pad",
        target: Any = None,
        additional_forward_args: Any = None,
        n_steps: int = 50,
        method: str = "gausslegendre",
        internal_batch_size: int | None = None,
        return_convergence_delta: bool = False,
        attention_mask: Tensor | None = None,
        contrast: Any = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Integrated gradients from baseline tokens to ``inputs``, reduced per token.

        The arguments come in the order of Captum's ``LayerIntegratedGradients.attribute``.
{args}
            baselines (int, str or Tensor, optional): the baseline token id put at every real
                token (``"pad"`` (default), ``"unk"``, ``"mask"`` looked up on the model's
                config, or an id), or a (B, n) tensor of baseline token ids. Padding keeps
                its own id.
            n_steps, method, internal_batch_size: as in Captum's ``LayerIntegratedGradients``.
            return_convergence_delta (bool, optional): also return Captum's convergence delta
                (B,), :math:`\\sum_{i,d} \\mathrm{IG}_{i,d} - (f_t(x) - f_t(x'))`, the error of
                the integral's approximation.

        {returns} With ``return_convergence_delta=True`` a tuple ``(scores, delta)``.

        Example::

            >>> import torch
            >>> from captum_attnflow import load_agreement_model
            >>> from captum_attnflow.baselines import TokenIntegratedGradients
            >>> model, tokenizer = load_agreement_model()
            >>> ids = tokenizer(["the keys to the cabinet"], return_tensors="pt")["input_ids"]
            >>> scores = TokenIntegratedGradients(model, reduce="sum").attribute(ids, target=1)
            >>> with torch.no_grad():  # completeness: the scores add up to f(x) - f(x'), x' all [PAD]
            ...     gap = model(ids).logits[0, 1] - model(torch.full_like(ids, tokenizer.pad_token_id)).logits[0, 1]
            >>> bool(torch.isclose(scores.sum(), gap, atol=1e-3))
            True
        """
        inputs, mask, extra_args = self.scores.prepare(inputs, attention_mask, additional_forward_args)
        if isinstance(baselines, Tensor):
            if baselines.shape != inputs.shape:
                raise ValueError(
                    f"baselines as a tensor must be token ids shaped like inputs {tuple(inputs.shape)}, "
                    f"got {tuple(baselines.shape)}."
                )
            reference = baselines.to(inputs.device, inputs.dtype)
        else:
            reference = torch.where(mask, token_id(self.scores.forward_func, baselines, self.tokenizer, argument="baselines"), inputs)
        integrated = run_captum(
            self.scores, partial(LayerIntegratedGradients, layer=self.embedding_layer), inputs, extra_args, target,
            contrast, baselines=reference, n_steps=n_steps, method=method, internal_batch_size=internal_batch_size,
            return_convergence_delta=return_convergence_delta,
        )
        if return_convergence_delta:
            integrated, delta = integrated
            return self._tokens(integrated, mask, inputs), delta
        return self._tokens(integrated, mask, inputs)
