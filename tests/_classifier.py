"""Tiny random classifiers for the baseline and evaluator tests (also used by the accelerate script)."""

from __future__ import annotations

import torch
import transformers
from torch import nn

from conftest import make_tiny_model

UNK = 3


def make_classifier(seed: int = 0, num_labels: int = 3, layers: int = 3) -> nn.Module:
    """A tiny random BertForSequenceClassification (vocab 60, pad id 0) in eval mode, sdpa attention.

    Weights are drawn 10x wider than BERT's default (initializer_range 0.2): with 0.02 the
    class probabilities barely move when tokens change (drops ~1e-6, float32 noise level),
    which would let wrong deletions or blank-outs pass the comparisons."""
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=60, hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=layers,
        max_position_embeddings=64, num_labels=num_labels, pad_token_id=0, initializer_range=0.2,
    )
    return transformers.BertForSequenceClassification(config).eval()


class FirstTokenClassifier(nn.Module):
    """A plain nn.Module around a tiny base model: a linear head on the first token's hidden state."""

    def __init__(self, arch: str, num_labels: int = 2) -> None:
        super().__init__()
        self.encoder = make_tiny_model(arch)
        torch.manual_seed(1)
        self.head = nn.Linear(32, num_labels)

    def forward(self, input_ids, attention_mask=None):
        hidden = self.encoder(input_ids, attention_mask=attention_mask).last_hidden_state
        return self.head(hidden[:, 0])


def padded_batch(seed: int = 0, batch: int = 4, n: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids (5..59) with right padding (id 0) of different lengths, and the attention mask."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 60, (batch, n), generator=generator)
    lengths = torch.randint(3, n + 1, (batch,), generator=generator)
    lengths[0] = n
    mask = (torch.arange(n)[None] < lengths[:, None]).long()
    return ids * mask, mask


def model_state(model: nn.Module) -> tuple:
    """Everything a baseline must leave as it was: mode, requires_grad, hooks, attention implementation."""
    return (
        [m.training for m in model.modules()],
        [p.requires_grad for p in model.parameters()],
        sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules()),
        [getattr(getattr(m, "config", None), "_attn_implementation", None) for m in model.modules()],
        [p.grad is None for p in model.parameters()],
    )
