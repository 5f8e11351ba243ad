"""Shared test helpers (not a test module): tiny randomly initialised transformers built from
configs (no downloads), tiny classifiers and padded batches, the evaluator set-up shared by the
evaluator tests and their ``accelerate launch`` script, and headless Chromium without network.
``pytest``'s ``pythonpath`` puts this folder on the import path."""

from __future__ import annotations

import shutil
import subprocess
import tempfile

import pytest
import torch
import transformers
from torch import nn

from captum_attnflow import (
    ALTI,
    AttentionFlow,
    AttentionNorm,
    AttentionRollout,
    AttnLRP,
    GradientWeightedRollout,
    RawAttention,
    ValueZeroing,
)
from captum_attnflow.baselines import BlankOut, TokenSaliency
from captum_attnflow.evaluate import Evaluator

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


def make_lm(arch: str, vocab: int) -> torch.nn.Module:
    """A tiny random language model of ``vocab`` tokens: causal (gpt2, llama, mistral with a sliding
    window of 3) or encoder-decoder (t5, bart), in eval mode."""
    torch.manual_seed(0)
    if arch == "gpt2":
        config = transformers.GPT2Config(vocab_size=vocab, n_embd=32, n_head=4, n_layer=3, n_positions=64,
                                         bos_token_id=2, eos_token_id=3, pad_token_id=0)
        return transformers.GPT2LMHeadModel(config).eval()
    if arch == "llama":
        config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                          intermediate_size=64, num_hidden_layers=3, max_position_embeddings=64,
                                          bos_token_id=2, eos_token_id=3, pad_token_id=0)
        return transformers.LlamaForCausalLM(config).eval()
    if arch == "mistral":  # a sliding window shorter than the prompts
        config = transformers.MistralConfig(vocab_size=vocab, hidden_size=32, num_attention_heads=4, num_key_value_heads=1,
                                            intermediate_size=64, num_hidden_layers=3, max_position_embeddings=64,
                                            sliding_window=3, bos_token_id=2, eos_token_id=3, pad_token_id=0)
        return transformers.MistralForCausalLM(config).eval()
    if arch == "t5":
        config = transformers.T5Config(vocab_size=vocab, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=2,
                                       decoder_start_token_id=0, eos_token_id=3, pad_token_id=0)
        return transformers.T5ForConditionalGeneration(config).eval()
    config = transformers.BartConfig(vocab_size=vocab, d_model=16, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, max_position_embeddings=32, decoder_start_token_id=2,
                                     bos_token_id=2, eos_token_id=3, pad_token_id=0, forced_eos_token_id=None)
    return transformers.BartForConditionalGeneration(config).eval()


# Two unpadded examples of six tokens for the tiny models.
IDS = torch.tensor([[5, 9, 13, 22, 7, 30], [6, 8, 10, 11, 12, 14]])


def eager_attentions(arch: str, ids: torch.Tensor, **kwargs) -> tuple[torch.Tensor, ...]:
    """The reference: what a tiny eager ``arch`` model returns for ``output_attentions=True``."""
    model = make_tiny_model(arch, attn_implementation="eager")
    with torch.no_grad():
        return model(ids, output_attentions=True, **kwargs).attentions


# Every attribution method that explains a token sequence of a Hugging Face model.
TOKEN_METHODS = [RawAttention, AttentionRollout, AttentionFlow, GradientWeightedRollout, ALTI, AttentionNorm, ValueZeroing, AttnLRP]

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


def embedding_gradients(model, ids, mask, target, probabilities=False):
    """Gradient of the target's score with respect to the word embeddings, by plain autograd."""
    embeddings = model.get_input_embeddings()(ids).detach().requires_grad_()
    logits = model(inputs_embeds=embeddings, attention_mask=mask).logits
    scores = torch.softmax(logits, -1) if probabilities else logits
    scores.gather(1, target[:, None]).sum().backward()
    return embeddings, embeddings.grad


NUM_BATCHES = 5
# What the accelerate test measures beside the correlations: one cheap metric.
DISTRIBUTED_FAITHFULNESS = {"sufficiency": {"fractions": [0.5]}}


def make_batches(num_batches: int = NUM_BATCHES) -> list[dict]:
    """Right-padded batches of 4 examples with labels, each batch padded differently."""
    batches = []
    for seed in range(num_batches):
        ids, mask = padded_batch(seed=seed)
        labels = torch.randint(0, 3, (ids.shape[0],), generator=torch.Generator().manual_seed(100 + seed))
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return batches


