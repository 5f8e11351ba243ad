"""AttnLRP's rules (Achtibat et al., ICML 2024) as the model's own backward pass, modified.

Layer-wise relevance propagation with the ε-rule at ε = 0 equals gradient × input when every
layer's backward multiplies by a *rule Jacobian* :math:`J'` with :math:`J' x + b = y` (b: what the
layer's biases keep); the relevance reaching a tensor x is then :math:`x \\odot \\tilde\\nabla_x y_t`.
Linear layers, embeddings, rotary positions and residual sums keep their plain gradient; the
others get AttnLRP's rules here, for one forward pass, by three means that leave the model's
forward values untouched (each rule returns the model's own output, only its gradient differs):

* an attention function registered with transformers' attention-function interface scales the
  gradients of the queries and keys by 1/4 and of the values by 1/2, then runs the attention the
  model was loaded with (sdpa: its backward keeps no (H, n, n) probabilities, so the pass costs
  the memory of a plain backward pass; eager models run sdpa, equal up to rounding). Queries and keys meet only in :math:`q k^\\top`, the probabilities and
  values only in :math:`A v`, so this is the uniform rule on both bilinear products (each factor
  half of the relevance; q and k a half of the half A receives); the softmax keeps its plain
  gradient, which in gradient × input form is the paper's Proposition 3.1,
  :math:`R_{in} = s_{in} \\odot (R_{out} - p \\sum R_{out})` with s the scores and p the
  probabilities. Gemma 2's soft-capping :math:`c \\tanh(s / c)` of the scores, an element-wise
  function before the softmax, takes the identity rule (:func:`_capped_attention`);
* the families whose attention runs in their own modules (DeBERTa, MPNet, BLOOM, Falcon; the
  table's ``own_attention``) run eager, with the same factors on their query, key and value
  projections' outputs (linear maps of q, k, v: the same rule); the other terms of their scores
  (relative positions, ALiBi) are biases: each a leaf of its own, which takes its share
  :math:`t \\odot \\tilde\\nabla_t` and passes nothing on, as the ε-rule gives a bias;
* forward hooks on the norms: LayerNorm and RMSNorm by the identity rule on their division,
  :math:`1/\\sigma` held constant (LayerNorm's centring and both affine parts keep their gradient);
* forward hooks on element-wise activations (GELU, SiLU, tanh, ...): the identity rule,
  gradient :math:`f(x)/x`; and on the two factors of a gated feed-forward (the architecture
  table's ``gated_unit``), gradient scaled by 1/2: the uniform rule on :math:`\\mathrm{act}(g) \\odot u`
  (a mixture's experts, whose product no hook reaches: the identity rule on the activation and
  the experts' output gradient scaled by 1/2, the same rule since only linear maps follow the
  product there);
* a quantized linear layer keeps its own output with the gradient of its dequantized weight
  (:mod:`captum_attnflow.capture.quantized`); what its kernel adds to :math:`x W^\\top` is held
  constant, as a bias is.

The relevance of token j is :math:`\\sum_d e_{jd} \\tilde\\nabla_{e_{jd}} y_t`, e the token
embeddings (the input embedding layer's output; for a vision transformer the patch embeddings
and its learned class tokens; for an encoder-decoder two leaves, the encoder's and the decoder's
token embeddings, its cross-attention under the same rule as self-attention,
:func:`~captum_attnflow.capture.seq2seq_lrp.seq2seq_attnlrp_forward`). The model is left as it
was (attention implementation, mode, hooks), also when the call raises.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.pytorch_utils import Conv1D

from captum_attnflow.capture.lean import scale_and_causality
from captum_attnflow.capture.lean_blocks import attends_causally
from captum_attnflow.capture.lrp_rules import (
    _function_activation_hooks,
    _GradientScale,
    _IdentityRule,
    _multihead_attention_hooks,
    _output_activation_hooks,
    _rule_hooks,
)
from captum_attnflow.capture.maps import in_run_order, real_tokens_first_call
from captum_attnflow.capture.quantized import dequantized_gradients
from captum_attnflow.capture.recompute import layerwise_recomputation
from captum_attnflow.hf.architectures import Architecture, architecture_of
from captum_attnflow.hf.inputs import as_tuple, check_mask_not_in_args, mask_keyword
from captum_attnflow.hf.models import check_device, main_model, owning_module
from captum_attnflow.hf.scores import input_embeddings, kept_in, kept_logits, logit_rows
from captum_attnflow.hf.own_attention import qkv_factors
from captum_attnflow.hf.state import eager_attention, implementation, register_attention, relevance_rules, unchanged
from captum_attnflow.hf.weights import is_quantized, linear_weight

_NAME = "captum_attnflow_attnlrp"

@dataclass
class LRPRun:
    """One forward pass under AttnLRP's rules.

    Attributes:
        output: what the model returned (its scores in the autograd graph of the rules).
        embeddings: (B, n, D) the leaf whose modified gradient is read: the token embeddings
            (text), or the embedded sequence before the first block (vision transformers).
        tokens: (B, n, D) the token embeddings themselves, detached (the relevance of token j is
            ``(tokens * gradient)[:, j].sum(-1)``).
        order: (B, n) the run's token order when a left-padded batch ran with its real tokens
            first, else None.
        causal: whether the first attention layer was causal (each query sees only earlier keys).
        attended: whether an attention layer ran under the rules.
        attention: the attention function the model was loaded with (transformers' interface).
        others: (B, ..., D) the outputs of the model's other embedding layers (position and
            token-type tables), as leaves; recorded only for :meth:`shares`.
        score_terms: the terms of the attention scores other than :math:`q k^\\top` of a family
            whose attention runs in its own module (relative positions, ALiBi), each a leaf
            (batch first, (B, ...) or (B H, ...)).
        biased: ``(output (B, ..., D_out), bias (D_out,), name)`` of every call of a layer with a
            bias (linear layers, LayerNorms), the output whose gradient is the bias's; recorded
            only for :meth:`shares`.
        kept: the run's positions whose logits a language model computed (its
            ``logits_to_keep``, :func:`~captum_attnflow.hf.scores.kept_logits`), or None for all.
    """

    output: Any = None
    embeddings: Tensor | None = None
    tokens: Tensor | None = None
    order: Tensor | None = None
    causal: bool = False
    attended: bool = False
    attention: Callable[..., tuple[Tensor, Any]] = sdpa_attention_forward
    others: list[Tensor] = field(default_factory=list)
    score_terms: list[Tensor] = field(default_factory=list)
    biased: list[tuple[Tensor, Tensor, str]] = field(default_factory=list)
    kept: Tensor | None = None

    def run_positions(self, positions: Tensor) -> Tensor:
        """(B, S) positions of the inputs, as positions in the run."""
        return positions if self.order is None else in_run_order(positions, self.order)

    def logit_rows(self, positions: Tensor) -> Tensor:
        """(B, S) the rows of the output's logits holding the inputs' ``positions`` (B, S)."""
        return logit_rows(self.kept, self.run_positions(positions))

    def relevance(self, score: Tensor, retain_graph: bool = False) -> Tensor:
        """(B, n) relevance of every token for ``score`` (B,) (selected from ``output`` with autograd
        on), one backward pass, in the inputs' order."""
        (gradient,) = torch.autograd.grad(score.sum(), self.embeddings, retain_graph=retain_graph)
        relevance = (self.tokens * gradient).sum(-1)
        return relevance if self.order is None else relevance.gather(1, self.order.argsort(-1))

    def shares(self, score: Tensor, retain_graph: bool = False) -> dict[str, Tensor]:
        """Where the relevance of ``score`` (B,) ends, one backward pass (a run made with
        ``shares=True``): each (B,) tensor of

        * ``"tokens"``: :math:`\\sum_j R_j`, the token embeddings' relevance;
        * ``"other_embeddings"``: the position and token-type embeddings' (the other embedding
          tables, a vision transformer's position embeddings), and the score terms' (relative
          positions, ALiBi);
        * ``"biases"``: :math:`\\sum b \\cdot \\tilde\\nabla_b\\, y`, what the biases of the linear
          layers and LayerNorms keep (the ε-rule at ε = 0 gives a bias its share of the output),
          and on a quantized model what each quantized layer adds to :math:`x W^\\top` beside its bias
          (its rounding, held as a bias is);
        * ``"softmax"``: the rest of the score, what the softmax linearisation loses (every other
          rule conserves).
        """
        biased = [(output, bias, name) for output, bias, name in self.biased if output.requires_grad]
        others = [*self.others, *self.score_terms]
        leaves = [self.embeddings, *others, *(output for output, _, _ in biased)]
        gradients = torch.autograd.grad(score.sum(), leaves, retain_graph=retain_graph, allow_unused=True)
        batch = score.shape[0]

        def kept(value: Tensor, gradient: Tensor | None) -> Tensor:
            if gradient is None:
                return score.new_zeros(score.shape)
            return (value * gradient).reshape(batch, -1).sum(1).to(score.dtype)  # rows flattened batch first

        tokens = kept(self.tokens, gradients[0])
        kept_by_others = kept(self.embeddings.detach() - self.tokens, gradients[0])  # a vision transformer's positions
        kept_by_others = kept_by_others + sum((kept(o.detach(), g) for o, g in zip(others, gradients[1:])),
                                              score.new_zeros(score.shape))
        kept_by_biases = score.new_zeros(score.shape)
        for (output, bias, name), gradient in zip(biased, gradients[1 + len(others) :]):
            if gradient is not None and output.shape[0] % batch:
                raise ValueError(
                    f"AttnLRP's shares need each layer's output with the batch first (or batch and tokens flattened, "
                    f"batch first); {name} returned {tuple(output.shape)} for a batch of {batch}."
                )
            kept_by_biases = kept_by_biases + kept(bias, gradient)
        score = score.detach()
        return {"tokens": tokens, "other_embeddings": kept_by_others, "biases": kept_by_biases,
                "softmax": score - tokens - kept_by_others - kept_by_biases}


