"""The one table of architectures: where each model family keeps the pieces the gradient-weighted
and decomposition methods need beyond the attention probabilities.

Value zeroing and ALTI look inside a transformer block: the attention's output projection
:math:`W_O`, the LayerNorm around the residual, and (value zeroing) the rest of the block after
the attention. Transformers names these differently in every family, so, as transformers keeps
its own model mappings, :data:`ARCHITECTURES` maps ``config.model_type`` to an
:class:`Architecture` that knows them. Every entry is tested against a slow reference written
from the weights (``tests/hf/test_architectures.py``, ``tests/attr``).

The attention probabilities and value vectors themselves come through transformers'
attention-function interface (:mod:`captum_attnflow.hf.internals`), so the table holds only what
that interface does not pass.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn
from transformers.pytorch_utils import Conv1D

from captum_attnflow.hf.models import main_model


@dataclass(frozen=True)
class Architecture:
    """Where one family keeps the pieces of its transformer blocks.

    Attributes:
        blocks: class names of its transformer blocks (the modules of the layer list).
        output_projection: ``block -> module``, the attention's output projection :math:`W_O`
            (``nn.Linear``, or GPT-2's ``Conv1D``) applied to the concatenated heads.
        post_norm: ``block -> nn.LayerNorm`` applied to ``x + attention`` (post-LN: BERT,
            RoBERTa, DistilBERT), or None for pre-LN blocks, whose input norm is token-wise and
            already inside the value vectors (GPT-2, Llama-style, ViT).
        after_attention: ``(block, x, attention) -> output``: the rest of the block given its
            input ``x`` (..., n, D) and the projected attention output (..., n, D): residual,
            norms and feed-forward, in eval mode. Leading axes broadcast, so many variants of
            one layer run in one call.
        gated_unit: ``block -> (activation, up projection)`` of a gated feed-forward
            :math:`W_d(\\mathrm{act}(W_g x) \\odot W_u x)` (Llama-style), the two modules whose
            outputs are multiplied; None where the feed-forward has no gate.
        class_tokens: names of the learned token embeddings (parameters (1, 1, D)) that the
            vision embeddings put before the patches, in order (ViT's ``cls_token``, DeiT's
            ``cls_token`` and ``distillation_token``), on the module holding the patch embeddings.
        lrp: whether AttnLRP's rules cover every nonlinearity of the family's models (its
            norms and activations are modules, the gated product is listed); False where one is
            a plain function call that no hook can reach (RoBERTa's classification head calls
            ``torch.tanh``).
    """

    blocks: tuple[str, ...]
    output_projection: Callable[[nn.Module], nn.Module]
    post_norm: Callable[[nn.Module], nn.LayerNorm] | None
    after_attention: Callable[[nn.Module, Tensor, Tensor], Tensor]
    gated_unit: Callable[[nn.Module], tuple[nn.Module, nn.Module]] | None = None
    class_tokens: tuple[str, ...] = ()
    lrp: bool = True


def _bert_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    hidden = block.attention.output.LayerNorm(attention + x)
    return block.output(block.intermediate(hidden), hidden)


def _distilbert_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    hidden = block.sa_layer_norm(attention + x)
    return block.output_layer_norm(block.ffn(hidden) + hidden)


def _gpt2_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    hidden = x + attention
    return hidden + block.mlp(block.ln_2(hidden))


def _llama_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    hidden = x + attention
    return hidden + block.mlp(block.post_attention_layernorm(hidden))


def _vit_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    hidden = x + attention
    return hidden + block.mlp(block.layernorm_after(hidden))


_BERT = Architecture(
    ("BertLayer", "RobertaLayer", "XLMRobertaLayer"),
    lambda block: block.attention.output.dense,
    lambda block: block.attention.output.LayerNorm,
    _bert_after,
)
_ROBERTA = dataclasses.replace(_BERT, lrp=False)
_DISTILBERT = Architecture(
    ("TransformerBlock",), lambda block: block.attention.out_lin, lambda block: block.sa_layer_norm, _distilbert_after
)
_GPT2 = Architecture(("GPT2Block",), lambda block: block.attn.c_proj, None, _gpt2_after)
_LLAMA = Architecture(
    ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer"),
    lambda block: block.self_attn.o_proj,
    None,
    _llama_after,
    gated_unit=lambda block: (block.mlp.act_fn, block.mlp.up_proj),
)
_VIT = Architecture(
    ("ViTLayer", "DeiTLayer"), lambda block: block.attention.o_proj, None, _vit_after,
    class_tokens=("cls_token", "distillation_token"),
)

ARCHITECTURES: dict[str, Architecture] = {
    "bert": _BERT,
    "roberta": _ROBERTA,
    "xlm-roberta": _ROBERTA,
    "distilbert": _DISTILBERT,
    "gpt2": _GPT2,
    "captum_attnflow_agreement": _GPT2,  # the bundled classifier and tagger are made of GPT-2 blocks
    "captum_attnflow_tagger": _GPT2,
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "vit": _VIT,
    "deit": _VIT,
}


# Root-mean-square norms, :math:`y = w \odot x / \sqrt{\overline{x^2} + \epsilon}` with ``weight``
# w and ``variance_epsilon`` (LayerNorms are ``nn.LayerNorm``).
RMS_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm")


def architecture_of(forward_func: object, method: str) -> tuple[Architecture, list[nn.Module]]:
    """The :class:`Architecture` of the Hugging Face model in ``forward_func`` and its blocks in order.

    Args:
        forward_func: a Hugging Face model or a module (or bound method) containing one.
        method: the caller's name, for the error message.

    Raises:
        ValueError: no Hugging Face model inside, or a model type outside :data:`ARCHITECTURES`
            (the message names the supported ones).
    """
    model = main_model(forward_func)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in ARCHITECTURES:
        found = f"a {model_type!r} model" if model is not None else f"{type(forward_func).__name__}, which holds no Hugging Face model"
        raise ValueError(
            f"{method} needs the internals of the model's transformer blocks and knows the model types "
            f"{sorted(ARCHITECTURES)}; got {found}. Use a supported model, or a method that needs only "
            "attention weights (RawAttention, AttentionRollout, AttentionFlow, GradientWeightedRollout)."
        )
    architecture = ARCHITECTURES[model_type]
    blocks = [module for module in model.modules() if type(module).__name__ in architecture.blocks]
    if not blocks:
        raise ValueError(f"found no transformer blocks ({', '.join(architecture.blocks)}) in the {model_type!r} model.")
    return architecture, blocks


def projection_weight(projection: nn.Module) -> tuple[Tensor, Tensor | None]:
    """``(W (D_in, D_out), b (D_out,) or None)`` of an output projection, ``y = x W + b``, for an
    ``nn.Linear`` (weight stored transposed) or GPT-2's ``Conv1D`` (stored as is)."""
    if isinstance(projection, Conv1D):
        return projection.weight, projection.bias
    if isinstance(projection, nn.Linear):
        return projection.weight.t(), projection.bias
    raise TypeError(f"the output projection must be an nn.Linear or a Conv1D, got {type(projection).__name__}.")


def layer_norm_parameters(norm: nn.Module) -> tuple[Tensor, Tensor, float]:
    """``(gamma (D,), beta (D,), eps)`` of a LayerNorm (ones and zeros where it has no affine part)."""
    if not isinstance(norm, nn.LayerNorm):
        raise TypeError(f"expected an nn.LayerNorm after the attention, got {type(norm).__name__}.")
    size = norm.normalized_shape[-1]
    device = next(iter(norm.parameters()), torch.empty(0)).device
    gamma = norm.weight if norm.weight is not None else torch.ones(size, device=device)
    beta = norm.bias if norm.bias is not None else torch.zeros(size, device=device)
    return gamma, beta, norm.eps
