"""Gradient-weighted attention maps in the memory of one backward pass.

The gradient-weighted methods need, per attention layer, :math:`(A \\odot \\partial y / \\partial A)^+`
averaged over heads. Asking autograd for :math:`\\partial y / \\partial A` means running eager
attention and keeping every layer's (B, H, n, n) probabilities and their gradients: 2·L·H·n²
numbers, 68 GB at Llama-8B geometry and n = 4096 in bfloat16. Here the model instead runs with
the attention implementation it was loaded with (``sdpa``) through a function registered with
transformers' attention-function interface, which keeps what that step has anyway: its queries,
keys and values (after rotary embeddings) and its output. Per explained score,

1. one backward pass gives :math:`\\nabla O_l`, the gradient of the score with respect to each
   layer's attention output (B, n, H, d): no parameter gradient is computed;
2. the output is :math:`O_h = A_h V_h`, so :math:`\\partial y / \\partial A_h = \\nabla O_h V_h^\\top`,
   and :math:`A_h = \\operatorname{softmax}(q_h k_h^\\top s + M)` is recomputed with the layer's
   own mask and scaling; both in blocks of rows, fused over heads per block
   (:func:`~captum_attnflow.capture.lean_blocks.fused_blocks`), so no layer's (H, n, n) tensor is ever whole.

It applies to the model types whose attention scores are exactly :math:`q k^\\top s + M`
(:data:`GRADIENT_MODEL_TYPES`); others run eager attention and keep their probabilities
(:func:`~captum_attnflow.capture.internals.capture_internals`).
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import Tensor, nn
from transformers.masking_utils import sdpa_mask

from captum_attnflow.capture.internals import prepared_call
from captum_attnflow.capture.lean import LEAN_MODEL_TYPES, captured_scores, own_attention
from captum_attnflow.capture.lean_blocks import AttentionScores, _scratch_size, fused_blocks, row_product
from captum_attnflow.capture.maps import in_run_order
from captum_attnflow.capture.quantized import dequantized_gradients
from captum_attnflow.capture.recompute import layerwise_recomputation, recomputed_blocks, recomputing
from captum_attnflow.hf.models import hf_models
from captum_attnflow.hf.scores import kept_in, kept_logits, logit_rows
from captum_attnflow.hf.state import implementation, register_attention, unchanged, uses_substituted_attention

# Model types whose attention scores are q k^T s plus the mask transformers builds (tested
# against the eager probabilities): those of the lean rollout, and the encoder-decoders whose
# decoder and cross-attention follow the same form.
GRADIENT_MODEL_TYPES = LEAN_MODEL_TYPES | {"bart", "mbart", "marian", "captum_attnflow_tagger"}

_NAME = "captum_attnflow_gradients"
_CAPTURES: "weakref.WeakKeyDictionary[nn.Module, AttentionGradients]" = weakref.WeakKeyDictionary()


def supports_attention_gradients(model: nn.Module) -> bool:
    """Whether :func:`capture_attention_gradients` applies: every Hugging Face model inside
    ``model`` is of a type in :data:`GRADIENT_MODEL_TYPES` and computes its own attention."""
    models = hf_models(model)
    return (
        bool(models)
        and all(getattr(m.config, "model_type", None) in GRADIENT_MODEL_TYPES for m in models)
        and not uses_substituted_attention(model)
    )


@dataclass
class AttentionCall:
    """What one attention call kept: what its scores are made of (queries (B, H, n_q, d), keys,
    mask, scaling: :class:`~captum_attnflow.capture.lean_blocks.AttentionScores`), its values (B, H_kv, n_k, d)
    (detached: the tensors the call was given), its output (B, n_q, H, d) in the autograd graph,
    and its module.

    In a run that recomputes its layers (:func:`attention_gradients_run` with ``recompute=True``)
    the forward keeps none of these tensors: the queries, keys and values are empty tensors of
    their shapes on the ``meta`` device (the mask is the model's, kept anyway), the output is
    None, and :meth:`AttentionGradients.backward` gives each call's recomputed tensors for the
    moment its layer's backward pass needs them."""

    scores: AttentionScores
    value: Tensor
    output: Tensor | None
    module: nn.Module


# visit(index, call, grad_output): an attention call reached by a backward pass, with the gradient
# (B, H, n_q, d) of the score with respect to its output, None where the score does not depend on it.
Visit = Callable[[int, AttentionCall, "Tensor | None"], None]


@dataclass
class AttentionGradients:
    """One forward pass of a model, with each attention call's :class:`AttentionCall`.

    Attributes:
        calls: per attention call, in call order.
        output: what the model returned (in the autograd graph).
        refused: whether some call carried a score term its :class:`AttentionScores` cannot hold
            (:func:`~captum_attnflow.capture.lean.captured_scores`); that call is not in ``calls``, and
            the stored path must explain the model.
        order: (B, n) the run's token order when a left-padded batch ran with its real tokens
            first (``order[b, k]`` = original position of the k-th token of the run), else None.
        mask: (B, n) the run's attention mask in run order, or None.
        device: where :meth:`weighted_blocks` and :meth:`weighted_layer` deliver their maps (the
            inputs' device), each computed on the device its call ran on (layers of a model
            dispatched over several devices); None: that device.
        kept: the run's positions whose logits a language model computed (sorted, 1-D: its
            ``logits_to_keep``), or None for all; :meth:`logit_rows` finds a position's row.
        recompute: whether the run recomputes its layers in each backward pass (its calls keep no tensors).
    """

    calls: list[AttentionCall] = field(default_factory=list)
    output: Any = None
    order: Tensor | None = None
    mask: Tensor | None = None
    device: torch.device | None = None
    refused: bool = False
    kept: Tensor | None = None
    recompute: bool = False
    _scratch: Tensor | None = None
    # A recomputing run: the first call's output (where each backward pass ends), each module's
    # last recomputed scores and values, and the backward pass under way (its visit, the next call).
    _first_output: Tensor | None = None
    _recomputed: dict[nn.Module, tuple[AttentionScores, Tensor]] = field(default_factory=dict)
    _visiting: tuple[Visit, list[int]] | None = None

    def logit_rows(self, positions: Tensor) -> Tensor:
        """The rows of the output's logits (B, S) that hold the run's ``positions`` (B, S)."""
        return logit_rows(self.kept, positions)

    def output_gradients(self, score: Tensor, calls: Iterable[int], retain_graph: bool = True) -> dict[int, Tensor]:
        """:math:`\\nabla O_l`: the gradient of ``score`` (a scalar, e.g. a sum of per-example
        scores) with respect to the output of each call in ``calls``, ``{index: (B, H, n_q, d)}``;
        zeros for a call the score does not depend on. One backward pass, which computes no
        parameter's gradient and touches no ``.grad`` (a run that keeps its calls' tensors)."""
        indices = list(calls)
        outputs = [self.calls[i].output for i in indices]
        gradients = torch.autograd.grad(score, outputs, retain_graph=retain_graph, allow_unused=True)
        return {
            i: (torch.zeros_like(o) if g is None else g).transpose(1, 2)
            for i, o, g in zip(indices, outputs, gradients)
        }

    def backward(self, score: Tensor, visit: Visit, retain_graph: bool = True) -> None:
        """One backward pass of ``score`` (a scalar) to the first call's output, calling
        ``visit(index, call, grad_output)`` for every call, the last first: ``call`` with its
        queries, keys and values, ``grad_output`` (B, H, n_q, d) the gradient of the score with
        respect to its output (None where the score does not depend on it). No parameter's
        gradient is computed and no ``.grad`` touched.

        A run that keeps its calls' tensors visits them after the backward pass; a recomputing
        run during it, as each layer is recomputed: the call's tensors exist only for its visit.
        """
        if not self.recompute:
            gradients = torch.autograd.grad(
                score, [c.output for c in self.calls], retain_graph=retain_graph, allow_unused=True
            )
            for index in reversed(range(len(self.calls))):
                gradient = gradients[index]
                visit(index, self.calls[index], None if gradient is None else gradient.transpose(1, 2))
            return
        self._visiting = (visit, [len(self.calls) - 1])
        try:
            torch.autograd.grad(score, self._first_output, retain_graph=retain_graph, allow_unused=True)
            self._visit_down_to(-1)
        finally:
            self._visiting = None
            self._recomputed.clear()

    def _arrived(self, index: int, gradient: Tensor) -> None:
        """A recomputing run's backward pass reached call ``index``'s output with ``gradient`` (B, n_q, H, d)."""
        if self._visiting is None:  # a backward pass not made by backward()
            return
        self._visit_down_to(index)
        visit, following = self._visiting
        call = self.calls[index]
        if call.module not in self._recomputed:
            raise RuntimeError(
                f"the backward pass reached attention call {index} before recomputing its layer: its block "
                "is not one the architecture table lists, or the model calls its attention outside its blocks."
            )
        scores, value = self._recomputed.pop(call.module)
        visit(index, AttentionCall(scores, value, None, call.module), gradient.transpose(1, 2))
        following[0] = index - 1

    def _visit_down_to(self, index: int) -> None:
        """Visit the calls above ``index`` that the backward pass did not reach (no gradient)."""
        visit, following = self._visiting
        for skipped in range(following[0], index, -1):
            visit(skipped, self.calls[skipped], None)
        following[0] = min(following[0], index)

    @property
    def causal(self) -> bool:
        """Whether every call attended causally: no query may see a later key."""
        return all(c.scores.attends_causally for c in self.calls)

    def weighted_blocks(self, call: AttentionCall, grad_output: Tensor, rows: int | None = None) -> Iterator[tuple[int, int, Tensor]]:
        """:math:`\\bar A = \\mathbb{E}_h[(A_h \\odot \\nabla O_h V_h^\\top)^+]` of ``call``
        by blocks of query rows, ``(start, stop, block)`` with ``block`` (B, stop - start, w)
        over the first w keys (the later ones 0), valid until the next block; the first ``rows``
        rows at least (all if None)."""
        device = call.scores.query.device
        size = _scratch_size(call.scores)
        if self._scratch is None or self._scratch.numel() < size or self._scratch.device != device:
            self._scratch = torch.empty(size, dtype=torch.float32, device=device)
        blocks = fused_blocks(
            call.scores, "mean", self._scratch, gradient=(grad_output.to(device), call.value), rows=rows
        )
        if self.device is None or self.device == device:
            return blocks
        return ((start, stop, block.to(self.device)) for start, stop, block in blocks)

    def weighted_product(self, call: AttentionCall, grad_output: Tensor, rows: int) -> Callable[[Tensor], Tensor] | None:
        """:math:`\\bar A` of ``call``, its first ``rows`` rows, as a function of row
        vectors (B, c, rows) -> (B, c, n_k) (:func:`~captum_attnflow.capture.lean_blocks.row_product`: never
        written out); None where the kernels do not run (then :meth:`weighted_blocks` serves)."""
        device = call.scores.query.device
        product = row_product(call.scores, rows, gradient=(grad_output.to(device), call.value))
        if product is None or self.device is None or self.device == device:
            return product
        return lambda vectors: product(vectors.to(device)).to(self.device)

    def weighted_layer(self, call: AttentionCall, grad_output: Tensor) -> Tensor:
        """:math:`\\bar A` of ``call`` whole: (B, n_q, n_k) float32."""
        query, key = call.scores.query, call.scores.key
        out = torch.zeros(query.shape[0], query.shape[2], key.shape[2], device=query.device)
        for start, stop, block in self.weighted_blocks(call, grad_output):
            out[:, start:stop, : block.shape[-1]] = block.to(out.device)
        return out if self.device is None else out.to(self.device)


class _GradientTap(torch.autograd.Function):
    """``x`` itself; its gradient handed to ``arrived`` on its way down."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, arrived: Callable[[Tensor], None]) -> Tensor:
        ctx.arrived = arrived
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, gradient: Tensor) -> tuple[Tensor, None]:
        ctx.arrived(gradient)
        return gradient, None


def _gradient_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    capture, saved = _CAPTURES[module]
    if not query.requires_grad:
        # Frozen parameters: the graph from the attention to the output must still exist.
        query = query.detach().requires_grad_()
    function = own_attention(saved, module, kwargs)
    output = function(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)[0]
    scores = captured_scores(module, query, key, attention_mask, scaling, kwargs)
    if recomputing():  # the backward pass runs the layer again: its tensors, for its visit only
        if scores is not None:
            capture._recomputed[module] = (scores, value.detach())
        return output, None
    if scores is None:
        capture.refused = True
    elif capture.recompute:
        meta = {"device": "meta", "dtype": query.dtype}
        shapes = replace(scores, query=torch.empty(query.shape, **meta), key=torch.empty(key.shape, **meta))
        capture.calls.append(AttentionCall(shapes, torch.empty(value.shape, **meta), None, module))
        if capture._first_output is None:
            capture._first_output = output
        output = _GradientTap.apply(output, functools.partial(capture._arrived, len(capture.calls) - 1))
    else:
        capture.calls.append(AttentionCall(scores, value.detach(), output, module))
    return output, None


def capture_attention_gradients(
    forward_func: Callable[..., Any],
    inputs: Tensor,
    additional_forward_args: Any = None,
    attention_mask: Tensor | None = None,
    positions: Tensor | None = None,
) -> AttentionGradients:
    """Run ``forward_func`` once with autograd on, keeping each attention call's queries, keys,
    values, mask and output (:class:`AttentionGradients`).

    ``positions`` (B, S), the explained positions of the inputs if known: a Hugging Face language
    model then computes the logits of those positions alone (its ``logits_to_keep``, the rows
    :meth:`AttentionGradients.logit_rows` finds), not a (B, n, V) tensor and its gradient: at
    Llama-3's vocabulary and n = 16384, 8 GB and two products with the output embedding.

    Called as :func:`~captum_attnflow.capture.internals.capture_internals` calls it (a left-padded
    batch of a Hugging Face model runs with its real tokens first). Each attention layer
    computes its output with the model's own implementation (``sdpa`` as loaded; eager models
    with sdpa, equal up to rounding), so the forward costs what the model's forward costs and
    keeps only what its backward keeps anyway. The model is left as it was (attention
    implementation, mode, hooks), also when the call raises; calls on one model from several
    threads run one at a time. The backward passes keep every layer's activations;
    :func:`attention_gradients_run` keeps only each layer's input.
    """
    with attention_gradients_run(forward_func, inputs, additional_forward_args, attention_mask, positions) as capture:
        return capture


@contextlib.contextmanager
def attention_gradients_run(
    forward_func: Callable[..., Any],
    inputs: Tensor,
    additional_forward_args: Any = None,
    attention_mask: Tensor | None = None,
    positions: Tensor | None = None,
    recompute: bool = False,
) -> Iterator[AttentionGradients]:
    """Context manager: :func:`capture_attention_gradients`'s run, its attention function kept on
    the model for the block (whose backward passes, :meth:`AttentionGradients.backward`, run
    inside it), the model restored on exit.

    ``recompute=True``: each transformer block keeps only its input, and each backward pass runs
    the blocks again one at a time (:func:`~captum_attnflow.capture.recompute.layerwise_recomputation`);
    the calls keep no tensors, and :meth:`AttentionGradients.backward` visits each with its layer's
    recomputed queries, keys and values: one layer's activations alive at a time, for one more
    forward pass per backward pass.
    """
    module, call, order, mask = prepared_call(forward_func, inputs, additional_forward_args, attention_mask)
    run_positions = positions if positions is None or order is None else in_run_order(positions, order)
    kept = kept_logits(forward_func, run_positions)
    capture = AttentionGradients(order=order, mask=mask, device=inputs.device, recompute=recompute)
    register_attention(_NAME, _gradient_attention, sdpa_mask)  # the masks sdpa gets: bool, or None to skip
    recomputed = layerwise_recomputation(recomputed_blocks(forward_func)) if recompute else contextlib.nullcontext()
    # the quantized layers' gradients kept for the backward passes, which may run the blocks again
    with unchanged(module), implementation(module, _NAME) as own, recomputed, dequantized_gradients(module):
        for model in hf_models(module):  # parents first: an inner model's own implementation wins
            for submodule in model.modules():
                _CAPTURES[submodule] = (capture, own(model))
        try:
            with torch.enable_grad():
                capture.output = call() if kept is None else call(logits_to_keep=kept)
            capture.kept = kept_in(capture.output, kept)
            if not capture.calls and not capture.refused:
                raise ValueError(
                    f"{type(module).__name__} ran no attention through transformers' attention-function interface; "
                    "this method needs a model that does (BERT, GPT-2, Llama, ViT, BART, ... in transformers 5)."
                )
            yield capture
        finally:
            for submodule in list(module.modules()):
                _CAPTURES.pop(submodule, None)
