"""The families that compute their attention in their own modules, outside transformers'
attention-function interface: DeBERTa-v2/v3 (content-to-position and position-to-content
terms), MPNet (a relative position bias), BLOOM and Falcon (ALiBi; Falcon's newer models rotary
positions). Each returns its exact probabilities with ``output_attentions``, and computes its
queries, keys and values with ordinary linear layers; :class:`OwnAttention` says where, and the
functions here the rest of their blocks, for the rows of
:data:`~captum_attnflow.hf.architectures.ARCHITECTURES`.

The score terms other than :math:`q k^\\top` (the relative-position terms, ALiBi) are biases of
the scores to AttnLRP: it passes each through a leaf of its own for the run
(:attr:`OwnAttention.score_terms`), so they take their share of the relevance and pass none on.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator, Sequence

import torch
from torch import Tensor, nn
from transformers.activations import ACT2FN

# ``(block, leaf)`` -> a context in which each score term of the block's attention is ``leaf(term)``.
ScoreTerms = Callable[[nn.Module, Callable[[Tensor], Tensor]], ContextManager[None]]


@dataclass(frozen=True)
class OwnAttention:
    """Where a family whose attention runs in its own module keeps its pieces.

    Attributes:
        module: ``block -> module`` the attention module; with ``output_attentions`` (and eager
            attention) its output's second item is its probabilities (B, H, n, n), the tensor
            it multiplies with its values.
        projections: ``block -> modules`` the linear layers whose outputs hold the queries, keys
            and values: three, or one fused (BLOOM's and Falcon's ``query_key_value``).
        split: ``(block, outputs)`` -> ``(q, k, v)``: the queries (B, H, n, d) and keys and
            values (B, H_kv, n, d) in the projections' outputs (B, n, ·), as the family splits
            them (its own method where it has one).
        score_terms: ``(block, leaf)`` -> a context in which every term added to the block's
            scores other than :math:`q k^\\top` (relative positions, ALiBi) is passed through
            ``leaf`` (AttnLRP's leaves; the identity for the other methods, which run in it too).
        causal: whether each query sees only earlier keys (the decoders).
        score_tables: ``model -> modules``, the embedding tables the score terms are looked up
            in (MPNet's relative position buckets): not token embeddings.
    """

    module: Callable[[nn.Module], nn.Module]
    projections: Callable[[nn.Module], tuple[nn.Module, ...]]
    split: Callable[[nn.Module, Sequence[Tensor]], tuple[Tensor, Tensor, Tensor]]
    score_terms: ScoreTerms
    causal: bool
    score_tables: Callable[[nn.Module], list[nn.Module]] = lambda model: []


def qkv_factors(own: OwnAttention, block: nn.Module, factors: tuple[float, float, float]) -> list[Tensor]:
    """Per projection of ``block``, (C,) the factor of each output channel: ``factors[0]`` on
    the channels :attr:`OwnAttention.split` reads as queries, ``factors[1]`` keys, ``factors[2]``
    values (1 on any other), found by splitting the channels' own indices.

    Example::

        >>> import transformers
        >>> from captum_attnflow.hf.own_attention import BLOOM, qkv_factors
        >>> model = transformers.BloomModel(transformers.BloomConfig(hidden_size=8, n_head=2, n_layer=1))
        >>> (factors,) = qkv_factors(BLOOM, model.h[0], (0.25, 0.25, 0.5))  # one fused projection
        >>> factors.view(2, 3, 4)[:, :, 0].tolist()  # per head (H, 3, d): its query, key, value channels
        [[0.25, 0.25, 0.5], [0.25, 0.25, 0.5]]
    """
    projections = own.projections(block)
    sizes = [projection.out_features for projection in projections]
    starts = [sum(sizes[:index]) for index in range(len(sizes))]
    ids = [torch.arange(start, start + size, dtype=torch.float64).view(1, 1, size) for start, size in zip(starts, sizes)]
    result = torch.ones(sum(sizes), dtype=torch.float64)
    for role, factor in zip(own.split(block, ids), factors):
        result[role.flatten().long().unique()] = factor
    return [result[start : start + size] for start, size in zip(starts, sizes)]


def _heads(x: Tensor, size: int) -> Tensor:
    """(B, n, h d) -> (B, h, n, d), heads of ``size`` numbers."""
    return x.view(*x.shape[:2], -1, size).transpose(1, 2)


@contextlib.contextmanager
def _deberta_terms(block: nn.Module, leaf: Callable[[Tensor], Tensor]) -> Iterator[None]:
    """DeBERTa's content-to-position and position-to-content terms, computed by one method of
    the attention module from its queries and keys: that method's result through ``leaf``."""
    attention = block.attention.self
    method = type(attention).disentangled_attention_bias
    attention.disentangled_attention_bias = lambda *args, **kwargs: leaf(method(attention, *args, **kwargs))
    try:
        yield
    finally:
        del attention.disentangled_attention_bias


def _argument_terms(module: Callable[[nn.Module], nn.Module], name: str) -> ScoreTerms:
    """Score terms given to the attention module as its argument ``name`` (a position bias, ALiBi)."""

    @contextlib.contextmanager
    def terms(block: nn.Module, leaf: Callable[[Tensor], Tensor]) -> Iterator[None]:
        attention = module(block)
        signature = inspect.signature(attention.forward)

        def hook(_: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            bound = signature.bind(*args, **kwargs)
            if isinstance(bound.arguments.get(name), Tensor):
                bound.arguments[name] = leaf(bound.arguments[name])
            return bound.args, bound.kwargs

        handle = attention.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()

    return terms


@contextlib.contextmanager
def _falcon_terms(block: nn.Module, leaf: Callable[[Tensor], Tensor]) -> Iterator[None]:
    """Falcon's ALiBi (None with rotary positions). The model adds it, over sqrt(d), into the
    additive mask it gives every block, and the attention's eager path adds it again from its
    own argument (sdpa, which computes the model as loaded, adds only the mask): the argument is
    0 for the run, so the scores are sdpa's, and the mask carries the term."""
    attention = block.self_attention
    signature = inspect.signature(attention.forward)

    def hook(_: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        bound = signature.bind(*args, **kwargs)
        if isinstance(bound.arguments.get("alibi"), Tensor):
            bound.arguments["alibi"] = torch.zeros_like(bound.arguments["alibi"])
            bound.arguments["attention_mask"] = leaf(bound.arguments["attention_mask"])
        return bound.args, bound.kwargs

    handle = attention.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def mpnet_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    """MPNet's block after its attention's output: BERT's, other names (the table's ``after_attention``)."""
    hidden = block.attention.LayerNorm(attention + x)
    return block.output(block.intermediate(hidden), hidden)


def bloom_residual(block: nn.Module, x: Tensor) -> Tensor:
    """What BLOOM adds its attention's output to: the block's input, or with
    ``apply_residual_connection_post_layernorm`` the input norm's output (the table's ``residual``)."""
    return block.input_layernorm(x) if block.apply_residual_connection_post_layernorm else x


def bloom_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    """BLOOM's block after its attention's output (the table's ``after_attention``)."""
    hidden = bloom_residual(block, x) + attention
    normed = block.post_attention_layernorm(hidden)
    # the feed-forward adds its residual itself
    return block.mlp(normed, normed if block.apply_residual_connection_post_layernorm else hidden)


def falcon_after(block: nn.Module, x: Tensor, attention: Tensor) -> Tensor:
    """Falcon's block after its attention's output, its feed-forward beside the attention (on the
    block's input) or after it (the table's ``after_attention``)."""
    config = block.config
    if hasattr(block, "ln_mlp"):  # two norms in parallel: the feed-forward reads the block's input
        return x + attention + block.mlp(block.ln_mlp(x))
    if config.new_decoder_architecture or config.parallel_attn:  # one norm for both branches
        return x + attention + block.mlp(block.input_layernorm(x))
    hidden = x + attention
    return hidden + block.mlp(block.post_attention_layernorm(hidden))


def deberta_head(model: nn.Module) -> list[tuple[nn.Module, nn.Module, Callable[[Tensor], Tensor]]]:
    """DeBERTa's classification head, ``classifier(act(pooler.dense(x)))`` (none in a bare model)."""
    pooler, classifier = getattr(model, "pooler", None), getattr(model, "classifier", None)
    if pooler is None or classifier is None:
        return []
    activation = ACT2FN[pooler.config.pooler_hidden_act]

    def act(x: Tensor) -> Tensor:
        return activation(x)

    act.__name__ = pooler.config.pooler_hidden_act
    return [(pooler.dense, classifier, act)]


def deberta_refused(config: Any) -> str | None:
    """Why AttnLRP's rules do not cover a DeBERTa-v2 model of ``config``, or None (the table's ``lrp_refused``)."""
    if getattr(config, "conv_kernel_size", 0) > 0:
        return "its convolution layer after the first block calls its activation as a plain function"
    return None


DEBERTA = OwnAttention(
    module=lambda block: block.attention.self,
    projections=lambda block: (block.attention.self.query_proj, block.attention.self.key_proj, block.attention.self.value_proj),
    split=lambda block, outputs: tuple(_heads(x, block.attention.self.attention_head_size) for x in outputs),
    score_terms=_deberta_terms,
    causal=False,
)
MPNET = OwnAttention(
    module=lambda block: block.attention.attn,
    projections=lambda block: (block.attention.attn.q, block.attention.attn.k, block.attention.attn.v),
    split=lambda block, outputs: tuple(_heads(x, block.attention.attn.attention_head_size) for x in outputs),
    score_terms=_argument_terms(lambda block: block.attention.attn, "position_bias"),
    causal=False,
    score_tables=lambda model: [model.base_model.encoder.relative_attention_bias],
)
BLOOM = OwnAttention(
    module=lambda block: block.self_attention,
    projections=lambda block: (block.self_attention.query_key_value,),
    split=lambda block, outputs: block.self_attention._reshape(outputs[0]),
    score_terms=_argument_terms(lambda block: block.self_attention, "alibi"),
    causal=True,
)
FALCON = OwnAttention(
    module=lambda block: block.self_attention,
    projections=lambda block: (block.self_attention.query_key_value,),
    split=lambda block, outputs: tuple(x.transpose(1, 2) for x in block.self_attention._split_heads(outputs[0])),
    score_terms=_falcon_terms,
    causal=True,
)