_CURRENT: contextvars.ContextVar[LRPRun | None] = contextvars.ContextVar("captum_attnflow_attnlrp", default=None)


def _attnlrp_attention(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, **kwargs: Any
) -> tuple[Tensor, None]:
    run = _CURRENT.get()
    if not run.attended:
        run.attended = True
        _, causal = scale_and_causality(module, query, attention_mask, kwargs.get("scaling"), kwargs)
        run.causal = query.shape[-2] > 1 and attends_causally(query.shape[-2], attention_mask, causal)
    query, key, value = _GradientScale.apply(query, 0.25), _GradientScale.apply(key, 0.25), _GradientScale.apply(value, 0.5)
    if kwargs.get("softcap") is not None:
        return _capped_attention(module, query, key, value, attention_mask, **kwargs), None
    return run.attention(module, query, key, value, attention_mask, **kwargs)[0], None


def _capped_attention(
    module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, softcap: float,
    scaling: float | None = None, **kwargs: Any,
) -> Tensor:
    """(B, n, H, d) the output of an attention call whose scores are soft-capped,
    :math:`c \\tanh(q k^\\top s / c) + M` (Gemma 2), as the family's eager attention computes it,
    the cap by the identity rule (gradient :math:`c \\tanh(x / c) / x`). ``attention_mask``:
    sdpa's (bool, True = attend; None where the call is causal or unmasked)."""
    scale, causal = scale_and_causality(module, query, attention_mask, scaling, kwargs)
    heads, queries, keys = query.shape[1], query.shape[2], key.shape[2]
    key, value = (x.repeat_interleave(heads // x.shape[1], dim=1) for x in (key, value))
    scores = torch.matmul(query, key.transpose(2, 3)) * scale
    capped = _IdentityRule.apply(scores, torch.tanh(scores.detach() / softcap) * softcap, 1.0)
    if attention_mask is None and causal:
        attention_mask = torch.ones(queries, keys, dtype=torch.bool, device=query.device).tril(keys - queries)
    if attention_mask is not None:
        capped = capped.masked_fill(~attention_mask, torch.finfo(capped.dtype).min)
    # in float32 at least, as eager attention (a float64 model in float64: no row of padding turns NaN)
    probabilities = torch.softmax(capped, dim=-1, dtype=torch.promote_types(capped.dtype, torch.float32)).to(query.dtype)
    return torch.matmul(probabilities, value).transpose(1, 2).contiguous()


@contextlib.contextmanager
def _rules(
    model: nn.Module, architecture: Architecture, blocks: list[nn.Module], run: LRPRun,
    leaves: Callable[[nn.Module, LRPRun], list[Any]] | None = None,
) -> Iterator[None]:
    """Install the rules and the embedding leaf on ``model`` for the block; removed on exit.
    ``leaves``: ``(model, run) -> handles`` of the hooks making the run's leaves, where they are
    not the input embeddings' output (an encoder-decoder's two)."""
    handles = [module.register_forward_hook(hook) for module, hook in _rule_hooks(model, architecture, blocks)]
    handles += _embedding_hooks(model, architecture, run) if leaves is None else leaves(model, run)
    handles += _function_activation_hooks(model, architecture)
    handles += _output_activation_hooks(model, architecture)
    handles += _multihead_attention_hooks(model)
    token = _CURRENT.set(run)
    try:
        with relevance_rules(), contextlib.ExitStack() as stack:
            if architecture.own_attention is not None:
                handles += _own_attention_rules(architecture, blocks, run, stack)
            yield
    finally:
        _CURRENT.reset(token)
        for handle in handles:
            handle.remove()


def _own_attention_rules(architecture: Architecture, blocks: list[nn.Module], run: LRPRun,
                         stack: contextlib.ExitStack) -> list[Any]:
    """The attention rules on a family whose attention runs in its own modules: its query, key
    and value projections' outputs with gradients scaled by 1/4, 1/4, 1/2, its score terms as
    leaves, their gradient halved (entered on ``stack``); and the run's ``attended`` and
    ``causal`` set by its attention modules. Returns the hooks' handles."""
    own = architecture.own_attention

    def leaf(term: Any) -> Any:
        if not isinstance(term, Tensor):
            return term
        run.score_terms.append(term.detach().requires_grad_())
        # The probabilities take half of A v's relevance (the uniform rule), and with them the
        # scores: the queries and keys carry that half in their 1/4 = 1/2 · 1/2, a score term here.
        return _GradientScale.apply(run.score_terms[-1], 0.5)

    def scaled(factor: Tensor) -> Callable[[nn.Module, tuple, Tensor], Tensor]:
        return lambda _module, _args, output: _GradientScale.apply(output, factor.to(output.device, output.dtype))

    def attended(_module: nn.Module, _args: tuple, _output: Any) -> None:
        run.attended = True
        run.causal = own.causal and run.tokens.shape[1] > 1

    handles = []
    for block in dict.fromkeys(blocks):  # a shared block (ALBERT) is listed once per call
        for projection, factor in zip(own.projections(block), qkv_factors(own, block, (0.25, 0.25, 0.5))):
            handles.append(projection.register_forward_hook(scaled(factor)))
        handles.append(own.module(block).register_forward_hook(attended))
        stack.enter_context(own.score_terms(block, leaf))
    return handles


def _embedding_hooks(model: nn.Module, architecture: Architecture, run: LRPRun) -> list[Any]:
    """Hooks making the first output of the token embeddings the run's leaf (vision transformers,
    whose input embedding is their patch embedding: the embedded sequence, with its class tokens
    and patches as the tokens, the patches the patch embedding's output, a convolution's
    (B, D, h, w) flattened to (B, h w, D) as the embeddings flatten it)."""
    embedding = input_embeddings(model)
    if isinstance(embedding, nn.Embedding):

        def leaf(module: nn.Module, args: tuple, output: Tensor) -> Tensor | None:
            if run.embeddings is not None:
                return None
            run.embeddings = output.detach().requires_grad_()
            run.tokens = run.embeddings.detach()
            return run.embeddings

        return [embedding.register_forward_hook(leaf)]
    owner = next((m for m in model.modules() if any(c is embedding for c in m.children())), None)
    names = [name for name in architecture.class_tokens if isinstance(getattr(owner, name, None), Tensor)]
    patches: list[Tensor] = []

    def keep_patches(module: nn.Module, args: tuple, output: Tensor) -> None:
        patches.append(output.detach().flatten(2).transpose(1, 2) if output.dim() == 4 else output.detach())

    def sequence_leaf(module: nn.Module, args: tuple, output: Tensor) -> Tensor | None:
        if run.embeddings is not None:
            return None
        run.embeddings = output.detach().requires_grad_()
        batch = patches[0].shape[0]
        prefix = [getattr(module, name).detach().expand(batch, 1, -1) for name in names]
        run.tokens = torch.cat([*prefix, patches[0]], 1).to(output.dtype)
        if run.tokens.shape != output.shape:
            raise ValueError(
                f"the embedded sequence {tuple(output.shape)} is not the class tokens {names} and the "
                f"{patches[0].shape[1]} patches; AttnLRP reads each token's embedding from them."
            )
        return run.embeddings

    return [embedding.register_forward_hook(keep_patches), owner.register_forward_hook(sequence_leaf)]


def _share_hooks(model: nn.Module, architecture: Architecture, run: LRPRun, batch: int) -> list[Any]:
    """Hooks recording, for :meth:`LRPRun.shares`, the other embedding tables' outputs (as leaves,
    one row per example of the ``batch``; not the tables of score terms, whose share is booked
    where they enter the scores) and the output of every layer with a bias.

    Raises:
        ValueError: a layer with a bias other than a linear layer or a LayerNorm (whose bias is not
            simply added to its output), outside the token embeddings.
    """
    inside = {id(m) for m in input_embeddings(model).modules()}

    def other(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        leaf = output.detach().expand(batch, *output.shape[1:]).clone().requires_grad_()  # a row per example
        run.others.append(leaf)
        return leaf

    def biased(module: nn.Module, args: tuple, output: Tensor) -> None:
        if id(module) not in quantized:
            run.biased.append((output, module.bias.detach(), type(module).__name__))
            return
        # a quantized layer keeps its bias and what its kernel adds to x W^T (its rounding): its
        # gradient is W's alone, so that is held as the bias is
        weight, _ = linear_weight(module)
        run.biased.append((output, output.detach() - F.linear(args[0].detach(), weight.to(output.dtype)),
                           type(module).__name__))

    own = architecture.own_attention
    tables = {id(m) for m in own.score_tables(model)} if own is not None else set()
    outside = [module for module in model.modules() if id(module) not in inside | tables]
    quantized = {id(module) for module in outside if is_quantized(module)}
    with_bias = [m for m in outside if isinstance(getattr(m, "bias", None), Tensor) or id(m) in quantized]
    for module in with_bias:
        if not isinstance(module, (nn.Linear, Conv1D, nn.LayerNorm)):
            raise ValueError(
                f"AttnLRP's shares book the biases of linear layers and LayerNorms; the model's "
                f"{type(module).__name__} has a bias whose share is not its output's."
            )
    handles = [module.register_forward_hook(other) for module in outside if isinstance(module, nn.Embedding)]
    # a linear layer's own output (before a rule that scales its gradient, which the bias shares);
    # a LayerNorm's after its rule, whose output is the one in the graph
    handles += [module.register_forward_hook(biased, prepend=not isinstance(module, nn.LayerNorm)) for module in with_bias]
    return handles


def attnlrp_forward(
    forward_func: Callable[..., Any],
    inputs: Tensor,
    additional_forward_args: Any = None,
    attention_mask: Tensor | None = None,
    shares: bool = False,
    positions: Tensor | None = None,
) -> LRPRun:
    """Run ``forward_func`` once under AttnLRP's rules (see the module docstring).

    Called like :func:`~captum_attnflow.capture.internals.capture_internals`: a Hugging Face model as
    ``model(inputs, *additional_forward_args, attention_mask=attention_mask)``, a left-padded batch
    with each row's real tokens first (``LRPRun.order``); a module containing one as
    ``forward_func(inputs, *additional_forward_args)`` (plus ``attention_mask=`` where its forward
    takes it). Autograd is on for the pass also inside ``torch.no_grad()``; parameters' ``.grad``
    are never touched (:meth:`LRPRun.relevance` differentiates with respect to the leaf only).
    ``shares=True`` also records what :meth:`LRPRun.shares` needs. ``positions`` (B, S), the
    explained positions of the inputs if known: a language model then computes their logits
    alone (:attr:`LRPRun.kept`). The backward passes of the returned run keep every layer's
    activations; :func:`attnlrp_run` keeps only each layer's input.

    Raises:
        TypeError: ``forward_func`` holds no Hugging Face model.
        ValueError: a model type outside the architecture table, a model whose config the rules
            do not cover there, or a model that ran no attention.
    """
    with attnlrp_run(forward_func, inputs, additional_forward_args, attention_mask, shares, positions) as run:
        return run


@contextlib.contextmanager
def attnlrp_run(
    forward_func: Callable[..., Any],
    inputs: Tensor,
    additional_forward_args: Any = None,
    attention_mask: Tensor | None = None,
    shares: bool = False,
    positions: Tensor | None = None,
    recompute: bool = False,
) -> Iterator[LRPRun]:
    """Context manager: :func:`attnlrp_forward`'s run, the rules kept on the model for the block
    (whose backward passes, :meth:`LRPRun.relevance`, run inside it), the model restored on exit.

    ``recompute=True``: each transformer block keeps only its input, and each backward pass runs
    the blocks again one at a time under the same rules
    (:func:`~captum_attnflow.capture.recompute.layerwise_recomputation`): the same relevance,
    with one block's activations alive at a time, for one more forward pass per backward pass.
    """
    module = owning_module(forward_func)
    model = main_model(forward_func)
    if module is None or model is None:
        raise TypeError(
            f"forward_func must be a Hugging Face model or a module containing one, got {type(forward_func).__name__}; "
            "AttnLRP modifies the backward pass of the model's own layers."
        )
    architecture, blocks = architecture_of(forward_func, "AttnLRP")
    if architecture.cross_attention is not None and getattr(model.config, "is_encoder_decoder", False):
        raise TypeError(
            "AttnLRP explains an encoder-decoder's decoder positions over the source and the target prefix: use "
            "AttnLRP(model).encoder_decoder_rows(input_ids, decoder_input_ids, target, ...) or LLMAttentionAttribution."
        )
    refused = architecture.lrp_refused(model.config) if architecture.lrp_refused is not None else None
    if refused is not None:
        raise ValueError(
            f"AttnLRP's rules do not cover this {model.config.model_type!r} model: {refused}. Use a method of the "
            "registry without rules."
        )
    check_device(module, inputs)
    args = as_tuple(additional_forward_args)
    run = LRPRun()
    kwargs: dict[str, Any] = {}
    if isinstance(forward_func, PreTrainedModel):
        check_mask_not_in_args(forward_func, args, attention_mask)
        if attention_mask is not None:
            attention_mask = torch.as_tensor(attention_mask).to(inputs.device)
        inputs, args, kwargs, run.order = real_tokens_first_call(inputs, args, attention_mask)
    else:
        kwargs = mask_keyword(forward_func, args, attention_mask)
    run.kept = kept_logits(forward_func, None if positions is None else run.run_positions(positions))
    if run.kept is not None:
        kwargs["logits_to_keep"] = run.kept
    if architecture.own_attention is not None:  # its attention reads the additive masks eager attention gets
        attention = eager_attention(module)
    else:
        register_attention(_NAME, _attnlrp_attention, sdpa_mask)  # the masks sdpa gets: bool, or None to skip
        attention = implementation(module, _NAME)
    recomputed = layerwise_recomputation(blocks) if recompute else contextlib.nullcontext()
    with unchanged(module), attention as entered, _rules(model, architecture, blocks, run), recomputed:
        # Read under the model's lock: the implementation the attention rules delegate to.
        run.attention = ALL_ATTENTION_FUNCTIONS.get(entered(model), sdpa_attention_forward)
        handles = _share_hooks(model, architecture, run, inputs.shape[0]) if shares else []
        try:  # the quantized layers' gradient installed last, so that it runs before the other hooks,
            # and kept for the backward passes, which may run the blocks again
            with dequantized_gradients(model):
                with torch.enable_grad():
                    run.output = forward_func(inputs, *args, **kwargs)
                run.kept = kept_in(run.output, run.kept)
                if not run.attended or run.embeddings is None:
                    raise ValueError(
                        f"{type(model).__name__} ran no attention through transformers' attention-function interface "
                        "or never called its input embeddings; AttnLRP needs both (BERT, GPT-2, Llama, ViT, ... in "
                        "transformers 5)."
                    )
                yield run
        finally:
            for handle in handles:
                handle.remove()
