"""Shared fixtures: tiny randomly initialised transformers built from configs (no downloads)."""

from __future__ import annotations

import pytest
import torch
import transformers

TINY = dict(vocab_size=60, hidden_size=32, num_attention_heads=4, intermediate_size=64)

CONFIGS = {
    "bert": lambda: transformers.BertConfig(num_hidden_layers=3, max_position_embeddings=64, **TINY),
    "distilbert": lambda: transformers.DistilBertConfig(
        vocab_size=60, dim=32, n_heads=4, hidden_dim=64, n_layers=3, max_position_embeddings=64
    ),
    "roberta": lambda: transformers.RobertaConfig(
        num_hidden_layers=3, max_position_embeddings=70, pad_token_id=1, **TINY
    ),
    "gpt2": lambda: transformers.GPT2Config(
        vocab_size=60, n_embd=32, n_head=4, n_layer=3, n_positions=64, bos_token_id=0, eos_token_id=0
    ),
    # a modern decoder: rotary positions, grouped-query attention (4 query heads share 2 key heads)
    "llama": lambda: transformers.LlamaConfig(
        num_hidden_layers=3, num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
        pad_token_id=0, **TINY
    ),
}

MODEL_CLASSES = {
    "bert": transformers.BertModel,
    "distilbert": transformers.DistilBertModel,
    "roberta": transformers.RobertaModel,
    "gpt2": transformers.GPT2Model,
    "llama": transformers.LlamaModel,
}

# Decoders: a position sees only the tokens up to it, so the last token is the one to explain.
CAUSAL = {"gpt2", "llama"}


def make_tiny_model(arch: str, attn_implementation: str | None = None, seed: int = 0) -> torch.nn.Module:
    """A tiny random ``arch`` model in eval mode, loaded like ``from_pretrained`` would (sdpa by default)."""
    torch.manual_seed(seed)
    config = CONFIGS[arch]()
    if attn_implementation is not None:
        config._attn_implementation = attn_implementation
    return MODEL_CLASSES[arch](config).eval()


@pytest.fixture(params=sorted(CONFIGS))
def arch(request) -> str:
    return request.param


@pytest.fixture
def tiny_model_factory():
    return make_tiny_model
