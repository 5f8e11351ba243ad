"""Tiny random models of today's model families, built from their transformers configs (no
downloads): causal language models for the decoders, sequence classifiers for the encoders. Each
family's own score terms are active at this size: sliding windows smaller than the inputs of
:func:`family_inputs` (9 tokens), Gemma 2's soft-capping at scores it changes."""

from __future__ import annotations

import torch
import transformers

# Two layers, hidden size 32, 4 query heads (2 key heads where the family groups them); weights
# 10x BERT's default so that the maps are far from uniform.
_COMMON = dict(vocab_size=60, hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2,
               max_position_embeddings=64, initializer_range=0.2, pad_token_id=0, bos_token_id=0, eos_token_id=0)
_GROUPED = dict(num_key_value_heads=2, head_dim=8)

FAMILIES = {
    # decoders
    "qwen3": dict(use_sliding_window=True, sliding_window=4, max_window_layers=1, **_GROUPED),
    "olmo2": dict(num_key_value_heads=2),
    "phi3": dict(num_key_value_heads=2, sliding_window=4),
    "gpt_neox": dict(rotary_pct=0.5),
    "mixtral": dict(num_key_value_heads=2, sliding_window=4, num_local_experts=4, num_experts_per_tok=2),
    # a dense gated layer, then a mixture; every layer through the window
    "qwen3_moe": dict(use_sliding_window=True, sliding_window=4, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=32, norm_topk_prob=True, mlp_only_layers=[0], **_GROUPED),
    "gemma2": dict(sliding_window=4, attn_logit_softcapping=2.0, final_logit_softcapping=3.0, query_pre_attn_scalar=1,
                   **_GROUPED),
    "gemma3_text": dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"], **_GROUPED),
    "opt": dict(ffn_dim=64, word_embed_proj_dim=32, init_std=0.2),
    "gptj": dict(n_embd=32, n_head=4, n_layer=2, rotary_dim=4, n_positions=64),
    # encoders
    "modernbert": dict(global_attn_every_n_layers=2, local_attention=4, cls_token_id=1, sep_token_id=2),
    "electra": dict(embedding_size=16),
    "albert": dict(embedding_size=16),
}
DECODERS = {"qwen3", "qwen3_moe", "olmo2", "phi3", "gpt_neox", "mixtral", "gemma2", "gemma3_text", "opt", "gptj"}


def family_config(model_type: str, **overrides) -> transformers.PretrainedConfig:
    """The tiny config of ``model_type``, with ``overrides``."""
    return transformers.AutoConfig.for_model(model_type, **{**_COMMON, **FAMILIES[model_type], **overrides})


def make_family_model(model_type: str, seed: int = 0) -> torch.nn.Module:
    """A tiny random model of ``model_type`` in eval mode, loaded as ``from_pretrained`` would
    load it (sdpa where the family supports it, Gemma 2 eager): a causal language model for the
    decoders, a 3-class sequence classifier for the encoders."""
    torch.manual_seed(seed)
    config = family_config(model_type)
    if model_type in DECODERS:
        return transformers.AutoModelForCausalLM.from_config(config).eval()
    config.num_labels = 3
    return transformers.AutoModelForSequenceClassification.from_config(config).eval()


def family_inputs(side: str = "right", batch: int = 3, n: int = 9, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token ids 5..59 (B, n) and their attention mask, padded (id 0) on ``side`` ("right",
    "left") to lengths n, 5 and 3 (only the first example unpadded), or None for "none"."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 60, (batch, n), generator=generator)
    if side == "none":
        return ids, None
    lengths = torch.tensor([n, 5, 3][:batch])
    mask = (torch.arange(n)[None] < lengths[:, None]).long()
    if side == "left":
        mask = mask.flip(-1)
    return ids * mask, mask
