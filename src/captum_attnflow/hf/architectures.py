"""The one table of architectures: where each model family keeps the pieces the gradient-weighted
and decomposition methods need beyond the attention probabilities.

Value zeroing and ALTI look inside a transformer block: the attention's output projection
:math:`W_O`, the LayerNorm around the residual, and (value zeroing) the rest of the block after
the attention. Transformers names these differently in every family, so, as transformers keeps
its own model mappings, :data:`ARCHITECTURES` maps ``config.model_type`` to an
:class:`Architecture` that knows them. Every entry is tested against a slow reference written
from the weights (``tests/hf/test_architectures.py``, ``tests/attr``).

The attention probabilities and value vectors themselves come through transformers'
attention-function interface (:mod:`captum_attnflow.capture.internals`), so the table holds only what
that interface does not pass; for the families whose attention runs in their own modules
(DeBERTa, MPNet, BLOOM, Falcon) it also says where their probabilities, queries, keys, values
and score terms are (:mod:`captum_attnflow.hf.own_attention`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn

from captum_attnflow.hf.models import hf_models, main_model, outermost
from captum_attnflow.hf.own_attention import (
    BLOOM,
    DEBERTA,
    FALCON,
    MPNET,
    OwnAttention,
    bloom_after,
    bloom_residual,
    deberta_head,
    deberta_refused,
    falcon_after,
    mpnet_after,
)
from captum_attnflow.hf.weights import linear_weight


@dataclass(frozen=True)
class CrossAttention:
    """The cross-attention sub-layer of an encoder-decoder's decoder blocks: decoder queries over
    the encoder's outputs, between the block's self-attention and its feed-forward.

    Attributes:
        output_projection: ``block -> module``, its output projection :math:`W_O`.
        post_norm: ``block -> nn.LayerNorm`` applied to residual + cross-attention (post-LN: BART,
            Marian), or None for pre-LN blocks (mBART, M2M-100, T5), whose norm on the queries'
            input is token-wise and the encoder's outputs' norm is inside the values.
        residual: ``(block, x, attention) -> stream``: the residual stream entering the
            cross-attention sub-layer, from the block's input x (..., m, D) and its
            self-attention's projected output (..., m, D): :math:`\\mathrm{LN}(x + a)` post-LN,
            :math:`x + a` pre-LN.
    """

    output_projection: Callable[[nn.Module], nn.Module]
    post_norm: Callable[[nn.Module], nn.LayerNorm] | None
    residual: Callable[[nn.Module, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class Architecture:
    """Where one family keeps the pieces of its transformer blocks.

    Attributes:
        blocks: class names of its transformer blocks (the modules of the layer list).
        output_projection: ``block -> module``, the attention's output projection :math:`W_O`
            (``nn.Linear``, or GPT-2's ``Conv1D``) applied to the concatenated heads.
        post_norm: ``block -> nn.LayerNorm`` applied to ``x + attention`` (post-LN: BERT,
            RoBERTa, DistilBERT, ELECTRA, ALBERT), or None for pre-LN blocks, whose input norm is
            token-wise and already inside the value vectors (GPT-2, Llama-style, ViT, ModernBERT,
            and the parallel blocks of GPT-NeoX and GPT-J, whose feed-forward reads x, not the
            attention); the callable may return None for a block (OPT, pre-LN unless
            ``do_layer_norm_before`` is False).
        after_attention: ``(block, x, attention) -> output``: the rest of the block given its
            input ``x`` (B, n, D) and the projected attention output (B, n, D): residual, norms
            and feed-forward, in eval mode (value zeroing runs its variants of one layer as
            one batch). Of an encoder-decoder, its encoder's blocks (value zeroing runs its
            decoder blocks whole, the cross-attention reading the changed queries).
        gated_unit: ``block -> (activation, up projection)`` of a gated feed-forward
            :math:`W_d(\\mathrm{act}(W_g x) \\odot W_u x)` (Llama-style), the two modules whose
            outputs are multiplied (None for a block without one, such as a mixture-of-experts
            layer); None where the feed-forward has no gate.
        fused_gate: whether the up projection of ``gated_unit`` computes gate and up at once,
            its output the activated half then the multiplied half (Phi-3's ``gate_up_proj``,
            ModernBERT's ``Wi``): AttnLRP then halves only the second half's gradient.
        held_constant: ``block -> modules`` whose outputs AttnLRP holds constant (gradient 0):
            a mixture of experts' router, whose expert weights then scale each expert's output
            as fixed coefficients (Mixtral, Qwen3-MoE). Value zeroing runs the block as it is
            (routed anew for each zeroed token); ALTI and the attention norms do not read the
            feed-forward.
        gated_experts: ``block -> (activation, experts)`` of a mixture of gated experts,
            :math:`\\sum_e w_e W_{d,e}(\\mathrm{act}(W_{g,e} x) \\odot W_{u,e} x)` computed in one
            module (Mixtral's, Qwen3-MoE's ``experts``), None for a block without one. The
            product is inside a function no hook reaches, but all that follows it in the module
            is linear (the down projections, the fixed weights :math:`w_e`, the sum): the identity
            rule on the activation and the experts' output gradient halved give the product the
            uniform rule, each factor half of the relevance, as the dense gated unit gets.
        attention_norm: ``block -> module`` applied token by token to the attention's output
            before the residual, :math:`y = x + N(a)` with N linear given token i's statistics,
            :math:`N(a_i) = s_i \\odot a_i` (Gemma 2/3's and OLMo 2's post-attention RMS norms,
            :math:`s_i = w / \\mathrm{rms}(a_i)`; DINOv2's layer scale, :math:`s_i = \\lambda`):
            ALTI reads :math:`s_i = N(a_i) / a_i`. None where the attention's output is added as it is.
        layer_order: ``model -> blocks`` in the order the model calls them, where one block module
            runs several times (ALBERT's shared layers); None: each block module once, in order.
        function_activations: ``model -> [(producer, consumer, f)]`` for an element-wise ``f``
            called as a plain function between two modules, ``consumer(f(producer(...)))``:
            AttnLRP's identity rule reaches it through their hooks (RoBERTa's classification
            head: ``out_proj(tanh(dense(x)))``).
        class_tokens: names of the learned token embeddings (parameters (1, 1, D) or (D,)) that
            the vision embeddings put before the patches, in order (ViT's ``cls_token``, DeiT's
            ``cls_token`` and ``distillation_token``, CLIP's ``class_embedding``), on the module
            holding the patch embeddings; those it lacks are skipped.
        lrp_refused: ``config -> reason or None``: why AttnLRP's rules do not cover a model of
            the family built with this config (a nonlinearity it calls as a plain function,
            such as DeBERTa-v2's convolution layer), None where they do; elsewhere they cover
            every nonlinearity (norms and activations are modules or listed above, the gated
            product is listed) and the token embeddings are a module's output.
        own_attention: where a family whose attention runs in its own module, outside
            transformers' attention-function interface, keeps its probabilities, projections
            and score terms (:class:`~captum_attnflow.hf.own_attention.OwnAttention`); None for
            the families whose attention goes through that interface.
        residual: ``(block, x) -> r``, what the attention's output is added to where it is not
            the block's input x (BLOOM with ``apply_residual_connection_post_layernorm``: the
            input norm's output), :math:`y = r + \\mathrm{attention}`; ALTI reads it.
        cross_attention: an encoder-decoder's: its decoder blocks' cross-attention sub-layer
            (:class:`CrossAttention`); ``blocks``, ``output_projection`` and ``post_norm`` then
            name the encoder's and the decoder's blocks and their self-attention sub-layers.
            None for a model of one stack.
    """

    blocks: tuple[str, ...]
    output_projection: Callable[[nn.Module], nn.Module]
    post_norm: Callable[[nn.Module], nn.LayerNorm | None] | None
    after_attention: Callable[[nn.Module, Tensor, Tensor], Tensor]
    gated_unit: Callable[[nn.Module], tuple[nn.Module, nn.Module]] | None = None
    class_tokens: tuple[str, ...] = ()
    fused_gate: bool = False
    held_constant: Callable[[nn.Module], tuple[nn.Module, ...]] | None = None
    gated_experts: Callable[[nn.Module], tuple[nn.Module, nn.Module] | None] | None = None
    layer_order: Callable[[nn.Module], list[nn.Module]] | None = None
    function_activations: Callable[[nn.Module], list[tuple[nn.Module, nn.Module, Callable[[Tensor], Tensor]]]] | None = None
    attention_norm: Callable[[nn.Module], nn.Module] | None = None
    lrp_refused: Callable[[Any], str | None] | None = None
    own_attention: OwnAttention | None = None
    residual: Callable[[nn.Module, Tensor], Tensor] | None = None
    output_activation: Callable[[nn.Module], tuple[nn.Module, Callable[[Tensor], Tensor]] | None] | None = None
    cross_attention: CrossAttention | None = None


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


def _phi3_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    hidden = x + block.resid_attn_dropout(attention)
    return hidden + block.resid_mlp_dropout(block.mlp(block.post_attention_layernorm(hidden)))


def _gpt_neox_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    if block.use_parallel_residual:  # the feed-forward reads the block's input, beside the attention
        return x + attention + block.mlp(block.post_attention_layernorm(x))
    hidden = x + attention
    return hidden + block.mlp(block.post_attention_layernorm(hidden))


def _gptj_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    return x + attention + block.mlp(block.ln_1(x))  # one norm for both branches


def _opt_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    hidden = x + attention
    if not block.do_layer_norm_before:
        hidden = block.self_attn_layer_norm(hidden)
        return block.final_layer_norm(hidden + block.fc2(block.activation_fn(block.fc1(hidden))))
    return hidden + block.fc2(block.activation_fn(block.fc1(block.final_layer_norm(hidden))))


def _modernbert_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    hidden = x + attention
    return hidden + block.mlp(block.mlp_norm(hidden))


def _albert_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    hidden = block.attention.LayerNorm(x + attention)
    return block.full_layer_layer_norm(block.ff_chunk(hidden) + hidden)


def _albert_order(model: nn.Module) -> list[nn.Module]:
    """ALBERT's layers as its encoder calls them: layer i runs group i·G/L, each group's inner layers in turn."""
    config, groups = model.config, model.base_model.encoder.albert_layer_groups
    order = []
    for index in range(config.num_hidden_layers):
        order += list(groups[int(index / (config.num_hidden_layers / config.num_hidden_groups))].albert_layers)
    return order


def _roberta_head(model: nn.Module) -> list[tuple[nn.Module, nn.Module, Callable[[Tensor], Tensor]]]:
    """RoBERTa's classification head, ``out_proj(tanh(dense(x)))`` (none in a bare model)."""
    head = getattr(model, "classifier", None)
    if head is None or not hasattr(head, "out_proj"):
        return []
    return [(head.dense, head.out_proj, torch.tanh)]


def _gemma_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    hidden = x + block.post_attention_layernorm(attention)
    return hidden + block.post_feedforward_layernorm(block.mlp(block.pre_feedforward_layernorm(hidden)))


def _olmo2_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    hidden = x + block.post_attention_layernorm(attention)
    return hidden + block.post_feedforward_layernorm(block.mlp(hidden))


def _dinov2_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    hidden = x + block.layer_scale1(attention)
    return hidden + block.layer_scale2(block.mlp(block.norm2(hidden)))


def _clip_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    hidden = x + attention
    return hidden + block.mlp(block.layer_norm2(hidden))


def _vit_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    hidden = x + attention
    return hidden + block.mlp(block.layernorm_after(hidden))


_BERT = Architecture(
    ("BertLayer", "RobertaLayer", "XLMRobertaLayer", "ElectraLayer"),
    lambda block: block.attention.output.dense,
    lambda block: block.attention.output.LayerNorm,
    _bert_after,
)
_ROBERTA = dataclasses.replace(_BERT, function_activations=_roberta_head)
# Attention in their own modules (relative positions, ALiBi): see captum_attnflow.hf.own_attention.
_DEBERTA = dataclasses.replace(
    _BERT, blocks=("DebertaV2Layer",), function_activations=deberta_head, lrp_refused=deberta_refused,
    own_attention=DEBERTA,
)
_MPNET = Architecture(
    ("MPNetLayer",), lambda block: block.attention.attn.o, lambda block: block.attention.LayerNorm, mpnet_after,
    function_activations=_roberta_head, own_attention=MPNET,
)
_BLOOM = Architecture(
    ("BloomBlock",), lambda block: block.self_attention.dense, None, bloom_after, residual=bloom_residual,
    own_attention=BLOOM,
)
_FALCON = Architecture(
    ("FalconDecoderLayer",), lambda block: block.self_attention.dense, None, falcon_after, own_attention=FALCON
)
_ALBERT = Architecture(
    ("AlbertLayer",), lambda block: block.attention.dense, lambda block: block.attention.LayerNorm, _albert_after,
    layer_order=_albert_order,
)
_MODERNBERT = Architecture(
    ("ModernBertEncoderLayer",), lambda block: block.attn.Wo, None, _modernbert_after,
    gated_unit=lambda block: (block.mlp.act, block.mlp.Wi), fused_gate=True,
)
_DISTILBERT = Architecture(
    ("TransformerBlock",), lambda block: block.attention.out_lin, lambda block: block.sa_layer_norm, _distilbert_after
)
_GPT2 = Architecture(("GPT2Block",), lambda block: block.attn.c_proj, None, _gpt2_after)
_LLAMA = Architecture(
    ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer"),
    lambda block: block.self_attn.o_proj,
    None,
    _llama_after,
    gated_unit=lambda block: (block.mlp.act_fn, block.mlp.up_proj),
)
_MIXTRAL = Architecture(
    ("MixtralDecoderLayer",), lambda block: block.self_attn.o_proj, None, _llama_after,
    held_constant=lambda block: (block.mlp.gate,),
    gated_experts=lambda block: (block.mlp.experts.act_fn, block.mlp.experts),
)


def _is_moe(block: nn.Module) -> bool:
    """Whether a Qwen3-MoE layer's feed-forward is its mixture of experts (else a dense gated unit:
    the layers of ``mlp_only_layers`` and off the ``decoder_sparse_step``)."""
    return hasattr(block.mlp, "experts")


_QWEN3_MOE = Architecture(
    ("Qwen3MoeDecoderLayer",), lambda block: block.self_attn.o_proj, None, _llama_after,
    gated_unit=lambda block: None if _is_moe(block) else (block.mlp.act_fn, block.mlp.up_proj),
    held_constant=lambda block: (block.mlp.gate,) if _is_moe(block) else (),
    gated_experts=lambda block: (block.mlp.experts.act_fn, block.mlp.experts) if _is_moe(block) else None,
)
_PHI3 = Architecture(
    ("Phi3DecoderLayer",), lambda block: block.self_attn.o_proj, None, _phi3_after,
    gated_unit=lambda block: (block.mlp.activation_fn, block.mlp.gate_up_proj), fused_gate=True,
)
_GPT_NEOX = Architecture(("GPTNeoXLayer",), lambda block: block.attention.dense, None, _gpt_neox_after)
_GPTJ = Architecture(("GPTJBlock",), lambda block: block.attn.out_proj, None, _gptj_after)
_OPT = Architecture(
    ("OPTDecoderLayer",), lambda block: block.self_attn.out_proj,
    lambda block: None if block.do_layer_norm_before else block.self_attn_layer_norm, _opt_after,
)
_VIT = Architecture(
    ("ViTLayer", "DeiTLayer"), lambda block: block.attention.o_proj, None, _vit_after,
    class_tokens=("cls_token", "distillation_token"),
)

def _final_softcap(model: nn.Module) -> tuple[nn.Module, Callable[[Tensor], Tensor]] | None:
    """Gemma 2's soft-capping of its language-model head's output z, :math:`c \\tanh(z / c)` (None without one)."""
    cap, head = getattr(model.config, "final_logit_softcapping", None), getattr(model, "lm_head", None)
    if cap is None or head is None:
        return None

    def softcap(z: Tensor) -> Tensor:
        return torch.tanh(z / cap) * cap

    return head, softcap


# Norms on the attention's output before the residual (and on the feed-forward's): Gemma 2 and 3
# (input norms too), OLMo 2 (no input norm). Gemma 2's soft-capping in its attention is the
# attention call's softcap (AttnLRP's attention function gives it the identity rule); on its
# final logits, a plain torch.tanh after the last module.
_GEMMA = Architecture(
    ("Gemma2DecoderLayer", "Gemma3DecoderLayer"), lambda block: block.self_attn.o_proj, None, _gemma_after,
    gated_unit=lambda block: (block.mlp.act_fn, block.mlp.up_proj), attention_norm=lambda block: block.post_attention_layernorm,
    output_activation=_final_softcap,
)
_OLMO2 = Architecture(
    ("Olmo2DecoderLayer",), lambda block: block.self_attn.o_proj, None, _olmo2_after,
    gated_unit=lambda block: (block.mlp.act_fn, block.mlp.up_proj), attention_norm=lambda block: block.post_attention_layernorm,
)
# DINOv2's layer scales, and its SwiGLU feed-forward where it has one (the giant model).
_DINOV2 = Architecture(
    ("Dinov2Layer",), lambda block: block.attention.o_proj, None, _dinov2_after,
    attention_norm=lambda block: block.layer_scale1, class_tokens=("cls_token",),
    gated_unit=lambda block: (block.mlp.act_fn, block.mlp.up_proj) if hasattr(block.mlp, "up_proj") else None,
)

# CLIP's and SigLIP's towers (the vision towers' class embedding, (D,), CLIP's only).
_CLIP = Architecture(
    ("CLIPEncoderLayer", "SiglipEncoderLayer"), lambda block: block.self_attn.out_proj, None, _clip_after,
    class_tokens=("class_embedding",),
)

# Encoder-decoders. BART and Marian are post-LN; mBART, M2M-100 (and NLLB, an M2M-100) pre-LN; T5
# pre-RMS-norm without biases, its relative position bias a term of the scores that transformers'
# attention-function interface receives (so the captured probabilities hold it).


def _bart_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    hidden = block.self_attn_layer_norm(x + attention)
    return block.final_layer_norm(hidden + block.fc2(block.activation_fn(block.fc1(hidden))))


def _mbart_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    hidden = x + attention
    return hidden + block.fc2(block.activation_fn(block.fc1(block.final_layer_norm(hidden))))


def _t5_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    return block.layer[-1](x + attention)


def _t5_gate(block: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """T5 v1.1's and Flan-T5's gated feed-forward, :math:`W_o(\\mathrm{act}(W_{i0} x) \\odot W_{i1} x)`; None for T5's."""
    feed_forward = block.layer[-1].DenseReluDense
    return (feed_forward.act, feed_forward.wi_1) if hasattr(feed_forward, "wi_1") else None


_BART = Architecture(
    ("BartEncoderLayer", "BartDecoderLayer", "MarianEncoderLayer", "MarianDecoderLayer"),
    lambda block: block.self_attn.out_proj, lambda block: block.self_attn_layer_norm, _bart_after,
    cross_attention=CrossAttention(
        lambda block: block.encoder_attn.out_proj, lambda block: block.encoder_attn_layer_norm,
        lambda block, x, attention: block.self_attn_layer_norm(x + attention),
    ),
)
_MBART = Architecture(
    ("MBartEncoderLayer", "MBartDecoderLayer", "M2M100EncoderLayer", "M2M100DecoderLayer"),
    lambda block: block.self_attn.out_proj, None, _mbart_after,
    cross_attention=CrossAttention(lambda block: block.encoder_attn.out_proj, None, lambda block, x, attention: x + attention),
)
_T5 = Architecture(
    ("T5Block",), lambda block: block.layer[0].SelfAttention.o, None, _t5_after, gated_unit=_t5_gate,
    cross_attention=CrossAttention(lambda block: block.layer[1].EncDecAttention.o, None, lambda block, x, attention: x + attention),
)

ARCHITECTURES: dict[str, Architecture] = {
    "bert": _BERT,
    "roberta": _ROBERTA,
    "xlm-roberta": _ROBERTA,
    "distilbert": _DISTILBERT,
    "electra": _BERT,
    "albert": _ALBERT,
    "modernbert": _MODERNBERT,
    "deberta-v2": _DEBERTA,
    "mpnet": _MPNET,
    "bloom": _BLOOM,
    "falcon": _FALCON,
    "gpt2": _GPT2,
    "gpt_neox": _GPT_NEOX,
    "gptj": _GPTJ,
    "opt": _OPT,
    "captum_attnflow_agreement": _GPT2,  # the bundled classifier and tagger are made of GPT-2 blocks
    "captum_attnflow_tagger": _GPT2,
    "llama": _LLAMA,
    "mistral": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
    "mixtral": _MIXTRAL,
    "qwen3_moe": _QWEN3_MOE,
    "phi3": _PHI3,
    "olmo2": _OLMO2,
    "gemma2": _GEMMA,
    "gemma3_text": _GEMMA,
    "dinov2": _DINOV2,
    "vit": _VIT,
    "clip_text_model": _CLIP,
    "clip_vision_model": _CLIP,
    "siglip_text_model": _CLIP,
    "siglip_vision_model": _CLIP,
    "deit": _VIT,
    "bart": _BART,
    "marian": _BART,
    "mbart": _MBART,
    "m2m_100": _MBART,
    "t5": _T5,
}


# Root-mean-square norms, :math:`y = w \odot x / \sqrt{\overline{x^2} + \epsilon}` with ``weight``
# w and ``variance_epsilon`` (LayerNorms are ``nn.LayerNorm``).
RMS_NORMS = (
    "LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Qwen3MoeRMSNorm", "MixtralRMSNorm", "Phi3RMSNorm",
    "T5LayerNorm",
)
# RMS norms of other forms, :math:`y = w' \odot x / \sqrt{\overline{x^2} + \epsilon}` with
# w' = 1 + w (Gemma) or w (OLMo 2): AttnLRP's identity rule on them is the ratio y / x.
SCALED_RMS_NORMS = ("Gemma2RMSNorm", "Gemma3RMSNorm", "Olmo2RMSNorm")
# Element-wise activation modules outside torch.nn and transformers.activations (BLOOM's GELU).
ACTIVATIONS = ("BloomGelu",)


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
    if architecture.layer_order is not None:
        return architecture, architecture.layer_order(model)
    blocks = [module for module in model.modules() if type(module).__name__ in architecture.blocks]
    if not blocks:
        raise ValueError(f"found no transformer blocks ({', '.join(architecture.blocks)}) in the {model_type!r} model.")
    return architecture, blocks


@contextlib.contextmanager
def scores_as_loaded(module: nn.Module) -> Iterator[None]:
    """Context manager: the Hugging Face models in ``module`` whose attention runs in their own
    modules compute, in eager attention, the scores they compute as loaded (Falcon's eager path
    adds ALiBi twice, sdpa once: :class:`~captum_attnflow.hf.own_attention.OwnAttention`'s
    ``score_terms``, with no leaf); the others as they are."""
    with contextlib.ExitStack() as stack:
        for model in outermost(hf_models(module)):
            architecture = ARCHITECTURES.get(getattr(model.config, "model_type", None))
            if architecture is not None and architecture.own_attention is not None:
                for block in [m for m in model.modules() if type(m).__name__ in architecture.blocks]:
                    stack.enter_context(architecture.own_attention.score_terms(block, lambda term: term))
        yield


def projection_weight(projection: nn.Module) -> tuple[Tensor, Tensor | None]:
    """``(W (D_in, D_out), b (D_out,) or None)`` of an output projection, ``y = x W + b``: an
    ``nn.Linear`` (quantized ones dequantized, :func:`~captum_attnflow.hf.weights.linear_weight`)
    or GPT-2's ``Conv1D``."""
    weight, bias = linear_weight(projection)
    return weight.t(), bias


def layer_norm_parameters(norm: nn.Module) -> tuple[Tensor, Tensor, float]:
    """``(gamma (D,), beta (D,), eps)`` of a LayerNorm (ones and zeros where it has no affine part)."""
    if not isinstance(norm, nn.LayerNorm):
        raise TypeError(f"expected an nn.LayerNorm after the attention, got {type(norm).__name__}.")
    size = norm.normalized_shape[-1]
    device = next(iter(norm.parameters()), torch.empty(0)).device
    gamma = norm.weight if norm.weight is not None else torch.ones(size, device=device)
    beta = norm.bias if norm.bias is not None else torch.zeros(size, device=device)
    return gamma, beta, norm.eps
