"""Gradient-weighted attention rollout (Chefer, Gur & Wolf, ICCV 2021, equations 5-6)."""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import torch
from torch import Tensor

from captum_attnflow.docstrings import fill_docstring
from captum_attnflow.functional.checks import (
    POSITION_DOC,
    Attentions,
    as_mask,
    attention_layers,
    default_position,
    matrix_rows,
)


def relevance_maps(attentions: Attentions, gradients: Attentions, attention_mask: Tensor | None = None) -> Tensor:
    """The relevance maps :math:`R_l` after each layer, (L, B, n, n) float32.

    With :math:`A_l` the attention probabilities (B, H, n, n) of layer l and :math:`\\nabla A_l`
    the gradient of the explained score with respect to them,

    .. math::
        \\bar A_l = \\mathbb{E}_h\\big[(\\nabla A_l \\odot A_l)^+\\big], \\qquad
        R_0 = I, \\qquad R_l = R_{l-1} + \\bar A_l R_{l-1},

    not normalised, as the paper defines it. Padding rows and columns of :math:`\\bar A_l` are
    zero, so padding never receives or passes relevance.

    Args:
        attentions: L tensors (B, H, n, n) (or one (L, B, H, n, n) tensor), row = query.
        gradients: the gradients of the score with respect to them, the same shapes.
        attention_mask: optional (B, n), 1 on real tokens, 0 on padding.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional.gradient_rollout import relevance_maps
        >>> attentions = torch.softmax(torch.randn(2, 1, 4, 3, 3), -1)  # (L, B, H, n, n)
        >>> relevance = relevance_maps(attentions, torch.ones_like(attentions))  # gradient 1: Ā = mean_h A
        >>> expected = torch.eye(3) + attentions[0, 0].mean(0)
        >>> expected = expected + attentions[1, 0].mean(0) @ expected
        >>> torch.allclose(relevance[1, 0], expected)
        True
    """
    layers = _weighted(attentions, gradients)
    batch, n, _ = layers[0].shape
    mask = as_mask(attention_mask, batch, n, layers[0].device)
    keep = (mask[:, :, None] & mask[:, None, :]).float()
    relevance = torch.eye(n, device=mask.device).expand(batch, n, n)
    maps = []
    for weighted in layers:
        relevance = relevance + (weighted * keep) @ relevance
        maps.append(relevance)
    return torch.stack(maps)


@fill_docstring(position=POSITION_DOC)
def gradient_weighted_rollout(
    attentions: Attentions,
    gradients: Attentions,
    position: int | list[int] | Tensor | None = None,
    layer: int | None = -1,
    attention_mask: Tensor | None = None,
) -> Tensor:
    """Rows of the relevance maps :func:`relevance_maps`: the relevance of each input token for
    the representation of ``position`` after ``layer``.

    Args:
        attentions, gradients, attention_mask: as in :func:`relevance_maps`.
        position: {position}
            None (default): each example's last real token when the attention is causal, else 0.
        layer: 1..L (or negative from the top) for one layer, None for all layers.

    Returns:
        float32 (B, n) for one layer and one position per example; a leading layer axis
        (L, B, n) for ``layer=None`` and a position axis (..., S, n) for a list or (B, S)
        ``position``; padding 0. Equal to ``relevance_maps(...)[l, b, position[b]]``.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional import gradient_weighted_rollout
        >>> attentions = torch.softmax(torch.randn(3, 2, 4, 5, 5), -1)  # (L, B, H, n, n)
        >>> gradient_weighted_rollout(attentions, torch.randn(3, 2, 4, 5, 5), layer=None).shape
        torch.Size([3, 2, 5])
    """
    maps = relevance_maps(attentions, gradients, attention_mask)
    mask = as_mask(attention_mask, maps.shape[1], maps.shape[2], maps.device)
    if position is None:  # causal attention, detected from the attentions (R may lack gradients to show it)
        causal = all(not bool(layer.triu(1).any()) for layer in attention_layers(attentions))
        position = default_position(mask, causal)
    return matrix_rows(maps, position, layer, mask)


