"""Blank-out: the paper's ablation reference, on Captum's FeatureAblation."""

from __future__ import annotations

from typing import Any, Callable

import torch
from captum.attr import FeatureAblation, PerturbationAttribution
from torch import Tensor

from captum_attnflow.baselines._common import run_captum, with_token_args
from captum_attnflow.hf import ScoreForward, token_id


class BlankOut(PerturbationAttribution):
    """Blank-out (Abnar & Zuidema 2020, section 2, Table 1): replace each token, one at a time,
    by a blank token and measure the drop in the probability of the target class.

    The score of token :math:`i` is :math:`p(t \\mid x) - p(t \\mid x_{i \\leftarrow \\text{blank}})`
    with :math:`p = \\mathrm{softmax}` of the model's (B, C) scores and :math:`t` the target
    (the paper: the correct class; here ``target``, or the predicted class when None).
    Positive means the token supports the target. Every real token is blanked, special tokens
    included; exclude them when comparing (``spearman(..., mask=...)``). Built on Captum's
    ``FeatureAblation`` with one feature per position, so ``perturbations_per_eval``
    positions of all B examples go through the model in one forward pass.

    Args:
        forward_func: a Hugging Face model returning logits, or an ``nn.Module`` / callable
            ``forward_func(inputs, *additional_forward_args)`` returning (B, C) scores.
        token: the blank: ``"unk"`` (the paper's, default), ``"pad"``, ``"mask"`` (looked up as
            ``<name>_token_id`` on ``tokenizer``, then on the model's config) or a token id.
        tokenizer: where to look up ``token`` by name.
        softmax: apply a softmax to the scores (default); False when ``forward_func`` already
            returns probabilities.
    """

    def __init__(
        self,
        forward_func: Callable[..., Any],
        token: int | str = "unk",
        tokenizer: Any = None,
        softmax: bool = True,
    ) -> None:
        self.scores = ScoreForward(forward_func, probabilities=softmax)
        super().__init__(self.scores)
        self.token_id = token_id(forward_func, token, tokenizer)

    @property
    def multiplies_by_inputs(self) -> bool:
        """False: a drop is not a per-input factor times the input (Captum's interface)."""
        return False

    @with_token_args
    def attribute(
        self,
        inputs: Tensor,
        target: Any = None,
        additional_forward_args: Any = None,
        attention_mask: Tensor | None = None,
        perturbations_per_eval: int = 8,
        show_progress: bool = False,
        contrast: Any = None,
    ) -> Tensor:
        """Drop in the target's probability when each token is blanked out.
{args}
            perturbations_per_eval (int, optional): positions blanked per forward pass (each
                pass holds B times this many sequences), as in Captum. Default: 8.
            show_progress (bool, optional): Captum's progress bar over the forward passes.

        {returns}

        Example::

            >>> from captum_attnflow import load_agreement_model
            >>> from captum_attnflow.baselines import BlankOut
            >>> model, tokenizer = load_agreement_model()
            >>> ids = tokenizer(["the keys to the cabinet"], return_tensors="pt")["input_ids"]
            >>> drops = BlankOut(model, tokenizer=tokenizer).attribute(ids)  # "[UNK]" as the blank
            >>> tokenizer.convert_ids_to_tokens(ids[0])[drops.argmax()]  # the subject
            'keys'
        """
        inputs, mask, extra_args = self.scores.prepare(inputs, attention_mask, additional_forward_args)
        # Padding is "blanked" by its own id, which leaves the input unchanged: a drop of 0.
        blanks = torch.where(mask, torch.full_like(inputs, self.token_id), inputs)
        positions = torch.arange(inputs.shape[1], device=inputs.device)[None]
        with torch.no_grad():
            drops = run_captum(
                self.scores, FeatureAblation, inputs, extra_args, target, contrast, baselines=blanks,
                feature_mask=positions, perturbations_per_eval=perturbations_per_eval, show_progress=show_progress,
            )
        return (drops.float() * mask).to(inputs.device)
