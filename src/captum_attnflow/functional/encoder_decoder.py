"""Raw attention, rollout and flow of an encoder-decoder (T5, BART, ...) over one joint graph.

The paper's residual rule (Abnar & Zuidema 2020, section 3), :math:`A = \\alpha W + (1 - \\alpha) I`,
generalised to the two attention sub-layers of a decoder layer. The encoder is rolled out as
for an encoder alone, :math:`R_{enc} = A^{enc}_{L_e} \\cdots A^{enc}_1` (n_s x n_s). In decoder
layer :math:`l`

* the self-attention sub-layer mixes target positions, :math:`A_l = \\operatorname{renorm}(\\alpha W^{self}_l + (1 - \\alpha) I)`;
* the cross-attention sub-layer keeps :math:`1 - \\alpha` on the node itself and sends
  :math:`\\alpha W^{cross}_l[t, :]` to the encoder's output nodes, which carry :math:`R_{enc}`.

So the attribution of decoder position :math:`t` is a vector over the source tokens U and the
target input tokens T (the decoder's inputs: the start token and the tokens written so far).
With :math:`T_0 = I` (m x m), :math:`U_0 = 0` (m x n_s) and, per layer,

.. math::

    T' = A_l T_{l-1}, \\quad U' = A_l U_{l-1}, \\qquad
    T_l = (1 - \\alpha) T', \\quad U_l = (1 - \\alpha) U' + \\alpha W^{cross}_l R_{enc},

the rows of :math:`[U_l \\; T_l]` sum to 1. Raw attention is one decoder layer's edges alone,
:math:`T = (1 - \\alpha) A_l`, :math:`U = \\alpha W^{cross}_l` (encoder outputs taken as the
source tokens; with the default :math:`\\alpha = 1` the plain cross-attention). Attention flow
is the maximum flow over the same joint graph: from a decoder node after layer :math:`l` to
each source token (encoder layer 0) and each target input token (decoder layer 0), edges of
the capacities above.

Chefer et al. (ICCV 2021, "Generic attention-model explainability for interpreting bi-modal
and encoder-decoder transformers") propagate relevance through the same three kinds of
attention, with gradient-weighted maps instead of the raw ones.

Every function returns the scores over the source tokens first, then the target input tokens:
``[..., :n_s]`` is U, ``[..., n_s:]`` is T.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from captum_attnflow.functional.checks import (
    Attentions,
    as_mask,
    attention_layers,
    check_attention_values,
    check_residual_alpha,
    layer_indices,
)
from captum_attnflow.functional.flow import _PROGRESS_WORK
from captum_attnflow.functional.mixing import add_residual, fuse_heads
from captum_attnflow.functional.rollout import rollout

# Capacity of the pass-through edges that carry a node's flow down to where the layered kernel
# wants it; any value above the largest flow (1, a row of attention) leaves the cuts unchanged.
_CARRY = 2.0


def encoder_decoder_rollout(
    encoder_attentions: Attentions,
    decoder_attentions: Attentions,
    cross_attentions: Sequence[Tensor] | Tensor,
    layer: int | None = -1,
    residual_alpha: float = 0.5,
    head_fusion: str = "mean",
    attention_mask: Tensor | None = None,
    decoder_attention_mask: Tensor | None = None,
) -> Tensor:
    """Joint-graph rollout of every decoder position onto the source and target input tokens.

    Args:
        encoder_attentions: L_e tensors (B, H, n_s, n_s), the encoder's self-attentions.
        decoder_attentions: L_d tensors (B, H, m, m), the decoder's (causal) self-attentions.
        cross_attentions: L_d tensors (B, H, m, n_s), decoder queries over encoder keys.
        layer: the decoder layer, 1..L_d (or negative from the top); None for all.
        residual_alpha: :math:`\\alpha`, 0.5 as in the paper.
        head_fusion: ``"mean"``, ``"max"`` or ``"min"`` over heads.
        attention_mask: (B, n_s), 1 on real source tokens; padding gets 0.
        decoder_attention_mask: (B, m), 1 on real decoder positions; padding gets 0.

    Returns:
        float32 (B, m, n_s + m) for one layer, (L_d, B, m, n_s + m) for ``layer=None``: row
        ``t`` is decoder position ``t``, the first n_s columns the source tokens (U), the
        others the target input tokens (T). Rows of real positions sum to 1.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional.encoder_decoder import encoder_decoder_rollout
        >>> enc = torch.softmax(torch.randn(2, 1, 4, 5, 5), -1)        # (L_e, B, H, n_s, n_s)
        >>> dec = torch.softmax(torch.randn(3, 1, 4, 3, 3), -1).tril()  # (L_d, B, H, m, m), causal
        >>> dec = dec / dec.sum(-1, keepdim=True)
        >>> cross = torch.softmax(torch.randn(3, 1, 4, 3, 5), -1)      # (L_d, B, H, m, n_s)
        >>> scores = encoder_decoder_rollout(enc, dec, cross)
        >>> scores.shape, bool(torch.allclose(scores.sum(-1), torch.ones(1, 3)))
        (torch.Size([1, 3, 8]), True)
    """
    graph = _JointGraph(
        encoder_attentions, decoder_attentions, cross_attentions, layer, residual_alpha, head_fusion,
        attention_mask, decoder_attention_mask,
    )
    encoder = rollout(graph.encoder_layers, residual_alpha, head_fusion, graph.source_mask)[-1]
    decoder = torch.cat([residual_alpha * graph.cross, (1 - residual_alpha) * graph.decoder], -1)
    scores = _composed(encoder, decoder, graph.target_mask, graph.layers)
    return scores[0] if layer is not None else scores


def encoder_decoder_contributions(
    encoder_maps: Tensor,
    decoder_maps: Tensor,
    layer: int | None = -1,
    attention_mask: Tensor | None = None,
    decoder_attention_mask: Tensor | None = None,
) -> Tensor:
    """Per-layer contribution maps of an encoder-decoder composed over the joint graph: ALTI+
    (Ferrando et al., EMNLP 2022, "Towards opening the black box of neural machine
    translation", section 3) and value zeroing, whose maps hold the residual already.

    Each encoder layer's map :math:`C^{enc}_l` (rows summing to 1) is rolled out,
    :math:`R_{enc} = C^{enc}_{L_e} \\cdots C^{enc}_1`; each decoder layer's map is one joint
    matrix :math:`D_l = [X_l \\; S_l]` (m x (n_s + m), rows summing to 1): what position t's
    output of decoder layer l takes from the encoder's outputs (:math:`X_l`, through the
    cross-attention) and from the layer's inputs (:math:`S_l`, through the self-attention and the
    residual). Then, from :math:`T_0 = I`, :math:`U_0 = 0`,

    .. math::

        U_l = S_l U_{l-1} + X_l R_{enc}, \\qquad T_l = S_l T_{l-1},

    and row t of :math:`[U_l \\; T_l]` splits position t over the source tokens and the target
    input tokens (the decoder's start token and the tokens written so far): the source share
    :math:`\\sum_j U_l[t, j]` and the target share :math:`\\sum_k T_l[t, k]` sum to 1.
    :func:`encoder_decoder_rollout` is the same composition of the attention maps with a constant
    residual, :math:`X_l = \\alpha W^{cross}_l`, :math:`S_l = (1 - \\alpha) A_l`.

    Args:
        encoder_maps: (L_e, B, n_s, n_s) the encoder layers' contribution maps (row = query).
        decoder_maps: (L_d, B, m, n_s + m) the decoder layers' joint maps :math:`[X_l \\; S_l]`
            (:func:`alti_plus_layer` for ALTI+).
        layer: the decoder layer, 1..L_d (or negative from the top); None for all.
        attention_mask: (B, n_s), 1 on real source tokens; ``decoder_attention_mask`` (B, m), 1
            on real decoder positions. Padding rows and columns get 0.

    Returns:
        float32 (B, m, n_s + m) for one layer, (L_d, B, m, n_s + m) for ``layer=None``: row t
        over the source tokens (U), then the target input tokens (T).

    Example::

        >>> import torch
        >>> from captum_attnflow.functional.encoder_decoder import encoder_decoder_contributions
        >>> encoder = torch.softmax(torch.randn(2, 1, 4, 4), -1)          # (L_e, B, n_s, n_s)
        >>> decoder = torch.softmax(torch.randn(3, 1, 2, 4 + 2), -1)      # (L_d, B, m, n_s + m)
        >>> decoder[..., 4:] = decoder[..., 4:].tril()                    # causal: no later target
        >>> decoder = decoder / decoder.sum(-1, keepdim=True)
        >>> rows = encoder_decoder_contributions(encoder, decoder)
        >>> rows.shape, torch.allclose(rows.sum(-1), torch.ones(1, 2))
        (torch.Size([1, 2, 6]), True)
    """
    encoder_maps, decoder_maps = torch.as_tensor(encoder_maps), torch.as_tensor(decoder_maps)
    if encoder_maps.dim() != 4 or encoder_maps.shape[-1] != encoder_maps.shape[-2]:
        raise ValueError(f"encoder_maps must be (L_e, B, n_s, n_s), one map per encoder layer, got {tuple(encoder_maps.shape)}.")
    _, batch, n, _ = encoder_maps.shape
    if decoder_maps.dim() != 4 or decoder_maps.shape[1] != batch or decoder_maps.shape[-1] != n + decoder_maps.shape[-2]:
        raise ValueError(
            f"decoder_maps must be (L_d, B, m, n_s + m) = (L_d, {batch}, m, {n} + m), each decoder layer's map over the "
            f"encoder outputs then the decoder inputs, got {tuple(decoder_maps.shape)}."
        )
    m = decoder_maps.shape[2]
    device = decoder_maps.device
    source = as_mask(attention_mask, batch, n, device)
    target = as_mask(decoder_attention_mask, batch, m, device)
    source_pairs = (source[:, :, None] & source[:, None, :]).float()
    rolled = torch.diag_embed(source.float())
    for encoder_map in encoder_maps.to(device).float():
        rolled = (encoder_map * source_pairs) @ rolled
    keep = (target[:, :, None] & torch.cat([source, target], 1)[:, None, :]).float()
    scores = _composed(rolled, decoder_maps.float() * keep, target, layer_indices(layer, decoder_maps.shape[0]))
    return scores[0] if layer is not None else scores


def alti_plus_layer(self_contributions: Tensor, cross_contributions: Tensor) -> Tensor:
    """One decoder layer's joint ALTI+ map (B, m, n_s + m), :math:`[X_l \\; r_l \\odot S_l]`: the
    cross-attention block's contributions of the encoder outputs :math:`X_l`, then the
    self-attention block's contributions :math:`S_l` (rows summing to 1) scaled row by row by the
    share :math:`r_l` the cross-attention block left to its residual, which carries the
    self-attention block's output (the released code's composition of the two sub-layers).

    Args:
        self_contributions: (B, m, m) the self-attention block's ALTI contributions.
        cross_contributions: (B, m, n_s + 1) the cross-attention block's, the residual last
            (:func:`~captum_attnflow.functional.decomposition.alti_cross_contributions`).

    Example::

        >>> import torch
        >>> from captum_attnflow.functional.encoder_decoder import alti_plus_layer
        >>> own = torch.tensor([[[1.0, 0.0], [0.25, 0.75]]])               # (B, m, m)
        >>> cross = torch.tensor([[[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]])    # (B, m, n_s + 1)
        >>> alti_plus_layer(own, cross)
        tensor([[[0.5000, 0.3000, 0.2000, 0.0000],
                 [0.1000, 0.1000, 0.2000, 0.6000]]])
    """
    return torch.cat([cross_contributions[..., :-1], cross_contributions[..., -1:] * self_contributions], -1)


def _composed(encoder: Tensor, decoder: Tensor, target_mask: Tensor, layers: list[int]) -> Tensor:
    """(len(layers), B, m, n_s + m): :math:`[U_l \\; T_l]` of the layers asked, from the rolled-out
    encoder (B, n_s, n_s) and the decoder layers' joint maps (L_d, B, m, n_s + m), as
    :func:`encoder_decoder_contributions` composes them."""
    batch, m, n = decoder.shape[1], decoder.shape[2], encoder.shape[-1]
    targets = torch.diag_embed(target_mask.float())  # T_0 = I on real positions
    sources = torch.zeros(batch, m, n, device=targets.device)
    out = []
    for index in range(layers[-1] + 1):
        cross, own = decoder[index][..., :n], decoder[index][..., n:]
        sources = own @ sources + cross @ encoder
        targets = own @ targets
        if index in layers:
            out.append(torch.cat([sources, targets], -1))
    return torch.stack(out)


def encoder_decoder_raw_attention(
    encoder_attentions: Attentions,
    decoder_attentions: Attentions,
    cross_attentions: Sequence[Tensor] | Tensor,
    layer: int | None = -1,
    residual_alpha: float = 1.0,
    head_fusion: str = "mean",
    attention_mask: Tensor | None = None,
    decoder_attention_mask: Tensor | None = None,
) -> Tensor:
    """One decoder layer's edges of the joint graph: :math:`[\\alpha W^{cross}_l \\; (1 - \\alpha) A_l]`.

    The encoder's outputs stand for the source tokens, as raw attention reads them. With the
    default ``residual_alpha=1.0`` it is the head-fused cross-attention over the source tokens
    and 0 on the target tokens; smaller :math:`\\alpha` moves :math:`1 - \\alpha` of each row
    onto the decoder's own (residual-mixed) self-attention.

    Args:
        encoder_attentions: as in :func:`encoder_decoder_rollout`; checked, used for the
            source padding only.
        decoder_attentions, cross_attentions, layer, head_fusion, attention_mask, decoder_attention_mask:
            as in :func:`encoder_decoder_rollout`.
        residual_alpha: :math:`\\alpha`, default 1.0.

    Returns:
        float32 (B, m, n_s + m) for one layer, (L_d, B, m, n_s + m) for ``layer=None``.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional.encoder_decoder import encoder_decoder_raw_attention
        >>> enc = torch.softmax(torch.randn(2, 1, 4, 5, 5), -1)
        >>> dec = torch.eye(3).expand(3, 1, 4, 3, 3)                 # each position on itself
        >>> cross = torch.softmax(torch.randn(3, 1, 4, 3, 5), -1)
        >>> raw = encoder_decoder_raw_attention(enc, dec, cross, layer=2)
        >>> bool(torch.allclose(raw[..., :5], cross[1].mean(1))), raw[..., 5:].abs().max().item()
        (True, 0.0)
    """
    graph = _JointGraph(
        encoder_attentions, decoder_attentions, cross_attentions, layer, residual_alpha, head_fusion,
        attention_mask, decoder_attention_mask,
    )
    scores = torch.cat(
        [residual_alpha * graph.cross[graph.layers], (1 - residual_alpha) * graph.decoder[graph.layers]], -1
    )
    return scores[0] if layer is not None else scores


def encoder_decoder_flow(
    encoder_attentions: Attentions,
    decoder_attentions: Attentions,
    cross_attentions: Sequence[Tensor] | Tensor,
    layer: int | None = -1,
    sources: int | Sequence[int] | None = None,
    residual_alpha: float = 0.5,
    head_fusion: str = "mean",
    attention_mask: Tensor | None = None,
    decoder_attention_mask: Tensor | None = None,
    show_progress: bool | None = None,
) -> Tensor:
    """Attention flow over the joint graph: max flow from decoder nodes to every input token.

    Entry ``[b, a, j]`` is the value of the maximum flow from decoder position ``sources[a]``
    after ``layer`` to input token ``j`` (a source token, encoder layer 0, or a target input
    token, decoder layer 0) in the graph whose edges are those of the module docstring: decoder
    self-attention :math:`A_l`, residual :math:`1 - \\alpha` and cross-attention
    :math:`\\alpha W^{cross}_l` in each decoder layer, then the encoder's :math:`A^{enc}`.
    The graph is laid out for the layered max-flow kernel of :func:`~captum_attnflow.functional.flow`
    (encoder output nodes and decoder inputs are passed down through edges too wide to be cut),
    so values carry the same certificate.

    Args:
        encoder_attentions, decoder_attentions, cross_attentions, layer, residual_alpha, head_fusion, attention_mask, decoder_attention_mask:
            as in :func:`encoder_decoder_rollout`.
        sources: decoder positions to explain, an int or a sequence of S ints (negative count
            from m), the same for every example; None (default) for all m. A position on
            padding gets 0.
        show_progress: a tqdm bar over the examples and layers; None (default) shows one only
            for long computations.

    Returns:
        float32 (B, S, n_s + m) for one layer, (L_d, B, S, n_s + m) for ``layer=None``.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional.encoder_decoder import encoder_decoder_flow
        >>> enc = torch.softmax(torch.randn(2, 1, 4, 5, 5), -1)
        >>> dec = torch.softmax(torch.randn(3, 1, 4, 3, 3), -1).tril()
        >>> dec = dec / dec.sum(-1, keepdim=True)
        >>> cross = torch.softmax(torch.randn(3, 1, 4, 3, 5), -1)
        >>> encoder_decoder_flow(enc, dec, cross, sources=[0, 2]).shape
        torch.Size([1, 2, 8])
    """
    graph = _JointGraph(
        encoder_attentions, decoder_attentions, cross_attentions, layer, residual_alpha, head_fusion,
        attention_mask, decoder_attention_mask,
    )
    layers = graph.layers
    _, batch, m, n = graph.cross.shape
    if sources is None:
        positions = list(range(m))
    else:
        positions = [sources] if isinstance(sources, int) else list(sources)
        if not positions or any(isinstance(p, bool) or not isinstance(p, int) or not -m <= p < m for p in positions):
            raise ValueError(f"sources must be decoder positions in -{m}..{m - 1} (or None for all), got {sources!r}.")
        positions = [p % m for p in positions]
    encoder = torch.stack([layer.float() for layer in graph.encoder_layers])
    encoder = torch.stack(
        [add_residual(fuse_heads(encoder[k], head_fusion) * graph.source_keep, residual_alpha) * graph.source_keep
         for k in range(encoder.shape[0])]
    ).double().cpu().numpy()
    decoder = graph.decoder.double().cpu().numpy()
    cross = graph.cross.double().cpu().numpy()
    source_mask = graph.source_mask.cpu().numpy()
    target_mask = graph.target_mask.cpu().numpy()
    values = np.zeros((len(layers), batch, len(positions), n + m))
    sizes = source_mask.sum(1) + target_mask.sum(1)
    work = len(positions) * sum(int(size) ** 3 for size in sizes) * sum(index + 1 for index in layers)
    show = work > _PROGRESS_WORK if show_progress is None else show_progress
    import numba  # with the kernel, only where flow is computed

    from captum_attnflow.functional._maxflow import max_flows

    bar = tqdm(total=batch * len(layers), desc="attention flow", unit="layer", disable=not show)
    for b in range(batch):
        keep_s = np.flatnonzero(source_mask[b])
        keep_t = np.flatnonzero(target_mask[b])
        renumber = np.full(m, -1)
        renumber[keep_t] = np.arange(keep_t.size)
        chosen = [a for a, p in enumerate(positions) if renumber[p] >= 0]
        if not chosen:
            bar.update(len(layers))
            continue
        example_sources = renumber[[positions[a] for a in chosen]]
        for out, index in enumerate(layers):
            cap = _layered_capacities(
                encoder[:, b][:, keep_s][:, :, keep_s],
                decoder[: index + 1, b][:, keep_t][:, :, keep_t],
                cross[: index + 1, b][:, keep_t][:, :, keep_s],
                residual_alpha,
            )
            result, _ = max_flows(cap, example_sources, numba.get_num_threads())
            bar.update()
            columns = np.concatenate([keep_s, n + keep_t])
            # the kernel's slots are the decoder positions first, then the source tokens
            values[out, b, np.asarray(chosen)[:, None], columns[None, :]] = np.concatenate(
                [result[:, keep_t.size :], result[:, : keep_t.size]], 1
            )
    bar.close()
    scores = torch.from_numpy(values).float().to(graph.cross.device)
    return scores[0] if layer is not None else scores


def _layered_capacities(encoder: np.ndarray, decoder: np.ndarray, cross: np.ndarray, alpha: float) -> np.ndarray:
    """The joint graph as (2 l + L_e, m + n, m + n) capacities for the layered max-flow kernel.

    Slots 0..m-1 are decoder positions, m..m+n-1 source tokens. From the top, each decoder
    layer is two levels, its cross-attention sub-layer (residual 1 - alpha on the slot itself,
    alpha W_cross to the encoder-output slots) and its self-attention sub-layer (A); then the
    encoder's levels. Encoder-output slots in the decoder's levels and decoder slots in the
    encoder's levels only pass flow straight down (capacity ``_CARRY``), so they stand for
    one node each: the encoder's output, a decoder input token.
    """
    num_encoder, n, _ = encoder.shape
    num_decoder, m, _ = decoder.shape
    width = m + n
    cap = np.zeros((2 * num_decoder + num_encoder, width, width))
    target = np.arange(m)
    source = m + np.arange(n)
    for k in range(num_encoder):
        cap[k][target, target] = _CARRY
        cap[k][m:, m:] = encoder[k]
    for d in range(num_decoder):
        self_level = num_encoder + 2 * d
        cap[self_level][:m, :m] = decoder[d]
        cap[self_level][source, source] = _CARRY
        cross_level = self_level + 1
        cap[cross_level][target, target] = (1 - alpha) * (decoder[d].sum(-1) > 0)
        cap[cross_level][:m, m:] = alpha * cross[d]
        cap[cross_level][source, source] = _CARRY
    return cap


class _JointGraph:
    """Checked, head-fused edges of the joint graph, padding removed.

    ``encoder_layers``: the encoder's L_e attentions as given; ``decoder`` (L_d, B, m, m): the
    residual-mixed self-attention :math:`A_l`; ``cross`` (L_d, B, m, n_s): the head-fused
    cross-attention rows, renormalised over real source tokens; ``source_mask`` (B, n_s),
    ``target_mask`` (B, m), ``source_keep`` (B, n_s, n_s) bool; ``layers``: the asked decoder
    ``layer`` as 0-based indices.
    """

    def __init__(
        self,
        encoder_attentions: Attentions,
        decoder_attentions: Attentions,
        cross_attentions: Sequence[Tensor] | Tensor,
        layer: int | None,
        residual_alpha: float,
        head_fusion: str,
        attention_mask: Tensor | None,
        decoder_attention_mask: Tensor | None,
    ) -> None:
        check_residual_alpha(residual_alpha)
        self.encoder_layers = attention_layers(encoder_attentions)
        decoder_layers = attention_layers(decoder_attentions)
        batch, _, n, _ = self.encoder_layers[0].shape
        _, _, m, _ = decoder_layers[0].shape
        cross_layers = list(cross_attentions.unbind(0)) if isinstance(cross_attentions, Tensor) else list(cross_attentions)
        if len(cross_layers) != len(decoder_layers) or any(
            not isinstance(c, Tensor) or c.dim() != 4 or c.shape[0] != batch or tuple(c.shape[-2:]) != (m, n)
            for c in cross_layers
        ):
            shapes = [tuple(c.shape) if isinstance(c, Tensor) else type(c).__name__ for c in cross_layers]
            raise ValueError(
                f"cross_attentions must be one (B, H, m, n_s) = ({batch}, H, {m}, {n}) tensor per decoder layer "
                f"({len(decoder_layers)}), decoder queries over encoder keys, as transformers returns them; got {shapes}."
            )
        device = decoder_layers[0].device
        self.source_mask = as_mask(attention_mask, batch, n, device)
        self.target_mask = as_mask(decoder_attention_mask, batch, m, device)
        self.source_keep = self.source_mask[:, :, None] & self.source_mask[:, None, :]
        target_keep = self.target_mask[:, :, None] & self.target_mask[:, None, :]
        cross_keep = self.target_mask[:, :, None] & self.source_mask[:, None, :]
        decoder, cross = [], []
        for self_layer, cross_layer in zip(decoder_layers, cross_layers):
            self_layer, cross_layer = self_layer.float(), cross_layer.float()
            check_attention_values(self_layer, self.target_mask)
            check_attention_values(cross_layer, self.target_mask)
            decoder.append(add_residual(fuse_heads(self_layer, head_fusion) * target_keep, residual_alpha) * target_keep)
            fused = fuse_heads(cross_layer, head_fusion) * cross_keep
            sums = fused.sum(-1, keepdim=True)
            cross.append(fused / torch.where(sums > 0, sums, torch.ones_like(sums)))
        self.decoder = torch.stack(decoder)
        self.cross = torch.stack(cross)
        self.layers = layer_indices(layer, len(decoder_layers))