def encoder_decoder_relevance(
    encoder: tuple[Attentions, Attentions],
    decoder: tuple[Attentions, Attentions],
    cross: tuple[Attentions, Attentions],
    attention_mask: Tensor | None = None,
    decoder_attention_mask: Tensor | None = None,
) -> Tensor:
    """Chefer et al.'s relevance of an encoder-decoder (ICCV 2021, rules 6, 7 and 10), after each
    decoder layer: (L_d, B, m, n_s + m), the decoder positions' relevance over the source tokens
    (:math:`R^{ts}`, first n_s columns) and the decoder's input tokens (:math:`R^{tt}`).

    Each argument is a pair ``(attentions, gradients)`` in transformers' layout: the encoder's
    self-attentions (B, H, n_s, n_s), the decoder's self-attentions (B, H, m, m) and its
    cross-attentions (B, H, m, n_s), one tensor per layer, with the gradients of the explained
    score. With :math:`\\bar A = \\mathbb{E}_h[(\\nabla A \\odot A)^+]` of each,
    :math:`R^{ss} = I`, :math:`R^{tt} = I`, :math:`R^{ts} = 0`:

    .. math::
        R^{ss} \\mathrel{+}= \\bar A^{ss} R^{ss} \\text{ (each encoder layer)}; \\quad
        R^{tt} \\mathrel{+}= \\bar A^{tt} R^{tt},\\; R^{ts} \\mathrel{+}= \\bar A^{tt} R^{ts}
        \\text{ (decoder self-attention)}; \\quad
        R^{ts} \\mathrel{+}= (\\hat R^{tt})^\\top \\bar A^{ts} \\hat R^{ss} \\text{ (cross-attention)},

    where :math:`\\hat R = \\operatorname{rownorm}(R - I) + I` (rows of :math:`R - I` summing to
    0 stay 0), as in the authors' code. Padding rows and columns are 0.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional.gradient_rollout import encoder_decoder_relevance
        >>> pair = lambda *shape: (torch.softmax(torch.randn(*shape), -1), torch.randn(*shape))
        >>> scores = encoder_decoder_relevance(pair(2, 1, 4, 5, 5), pair(3, 1, 4, 3, 3), pair(3, 1, 4, 3, 5))
        >>> scores.shape  # (L_d, B, m, n_s + m)
        torch.Size([3, 1, 3, 8])
    """
    return co_attention_relevance(
        _weighted(*encoder), _weighted(*decoder), _weighted(*cross, square=False), attention_mask, decoder_attention_mask
    )


def co_attention_relevance(
    encoder_layers: list[Tensor],
    decoder_layers: list[Tensor],
    cross_layers: list[Tensor],
    attention_mask: Tensor | None = None,
    decoder_attention_mask: Tensor | None = None,
) -> Tensor:
    """:func:`encoder_decoder_relevance` from the head-averaged gradient-weighted maps
    :math:`\\bar A` of each layer: (B, n_s, n_s) per encoder layer, (B, m, m) per decoder
    self-attention, (B, m, n_s) per cross-attention. Returns (L_d, B, m, n_s + m)."""
    batch, n, _ = encoder_layers[0].shape
    m = decoder_layers[0].shape[-1]
    device = encoder_layers[0].device
    source = as_mask(attention_mask, batch, n, device).float()
    target = as_mask(decoder_attention_mask, batch, m, device).float()
    sources = torch.diag_embed(source)
    for weighted in encoder_layers:
        sources = sources + (weighted * source[:, :, None] * source[:, None, :]) @ sources
    targets, mixed = torch.diag_embed(target), torch.zeros(batch, m, n, device=device)
    out = []
    for self_weighted, cross_weighted in zip(decoder_layers, cross_layers):
        self_weighted = self_weighted * target[:, :, None] * target[:, None, :]
        targets, mixed = targets + self_weighted @ targets, mixed + self_weighted @ mixed
        cross_weighted = cross_weighted * target[:, :, None] * source[:, None, :]
        mixed = mixed + _normalised(targets).transpose(1, 2) @ cross_weighted @ _normalised(sources)
        out.append(torch.cat([mixed, targets * target[:, :, None]], -1))
    return torch.stack(out)


BlockStream = Callable[[int], Iterable[tuple[int, int, Tensor]]]
# ``product(rows)``: a layer's :math:`\bar A` as a function of row vectors, u -> u \bar A, for
# its first ``rows`` rows, or None where its blocks serve.
ProductStream = Callable[[int], Callable[[Tensor], Tensor] | None]


def streamed_relevance_rows(
    layers: Sequence[BlockStream], sources: Tensor, attention_mask: Tensor, products: Sequence[ProductStream] | None = None
) -> Tensor:
    """Rows ``sources`` (B, S) of :math:`R_l` (:func:`relevance_maps`) after the top layer of
    ``layers``, without any (B, n, n) matrix: (B, S, n) float32.

    The rows are walked top-down, :math:`r \\leftarrow r + r \\bar A_k` for k = l, ..., 1
    (:math:`R_l = (I + \\bar A_l) \\cdots (I + \\bar A_1)`), each :math:`\\bar A_k` given as a
    stream of row blocks: ``layers[k](rows)`` yields ``(start, stop, block)``, ``block``
    (B, stop - start, w) the rows start..stop over the first w keys, for the first ``rows``
    rows at least (the rows past the last non-zero entry of r are not needed); or, where
    ``products[k](rows)`` gives one, as a function multiplying row vectors (B, c, rows) by
    those rows of :math:`\\bar A_k`, (B, c, n).

    Args:
        layers: one block stream per layer, bottom first.
        sources: (B, S) explained positions.
        attention_mask: (B, n) bool, True on real tokens; padding rows and columns are 0.
        products: one product stream per layer, bottom first, or None.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional.gradient_rollout import relevance_maps, streamed_relevance_rows
        >>> attentions, gradients = torch.softmax(torch.randn(2, 1, 3, 4, 4), -1), torch.randn(2, 1, 3, 4, 4)
        >>> bars = [(g * a).clamp(min=0).mean(1) for a, g in zip(attentions, gradients)]
        >>> layers = [lambda rows, bar=bar: [(0, 4, bar)] for bar in bars]
        >>> rows = streamed_relevance_rows(layers, torch.tensor([[0, 2]]), torch.ones(1, 4, dtype=torch.bool))
        >>> torch.allclose(rows, relevance_maps(attentions, gradients)[-1][:, [0, 2]])
        True
    """
    return _rolled_down(layers, sources, attention_mask, products, every_layer=False)


def streamed_relevance_maps_rows(
    layers: Sequence[BlockStream], sources: Tensor, attention_mask: Tensor, products: Sequence[ProductStream] | None = None
) -> Tensor:
    """Rows ``sources`` (B, S) of :math:`R_l` after every layer l of ``layers`` (block and
    product streams as in :func:`streamed_relevance_rows`): (L, B, S, n) float32.

    One walk down the layers: at layer k the rows of every :math:`R_l`, l >= k, are multiplied
    at once (those of :math:`R_k` start there as the sources' unit rows), so each layer is
    recomputed once and no (B, n, n) matrix is made."""
    return _rolled_down(layers, sources, attention_mask, products, every_layer=True)


def _rolled_down(
    layers: Sequence[BlockStream], sources: Tensor, attention_mask: Tensor, products: Sequence[ProductStream] | None,
    every_layer: bool,
) -> Tensor:
    """The top-down walk of :func:`streamed_relevance_rows` (``every_layer``: of
    :func:`streamed_relevance_maps_rows`, (L, B, S, n))."""
    walk = RowWalk(sources, attention_mask, len(layers), every_layer)
    for k in reversed(range(len(layers))):
        walk.step(layers[k], None if products is None else products[k])
    return walk.rows()


class RowWalk:
    """The walk of :func:`streamed_relevance_rows` (``every_layer``: of
    :func:`streamed_relevance_maps_rows`) one layer at a time, top layer first, for a caller that
    has each layer's :math:`\\bar A_k` only for a moment (during a backward pass that recomputes
    the layers one by one).

    Args:
        sources: (B, S) explained positions.
        attention_mask: (B, n) bool, True on real tokens.
        layers: L, the number of layers walked (:meth:`step` is called L times, for layer L down to 1).
        every_layer: the rows after every layer, (L, B, S, n), rather than after the top one.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional.gradient_rollout import RowWalk, relevance_maps
        >>> attentions, gradients = torch.softmax(torch.randn(2, 1, 3, 4, 4), -1), torch.randn(2, 1, 3, 4, 4)
        >>> bars = [(g * a).clamp(min=0).mean(1) for a, g in zip(attentions, gradients)]
        >>> walk = RowWalk(torch.tensor([[3]]), torch.ones(1, 4, dtype=torch.bool), 2, every_layer=False)
        >>> for bar in reversed(bars):  # top layer first
        ...     walk.step(lambda rows, bar=bar: [(0, 4, bar)])
        >>> torch.allclose(walk.rows(), relevance_maps(attentions, gradients)[-1][:, [3]])
        True
    """

    def __init__(self, sources: Tensor, attention_mask: Tensor, layers: int, every_layer: bool) -> None:
        batch, n = attention_mask.shape
        self._mask = attention_mask.float()
        self._units = torch.zeros(batch, sources.shape[1], n, device=self._mask.device)
        self._units.scatter_(2, sources[..., None], 1.0)
        self._rows = self._units[:, :0]
        self._left = layers
        self._every_layer = every_layer
        self._layers = layers

    def step(self, layer: BlockStream, product_of: ProductStream | None = None) -> None:
        """:math:`r \\leftarrow r + r \\bar A_k` for the next layer down, its map given as a block
        stream (and a product stream, or None), as :func:`streamed_relevance_rows` takes them."""
        if self._left == 0:
            raise ValueError(f"RowWalk walks {self._layers} layers; step was called once more.")
        if self._every_layer or self._left == self._layers:  # R_k's rows start here, before those of the layers above
            self._rows = torch.cat([self._units, self._rows], 1)
        self._left -= 1
        mask = self._mask
        kept = self._rows * mask[:, None, :]
        needed = int(kept.abs().amax((0, 1)).nonzero().max()) + 1
        product_of = None if product_of is None else product_of(needed)
        if product_of is not None:
            product = product_of(kept[..., :needed].contiguous())
        else:
            product = torch.zeros_like(self._rows)
            for start, stop, block in layer(needed):
                if start >= needed:
                    break
                product[..., : block.shape[-1]].baddbmm_(kept[..., start:stop], block)
        self._rows = self._rows + product * mask[:, None, :]

    def rows(self) -> Tensor:
        """The walked rows, (B, S, n) float32 ((L, B, S, n) with ``every_layer``); every layer must have been stepped."""
        if self._left:
            raise ValueError(f"RowWalk has {self._left} of its {self._layers} layers left to step.")
        batch, _, n = self._rows.shape
        rows = self._rows * self._mask[:, None, :]
        return rows.view(batch, self._layers, -1, n).transpose(0, 1) if self._every_layer else rows


def _weighted(attentions: Attentions, gradients: Attentions, square: bool = True) -> list[Tensor]:
    """Per layer :math:`\\mathbb{E}_h[(\\nabla A \\odot A)^+]` (B, n_q, n_k); cross-attention
    (``square=False``) as a sequence of (B, H, n_q, n_k) tensors or one stacked tensor."""
    if square:
        layers, grads = attention_layers(attentions), attention_layers(gradients)
    else:
        layers, grads = list(attentions), list(gradients)
    if len(layers) != len(grads) or any(a.shape != g.shape for a, g in zip(layers, grads)):
        raise ValueError(
            "gradients must match attentions: one gradient of each layer's shape, "
            f"got {[tuple(g.shape) for g in grads]} for {[tuple(a.shape) for a in layers]}."
        )
    return [(gradient.float() * attention.float()).clamp(min=0).mean(1) for attention, gradient in zip(layers, grads)]


def _normalised(relevance: Tensor) -> Tensor:
    """:math:`\\operatorname{rownorm}(R - I) + I` of square (B, k, k) relevance."""
    eye = torch.eye(relevance.shape[-1], device=relevance.device)
    residual = relevance - eye
    sums = residual.sum(-1, keepdim=True)
    return residual / torch.where(sums != 0, sums, torch.ones_like(sums)) + eye