def make_evaluator(model: torch.nn.Module, calls: list, faithfulness=None) -> Evaluator:
    """Raw attention and rollout per layer, and a position baseline (a callable that counts its calls),
    against blank-out and input gradients; ``faithfulness`` as the Evaluator takes it."""

    def first_tokens_first(batch: dict) -> torch.Tensor:
        calls.append(batch["input_ids"].shape[0])
        return -torch.arange(batch["input_ids"].shape[1], dtype=torch.float32).expand(batch["input_ids"].shape)

    return Evaluator(
        model,
        {"raw": RawAttention, "rollout": AttentionRollout(model), "position": first_tokens_first},
        {"blank-out": BlankOut(model, token=UNK), "grad": TokenSaliency(model)},
        show_progress=False,
        faithfulness=faithfulness,
    )


# Structured attention where many max flows fall below the trivial bound (the flow tests' graphs).


def softmax_attention(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits, -1)


def causal_sink(layers: int, n: int, heads: int = 2, seed: int = 0) -> torch.Tensor:
    """Causal attention whose heads pour most weight on token 0 (an attention sink)."""
    generator = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(layers, 1, heads, n, n, generator=generator)
    logits[..., 0] += 3
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    return softmax_attention(logits.masked_fill(future, float("-inf")))


def banded(layers: int, n: int, width: int = 2, heads: int = 2, seed: int = 0) -> torch.Tensor:
    """Local attention: each query sees the keys within ``width`` positions."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(layers, 1, heads, n, n, generator=generator)
    index = torch.arange(n)
    far = (index[:, None] - index[None, :]).abs() > width
    return softmax_attention(logits.masked_fill(far, float("-inf")))


def peaked(layers: int, n: int, heads: int = 2, seed: int = 0) -> torch.Tensor:
    """Nearly one-hot heads: each query attends to a few random keys."""
    generator = torch.Generator().manual_seed(seed)
    return softmax_attention(6 * torch.randn(layers, 1, heads, n, n, generator=generator))


# Tiny encoder-decoders of each geometry: BART and Marian post-LN, mBART and M2M-100 (NLLB) pre-LN,
# T5 pre-RMS-norm without biases (gated as T5 v1.1). Initialised wide, so that no token's share is
# negligible and the decompositions' differences show.
_SEQ2SEQ_COMMON = dict(
    vocab_size=40, d_model=16, encoder_layers=2, decoder_layers=3, encoder_attention_heads=2, decoder_attention_heads=2,
    encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32, init_std=0.3,
)
SEQ2SEQ = {
    "bart": lambda: transformers.BartForConditionalGeneration(transformers.BartConfig(**_SEQ2SEQ_COMMON)),
    "marian": lambda: transformers.MarianMTModel(
        transformers.MarianConfig(**_SEQ2SEQ_COMMON, pad_token_id=1, decoder_start_token_id=2)
    ),
    "mbart": lambda: transformers.MBartForConditionalGeneration(transformers.MBartConfig(**_SEQ2SEQ_COMMON)),
    "m2m_100": lambda: transformers.M2M100ForConditionalGeneration(transformers.M2M100Config(**_SEQ2SEQ_COMMON, pad_token_id=1)),
    "t5": lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=40, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=3, num_heads=2,
        feed_forward_proj="gated-gelu", decoder_start_token_id=2, pad_token_id=1,
    )),
}


def make_seq2seq(kind: str, seed: int = 0) -> nn.Module:
    """A tiny random encoder-decoder of :data:`SEQ2SEQ` in eval mode (sdpa, as loaded)."""
    torch.manual_seed(seed)
    return SEQ2SEQ[kind]().eval()


def seq2seq_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(source, source_mask, decoder_inputs, decoder_mask, written)``: two examples padded on the
    right (pad id 1), the second shorter on both sides; ``written`` (B, m) each position's next token."""
    source = torch.tensor([[5, 6, 7, 8, 9, 3], [10, 11, 12, 3, 1, 1]])
    source_mask = (source != 1).long()
    written = torch.tensor([[13, 14, 15, 3], [16, 3, 1, 1]])
    decoder = torch.tensor([[2, 13, 14, 15], [2, 16, 1, 1]])
    decoder_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    return source, source_mask, decoder, decoder_mask, written


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
needs_browser = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium on PATH (apt-get install chromium; .ci/run installs it)"
)


def browser(*args: str) -> str:
    """Run headless Chromium on ``args`` (e.g. ``--dump-dom`` and a ``file://`` address) with the
    network off (no host name resolves, no background requests) and a fresh profile; its stdout."""
    with tempfile.TemporaryDirectory() as profile:
        command = [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--disable-background-networking",
            "--no-first-run", "--disable-component-update", "--disable-sync", "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--user-data-dir={profile}", *args,
        ]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout
