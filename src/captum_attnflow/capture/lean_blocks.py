"""A layer's head-fused attention probabilities recomputed from the queries and keys a capture
kept, in blocks of rows sized for the device, so that the per-head maps never exist whole.

:class:`AttentionScores` holds what makes one attention call's scores :math:`q k^\\top s + M`;
:func:`fused_blocks` yields its head-fused probabilities a block of rows at a time (rollout and
flow), :func:`fused_rows` computes given rows only (raw attention, the top layer of a rollout),
and :func:`row_product` multiplies row vectors by the head-mean map without writing it (on a
GPU). On a CUDA device the blocks run in the Triton kernels of
:mod:`captum_attnflow.capture.lean_triton`, decided by device in :func:`_kernels` alone.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Iterator

import torch
from torch import Tensor

from captum_attnflow.functional.kernels import block_bytes, gpu_kernels
from captum_attnflow.functional.mixing import fuse_heads

# On the CPU the scores of one block of rows, all heads, take about this many bytes (twice:
# scores and probabilities). The q k^T product of a block is its largest cost and runs faster on
# more rows (K = d = 64 is short): at n = 4096 on 2 cores it takes 0.31 s a BERT-base layer in
# 8 MiB blocks, 0.18 s in 48 MiB ones.
_BLOCK_BYTES = 48 * 2**20
# On a GPU at most this (a share of its free memory: functional.kernels.block_bytes).
_GPU_BLOCK_BYTES = 2**30


@dataclass(frozen=True)
class AttentionScores:
    """Everything that makes one attention call's scores :math:`q k^\\top s + M`, as kept by a capture.

    Attributes:
        query: (B, H, n, d) the queries the call was given (after rotary embeddings), detached.
        key: (B, H_kv, n_k, d) its keys; grouped-query key heads are repeated for their queries.
        mask: transformers' 4-D mask for the query rows (bool, True = attend, or additive),
            any broadcastable (B or 1, 1, n or 1, n_k) shape; None for plain causal or no masking.
        scaling: the factor :math:`s` on :math:`q k^\\top`.
        causal: whether a call without a mask masks later keys.
        softcap: :math:`c` of Gemma 2's soft-capping: the scores are :math:`c \\tanh(q k^\\top s / c) + M`;
            None for none.
    """

    query: Tensor
    key: Tensor
    mask: Tensor | None
    scaling: float
    causal: bool
    softcap: float | None = None

    @functools.cached_property
    def attends_causally(self) -> bool:
        """Whether no query may see a later key (see :func:`attends_causally`; read once from the mask)."""
        return attends_causally(self.query.shape[2], self.mask, self.causal)


def attends_causally(queries: int, mask: Tensor | None, causal: bool) -> bool:
    """Whether an attention call of ``queries`` rows with transformers' ``mask`` (bool, True =
    attend, or additive; None: ``causal`` says) lets no query see a later key."""
    if mask is None:
        return causal or queries == 1
    allowed = mask if mask.dtype == torch.bool else mask == 0  # additive masks: 0 where allowed
    return not bool(allowed.triu(1).any())


def fused_rows(scores: AttentionScores, head_fusion: str, rows: Tensor, out: Tensor) -> Tensor:
    """Head-fused attention probabilities (B, S, n) of the query rows ``rows`` (B, S) only, into
    ``out``; arguments as in :func:`fused_blocks` (the top layer of a rollout, raw attention:
    S rows cost S/n of the layer)."""
    query, key, mask, scaling, causal = scores.query, scores.key, scores.mask, scores.scaling, scores.causal
    kernels = _kernels(query.device)
    if kernels is not None:
        return kernels.fused_probabilities(
            query, key, mask, scaling, causal, head_fusion, out, rows=rows.contiguous(), softcap=scores.softcap
        )
    batch, heads, n, _ = query.shape
    keys = _keys(key, heads)
    picked = torch.arange(batch, device=rows.device)[:, None]
    products = torch.matmul(query[picked, :, rows].transpose(1, 2).float() * scaling, keys)  # (B, H, S, n)
    _capped(products, scores.softcap)
    if mask is not None:
        allowed = mask.expand(batch, -1, n, -1)[picked, :, rows].transpose(1, 2)
    else:
        allowed = (torch.arange(n, device=rows.device) <= rows[..., None])[:, None] if causal else None
    return _softmax_fused(products, allowed, head_fusion, out)


def row_product(
    scores: AttentionScores, rows: int, real_keys: Tensor | None = None, gradient: tuple[Tensor, Tensor] | None = None
) -> Any | None:
    """The head-mean map :math:`W` of the first ``rows`` query rows of one call's ``scores``
    (gradient-weighted as in :func:`fused_blocks` with ``gradient``) as a function of row
    vectors, ``product(u)`` = u W for ``u`` (B, C, rows) float32, (B, C, n_k), with
    ``product.real_sums`` (B, rows), :math:`\\sum_{j \\text{ real}} W_{ij}` over the keys
    ``real_keys`` (B, n_k) marks: the Triton kernels' :class:`~captum_attnflow.capture.lean_triton.RowProduct`,
    which never writes :math:`W`. None where the kernels do not run (the CPU), where
    :func:`fused_blocks` serves."""
    kernels = _kernels(scores.query.device)
    if kernels is None:
        return None
    causal = scores.query.shape[2] == scores.key.shape[2] and scores.attends_causally
    return kernels.row_product(
        scores.query, scores.key, scores.mask, scores.scaling, causal, rows, real_keys, gradient, scores.softcap
    )


def fused_blocks(
    scores: AttentionScores,
    head_fusion: str,
    scratch: Tensor | None = None,
    out: Tensor | None = None,
    gradient: tuple[Tensor, Tensor] | None = None,
    rows: int | None = None,
) -> Iterator[tuple[int, int, Tensor]]:
    """Head-fused attention probabilities of one call's ``scores`` (queries (B, H, n, d)), by blocks of rows.

    :math:`P_h = \\operatorname{softmax}(q_h k_h^\\top s + M)` (with soft-capping
    :math:`c \\tanh(q_h k_h^\\top s / c) + M`), computed in float32 one block of
    rows at a time and fused over heads per block, so the per-head maps never exist whole.
    Rows without any allowed key (padding queries) come out 0.

    Yields ``(start, stop, block)``: ``block`` (B, stop - start, w) holds the fused rows
    start..stop over the first w keys, the later ones being 0 (causal attention, whose blocks
    see only the keys up to ``stop``). It is ``out[:, start:stop, :w]`` when ``out`` (B, n, n)
    is given, else a view of ``scratch`` valid until the next block. ``scratch``: float32
    buffer of at least :func:`_scratch_size` numbers (allocated if None).

    ``gradient``: ``(grad_output, value)``, the gradient (B, H, n, d) of a score with respect to
    the attention's output and the values (B, H_kv, n_k, d) it mixed. Each head's probabilities
    are then weighted by their gradient before fusion, :math:`(P_h \\odot \\nabla P_h)^+` with
    :math:`\\nabla P_h = \\nabla O_h V_h^\\top` (the output is :math:`O_h = P_h V_h`), the
    gradient-weighted maps of Chefer et al. (ICCV 2021, equation 5) without any (B, H, n, n)
    tensor: the gradient of a block is computed beside its probabilities. ``rows``: stop after
    the block holding that many leading rows (all rows if None).
    """
    query, key, mask, scaling = scores.query, scores.key, scores.mask, scores.scaling
    batch, heads, n, _ = query.shape
    n_keys = key.shape[2]
    kernels, per_head, size = _plan(scores)
    # Self-attention in which no query sees a later key (a decoder, with or without a padding
    # mask): a block stops at its last row's key.
    keys_seen_causally = n == n_keys and scores.attends_causally
    # Buffers of about the block budget, reused by every block: fresh (B, H, rows, n) tensors per
    # block cost a page fault per page, as much as the softmax itself at n = 4096.
    if scratch is None:
        scratch = torch.empty(size, dtype=torch.float32, device=query.device)
    elif scratch.numel() < size:  # a buffer sized when the device had less memory free: smaller blocks
        per_head = max(n_keys, per_head * scratch.numel() // size)
    if kernels is None:
        keys = _keys(key, heads)
        if gradient is not None:
            grad_output, values = gradient[0], _keys(gradient[1], heads)  # values (B, H, d, n_k)
    size = batch * heads * per_head
    start = 0
    while start < (n if rows is None else min(n, rows)):
        if keys_seen_causally:
            # Causal attention: rows start..stop see keys up to ``stop`` only, so
            # the later keys are neither multiplied nor normalised (half the work over the whole
            # map), and early blocks are narrow: as many rows as fit, rows (start + rows) <= per_head.
            fitting = int((math.sqrt(start * start + 4 * per_head) - start) / 2)
            stop = min(n, start + max(1, fitting))
            width = stop
        else:
            stop = min(n, start + max(1, per_head // n_keys))
            width = n_keys
        if out is not None:
            block = out[:, start:stop, :width]
        elif kernels is not None:
            block = scratch[: batch * (stop - start) * width].view(batch, stop - start, width)
        if kernels is not None:  # each head's scores stay on chip: the fused block is all that is written
            kernels.fused_probabilities(  # a padded decoder's tiles after the rows are skipped too
                query, key, mask, scaling, keys_seen_causally, head_fusion, block, start, gradient=gradient,
                softcap=scores.softcap,
            )
            yield start, stop, block
            start = stop
            continue
        shape = (batch, heads, stop - start, width)
        numbers = batch * heads * (stop - start) * width
        products = scratch[:numbers].view(shape)
        # The scaling on the queries (rows x d), not on the (rows x n) scores.
        torch.matmul(query[:, :, start:stop].float() * scaling, keys[..., :width], out=products)
        _capped(products, scores.softcap)  # before the masks: -inf stays -inf
        # (the mask's query axis may be 1, broadcast over the rows)
        allowed = None if mask is None else mask.expand(*mask.shape[:2], n, mask.shape[-1])[..., start:stop, :width]
        if keys_seen_causally and mask is None:  # every row sees the keys before ``start``: mask the block's own square only
            later = torch.ones(stop - start, stop - start, dtype=torch.bool, device=query.device).triu(1)
            products[..., start:stop].masked_fill_(later, float("-inf"))
        probabilities = scratch[size : size + numbers].view(shape)
        if out is None:
            block = scratch[2 * size : 2 * size + numbers // heads].view(batch, stop - start, width)
        weight = None if gradient is None else (grad_output[:, :, start:stop].float(), values[..., :width])
        yield start, stop, _softmax_fused(products, allowed, head_fusion, block, probabilities, weight)
        start = stop


def _capped(products: Tensor, softcap: float | None) -> None:
    """Soft-cap the scores ``products`` in place, :math:`c \\tanh(x / c)` (nothing for None)."""
    if softcap is not None:
        products.div_(softcap).tanh_().mul_(softcap)


def _keys(key: Tensor, heads: int) -> Tensor:
    """(B, H, d, n) float32 keys, grouped-query key heads repeated for their query heads."""
    if key.shape[1] != heads:
        key = key.repeat_interleave(heads // key.shape[1], dim=1)
    return key.float().transpose(-1, -2)


def _kernels(device: torch.device) -> ModuleType | None:
    """Where the blocks are computed, decided by device in this one place: the Triton kernels of
    :mod:`captum_attnflow.capture.lean_triton` where they run (:func:`~captum_attnflow.functional.kernels.gpu_kernels`),
    else None: the torch operations of :func:`fused_blocks`."""
    return gpu_kernels(device, "captum_attnflow.capture.lean_triton")


def _block_bytes(device: torch.device) -> int:
    """Bytes a block of rows may take on ``device``: _BLOCK_BYTES on the CPU (its caches); on a
    GPU a share of the memory free now, at least _BLOCK_BYTES and at most _GPU_BLOCK_BYTES."""
    return block_bytes(device, _BLOCK_BYTES, _GPU_BLOCK_BYTES)


def _plan(scores: AttentionScores) -> tuple[ModuleType | None, int, int]:
    """How :func:`fused_blocks` computes the blocks of ``scores``: ``(kernels, per_head, size)``,
    the kernels of :func:`_kernels` (None: torch operations), the numbers in one head's block of
    scores (about the device's block budget over all heads that a block writes, at least one
    row, at most the whole map) and the scratch numbers: with the kernels a block's fused rows
    (B, rows, keys) only, without them also its scores and probabilities (B, H, rows, keys)."""
    batch, heads, n, _ = scores.query.shape
    keys = scores.key.shape[2]
    kernels = _kernels(scores.query.device)
    written = 1 if kernels is not None else heads  # heads whose scores a block writes
    per_head = min(max(keys, _block_bytes(scores.query.device) // (4 * batch * written)), n * keys)
    return kernels, per_head, (1 if kernels is not None else 2 * heads + 1) * batch * per_head


def _scratch_size(scores: AttentionScores) -> int:
    """Numbers in the scratch buffer of :func:`fused_blocks` (see :func:`_plan`)."""
    return _plan(scores)[2]


def _softmax_fused(
    scores: Tensor,
    allowed: Tensor | None,
    head_fusion: str,
    out: Tensor,
    probabilities: Tensor | None = None,
    weight: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """``out`` (B, R, k) = the heads of softmax(``scores`` (B, H, R, k) masked by ``allowed``) fused;
    ``scores`` is overwritten, ``probabilities`` (its shape) is scratch space if given. ``weight``:
    two factors (B, H, R, d) and (B, H, d, k) whose product weights the probabilities, negative
    products clipped to 0, before fusion."""
    if allowed is not None:
        if allowed.dtype == torch.bool:
            scores.masked_fill_(~allowed, float("-inf"))
        else:  # an additive mask
            scores.add_(allowed.float())
    if probabilities is None:
        probabilities = torch.softmax(scores, dim=-1)
    else:  # softmax into the scratch buffer: torch.softmax has no ``out``, its aten kernel does
        torch.ops.aten._softmax.out(scores, -1, False, out=probabilities)
    if allowed is not None:
        probabilities.nan_to_num_(0.0)  # a padding query with no allowed key: 0
    if weight is not None:  # the scores are spent: their buffer takes the weights
        probabilities.mul_(torch.matmul(*weight, out=scores)).clamp_(min=0.0)
    return fuse_heads(probabilities, head_fusion, out=out)
