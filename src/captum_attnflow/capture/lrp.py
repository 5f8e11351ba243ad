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
  probabilities;
* forward hooks on the norms: LayerNorm and RMSNorm by the identity rule on their division,
  :math:`1/\\sigma` held constant (LayerNorm's centring and both affine parts keep their gradient);
* forward hooks on element-wise activations (GELU, SiLU, tanh, ...): the identity rule,
  gradient :math:`f(x)/x`; and on the two factors of a gated feed-forward (the architecture
  table's ``gated_unit``), gradient scaled by 1/2: the uniform rule on :math:`\\mathrm{act}(g) \\odot u`
  (a mixture's experts, whose product no hook reaches: the identity rule on the activation and
  the experts' output gradient scaled by 1/2, the same rule since only linear maps follow the
  product there).

The relevance of token j is :math:`\\sum_d e_{jd} \\tilde\\nabla_{e_{jd}} y_t`, e the token
embeddings (the input embedding layer's output; for a vision transformer the patch embeddings
and its learned class tokens; for an encoder-decoder two leaves, the encoder's and the decoder's
token embeddings, its cross-attention under the same rule as self-attention,
:func:`seq2seq_attnlrp_forward`). The model is left as it was (attention implementation, mode,
hooks), also when the call raises.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.pytorch_utils import Conv1D

from captum_attnflow.capture.lean import scale_and_causality
from captum_attnflow.capture.lean_blocks import attends_causally
from captum_attnflow.capture.lrp_rules import _function_activation_hooks, _GradientScale, _rule_hooks
from captum_attnflow.capture.maps import in_run_order, real_tokens_first_call
from captum_attnflow.capture.seq2seq import _check_encoder_decoder
from captum_attnflow.hf.architectures import Architecture, architecture_of
from captum_attnflow.hf.inputs import as_tuple, check_mask_not_in_args, mask_keyword
from captum_attnflow.hf.models import check_device, main_model, owning_module
from captum_attnflow.hf.scores import input_embeddings, kept_in, kept_logits, logit_rows
from captum_attnflow.hf.state import implementation, register_attention, relevance_rules, unchanged

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
        biased: ``(output (B, ..., D_out), bias (D_out,))`` of every call of a layer with a bias
            (linear layers, LayerNorms), the output whose gradient is the bias's; recorded only
            for :meth:`shares`.
        kept: the run's positions whose logits a language model computed (its
            ``logits_to_keep``, :func:`~captum_attnflow.hf.scores.kept_logits`), or None for all.
        decoder_embeddings, decoder_tokens: (B, m, D) an encoder-decoder's second leaf, the
            decoder's token embeddings, and those embeddings detached; None for a model of one stack.
    """

    output: Any = None
    embeddings: Tensor | None = None
    tokens: Tensor | None = None
    order: Tensor | None = None
    causal: bool = False
    attended: bool = False
    attention: Callable[..., tuple[Tensor, Any]] = sdpa_attention_forward
    others: list[Tensor] = field(default_factory=list)
    biased: list[tuple[Tensor, Tensor]] = field(default_factory=list)
    kept: Tensor | None = None
    decoder_embeddings: Tensor | None = None
    decoder_tokens: Tensor | None = None

    def run_positions(self, positions: Tensor) -> Tensor:
        """(B, S) positions of the inputs, as positions in the run."""
        return positions if self.order is None else in_run_order(positions, self.order)

    def logit_rows(self, positions: Tensor) -> Tensor:
        """(B, S) the rows of the output's logits holding the inputs' ``positions`` (B, S)."""
        return logit_rows(self.kept, self.run_positions(positions))

    def relevance(self, score: Tensor, retain_graph: bool = False) -> Tensor:
        """(B, n) relevance of every token for ``score`` (B,) (selected from ``output`` with autograd
        on), one backward pass, in the inputs' order; an encoder-decoder's (B, n_s + m), the
        source tokens, then the decoder's inputs."""
        if self.decoder_embeddings is not None:
            leaves, tokens = (self.embeddings, self.decoder_embeddings), (self.tokens, self.decoder_tokens)
            gradients = torch.autograd.grad(score.sum(), leaves, retain_graph=retain_graph, allow_unused=True)
            return torch.cat([(t * g).sum(-1) if g is not None else t.new_zeros(t.shape[:2])
                              for t, g in zip(tokens, gradients)], -1)
        (gradient,) = torch.autograd.grad(score.sum(), self.embeddings, retain_graph=retain_graph)
        relevance = (self.tokens * gradient).sum(-1)
        return relevance if self.order is None else relevance.gather(1, self.order.argsort(-1))

    def shares(self, score: Tensor, retain_graph: bool = False) -> dict[str, Tensor]:
        """Where the relevance of ``score`` (B,) ends, one backward pass (a run made with
        ``shares=True``): each (B,) tensor of

        * ``"tokens"``: :math:`\\sum_j R_j`, the token embeddings' relevance;
        * ``"other_embeddings"``: the position and token-type embeddings' (the other embedding
          tables, a vision transformer's position embeddings);
        * ``"biases"``: :math:`\\sum b \\cdot \\tilde\\nabla_b\\, y`, what the biases of the linear
          layers and LayerNorms keep (the ε-rule at ε = 0 gives a bias its share of the output);
        * ``"softmax"``: the rest of the score, what the softmax linearisation loses (every other
          rule conserves).
        """
        biased = [output for output, _ in self.biased if output.requires_grad]
        leaves = [self.embeddings, *self.others, *biased]
        gradients = torch.autograd.grad(score.sum(), leaves, retain_graph=retain_graph, allow_unused=True)

        def kept(value: Tensor, gradient: Tensor | None) -> Tensor:
            if gradient is None:
                return score.new_zeros(score.shape)
            return (value * gradient).reshape(score.shape[0], -1).sum(1).to(score.dtype)  # rows flattened batch first

        tokens = kept(self.tokens, gradients[0])
        others = kept(self.embeddings.detach() - self.tokens, gradients[0])  # a vision transformer's positions
        others = others + sum((kept(o.detach(), g) for o, g in zip(self.others, gradients[1:])), score.new_zeros(score.shape))
        biases = [bias for output, bias in self.biased if output.requires_grad]
        kept_by_biases = sum((kept(b, g) for b, g in zip(biases, gradients[1 + len(self.others) :])),
                             score.new_zeros(score.shape))
        score = score.detach()
        return {"tokens": tokens, "other_embeddings": others, "biases": kept_by_biases,
                "softmax": score - tokens - others - kept_by_biases}


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
    return run.attention(module, query, key, value, attention_mask, **kwargs)[0], None


@contextlib.contextmanager
def _rules(model: nn.Module, architecture: Architecture, blocks: list[nn.Module], run: LRPRun) -> Iterator[None]:
    """Install the rules and the embedding leaf on ``model`` for the block; removed on exit."""
    handles = [module.register_forward_hook(hook) for module, hook in _rule_hooks(model, architecture, blocks)]
    handles += _embedding_hooks(model, architecture, run)
    handles += _function_activation_hooks(model, architecture)
    token = _CURRENT.set(run)
    try:
        with relevance_rules():
            yield
    finally:
        _CURRENT.reset(token)
        for handle in handles:
            handle.remove()


def _embedding_hooks(model: nn.Module, architecture: Architecture, run: LRPRun) -> list[Any]:
    """Hooks making the first output of the token embeddings the run's leaf (vision transformers:
    the embedded sequence, with its class tokens and patches as the tokens)."""
    if architecture.cross_attention is not None and getattr(model.config, "is_encoder_decoder", False):
        return _seq2seq_embedding_hooks(model, run)
    embedding = input_embeddings(model)
    if not architecture.class_tokens:

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
        patches.append(output.detach())

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


def _seq2seq_embedding_hooks(model: nn.Module, run: LRPRun) -> list[Any]:
    """Hooks making an encoder-decoder's token embeddings the run's two leaves: the first call
    (the encoder runs first) ``run.embeddings``, the second ``run.decoder_embeddings`` (one
    module or two: the tables are often shared)."""

    def leaf(module: nn.Module, args: tuple, output: Tensor) -> Tensor | None:
        if run.decoder_embeddings is not None:
            return None
        embeddings = output.detach().requires_grad_()
        if run.embeddings is None:
            run.embeddings, run.tokens = embeddings, embeddings.detach()
        else:
            run.decoder_embeddings, run.decoder_tokens = embeddings, embeddings.detach()
        return embeddings

    tables = [model.get_encoder().get_input_embeddings(), model.get_decoder().get_input_embeddings()]
    return [table.register_forward_hook(leaf) for table in dict.fromkeys(tables)]


def _share_hooks(model: nn.Module, run: LRPRun, batch: int) -> list[Any]:
    """Hooks recording, for :meth:`LRPRun.shares`, the other embedding tables' outputs (as leaves,
    one row per example of the ``batch``) and the output of every layer with a bias.

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
        if output.shape[0] % batch:
            raise ValueError(
                f"AttnLRP's shares need each layer's output with the batch first (or batch and tokens flattened, "
                f"batch first); {type(module).__name__} returned {tuple(output.shape)} for a batch of {batch}."
            )
        run.biased.append((output, module.bias.detach()))

    outside = [module for module in model.modules() if id(module) not in inside]
    with_bias = [module for module in outside if isinstance(getattr(module, "bias", None), Tensor)]
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
    alone (:attr:`LRPRun.kept`).

    Raises:
        TypeError: ``forward_func`` holds no Hugging Face model.
        ValueError: a model type outside the architecture table or whose rules are incomplete there,
            or a model that ran no attention through transformers' interface.
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
    if not architecture.lrp:
        raise ValueError(
            f"AttnLRP's rules do not cover the {model.config.model_type!r} models: a nonlinearity is a plain "
            "function call no hook reaches, or the token embeddings are not a module's output (the row of "
            "captum_attnflow.hf.architectures says which). Use a method of the registry without rules."
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
    run.attention = ALL_ATTENTION_FUNCTIONS.get(model.config._attn_implementation, sdpa_attention_forward)
    register_attention(_NAME, _attnlrp_attention, sdpa_mask)  # the masks sdpa gets: bool, or None to skip
    with unchanged(module), _rules(model, architecture, blocks, run), implementation(module, _NAME):
        handles = _share_hooks(model, run, inputs.shape[0]) if shares else []
        try:
            with torch.enable_grad():
                run.output = forward_func(inputs, *args, **kwargs)
            run.kept = kept_in(run.output, run.kept)
        finally:
            for handle in handles:
                handle.remove()
    if not run.attended or run.embeddings is None:
        raise ValueError(
            f"{type(model).__name__} ran no attention through transformers' attention-function interface or never "
            "called its input embeddings; AttnLRP needs both (BERT, GPT-2, Llama, ViT, ... in transformers 5)."
        )
    return run


def seq2seq_attnlrp_forward(
    model: nn.Module,
    input_ids: Tensor,
    decoder_input_ids: Tensor,
    attention_mask: Tensor | None = None,
    decoder_attention_mask: Tensor | None = None,
) -> LRPRun:
    """Run an encoder-decoder once under AttnLRP's rules, its encoder's and its decoder's token
    embeddings the run's two leaves (:meth:`LRPRun.relevance` gives (B, n_s + m)): the
    cross-attention's :math:`q k^\\top` and :math:`A v` get the uniform rule as the
    self-attention's, so relevance flows from a decoder position to the source tokens through the
    encoder's outputs and to the target prefix through the decoder's self-attention and residual.

    Args:
        model: a Hugging Face encoder-decoder of the architecture table (BART, Marian, mBART,
            M2M-100, T5).
        input_ids: (B, n_s) source ids; ``attention_mask`` (B, n_s) their padding.
        decoder_input_ids: (B, m) the decoder's inputs; ``decoder_attention_mask`` (B, m) their padding.

    Raises:
        ValueError: not an encoder-decoder of the architecture table, or one that ran no attention
            through transformers' interface.
    """
    _check_encoder_decoder(model)
    architecture, blocks = architecture_of(model, "AttnLRP")
    if architecture.cross_attention is None or not architecture.lrp:
        raise ValueError(f"AttnLRP has no encoder-decoder rules for the {model.config.model_type!r} models.")
    check_device(model, input_ids)
    run = LRPRun()
    run.attention = ALL_ATTENTION_FUNCTIONS.get(model.config._attn_implementation, sdpa_attention_forward)
    register_attention(_NAME, _attnlrp_attention, sdpa_mask)  # the masks sdpa gets: bool, or None to skip
    with unchanged(model), _rules(model, architecture, blocks, run), implementation(model, _NAME):
        with torch.enable_grad():
            run.output = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                               decoder_attention_mask=decoder_attention_mask, use_cache=False)
    if not run.attended or run.decoder_embeddings is None:
        raise ValueError(
            f"{type(model).__name__} ran no attention through transformers' attention-function interface or never "
            "called its decoder's input embeddings; AttnLRP needs both."
        )
    return run
