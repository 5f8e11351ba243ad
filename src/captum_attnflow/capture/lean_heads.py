"""Per-head attention probabilities of one lean-captured attention call, recomputed by blocks of rows.

:mod:`captum_attnflow.capture.lean` keeps each layer's queries and keys and fuses the heads of each
block of rows it recomputes. The decomposition methods (ALTI, the attention norms, value
zeroing) weigh every head's value vectors by that head's own probabilities, so they take the
heads unfused: :math:`P_h = \\operatorname{softmax}(q_h k_h^\\top s + M)` (with soft-capping,
:math:`c \\tanh(q_h k_h^\\top s / c) + M`) for a block of query rows at a time, (B, H, r, n_k),
with the semantics of :func:`~captum_attnflow.capture.lean_blocks.fused_blocks`: the layer's bool or
additive mask of any broadcast shape, causality for a call without a mask, grouped-query key
heads repeated for their queries, rows without any allowed key (padding queries) 0. The
(B, H, n, n) maps never exist whole unless one block is asked to hold every row.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import Tensor

from captum_attnflow.capture.lean_blocks import AttentionScores
from captum_attnflow.functional.kernels import block_bytes

# One block's scores (all heads) take about this many bytes on the CPU (twice: scores and
# probabilities), about as many rows as the decomposition kernels' tasks of 16 rows on a few
# threads need; on a GPU a share of its free memory, at most _GPU_BLOCK_BYTES.
_BLOCK_BYTES = 32 * 2**20
_GPU_BLOCK_BYTES = 2**27
_TILE_ROWS = 64


def head_blocks(scores: AttentionScores, rows: int | None = None) -> Iterator[tuple[int, Tensor]]:
    """Per-head attention probabilities of one call's ``scores`` (queries (B, H, n, d), keys
    (B, H_kv, n_k, d)), by blocks of rows.

    Yields ``(start, block)``, ``block`` float32 (B, H, r, n_k) the probabilities of the query
    rows start..start + r; it is overwritten by the next block (the buffers are reused). ``rows``:
    rows per block (all of them in one block for ``rows >= n``); None: as many as fit the
    device's block budget (:func:`~captum_attnflow.functional.kernels.block_bytes`).

    Example::

        >>> import torch
        >>> from captum_attnflow.capture.lean import AttentionScores
        >>> from captum_attnflow.capture.lean_heads import head_blocks
        >>> query, key = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)  # 4 query heads share 2 key heads
        >>> scores = AttentionScores(query, key, None, 8 ** -0.5, causal=True)
        >>> blocks = [block.clone() for _, block in head_blocks(scores, rows=2)]
        >>> eager = (query @ key.repeat_interleave(2, 1).transpose(-1, -2) * 8 ** -0.5).masked_fill(
        ...     torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        >>> [block.shape[2] for block in blocks], torch.allclose(torch.cat(blocks, 2), eager)
        ([2, 2, 1], True)
    """
    query, key, mask = scores.query, scores.key, scores.mask
    batch, heads, n, _ = query.shape
    n_keys = key.shape[2]
    if rows is None:
        budget = block_bytes(query.device, _BLOCK_BYTES, _GPU_BLOCK_BYTES)
        rows = budget // (4 * batch * heads * n_keys)
        # whole tiles of the distance kernels (64 query rows a program on a GPU, 16 a task on the
        # CPU): a block of 682 rows would leave a tile of 42 rows and a last block of 4 at n = 4096
        rows = rows // _TILE_ROWS * _TILE_ROWS if rows > _TILE_ROWS else rows
    rows = min(n, max(1, rows))
    if key.shape[1] != heads:
        key = key.repeat_interleave(heads // key.shape[1], dim=1)
    keys = key.float().transpose(-1, -2)  # (B, H, d, n_k)
    queries = query.float() * scores.scaling  # the scaling on the queries (n x d), not the scores (n x n_k)
    size = batch * heads * rows * n_keys
    scratch = torch.empty(2 * size, dtype=torch.float32, device=query.device)
    allowed = None if mask is None else mask.expand(*mask.shape[:2], n, n_keys)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        shape = (batch, heads, stop - start, n_keys)
        numbers = batch * heads * (stop - start) * n_keys
        products, probabilities = scratch[:numbers].view(shape), scratch[size : size + numbers].view(shape)
        torch.matmul(queries[:, :, start:stop], keys, out=products)
        if scores.softcap is not None:  # before the masks: -inf stays -inf
            products.div_(scores.softcap).tanh_().mul_(scores.softcap)
        if allowed is not None:
            block_mask = allowed[..., start:stop, :]
            if block_mask.dtype == torch.bool:
                products.masked_fill_(~block_mask, float("-inf"))
            else:  # an additive mask
                products.add_(block_mask.float())
        elif scores.causal:  # query row i sees the keys up to i + n_k - n (a cache's keys before the rows)
            later = torch.ones(stop - start, n_keys, dtype=torch.bool, device=query.device).triu(start + n_keys - n + 1)
            products.masked_fill_(later, float("-inf"))
        torch.ops.aten._softmax.out(products, -1, False, out=probabilities)
        if allowed is not None:
            probabilities.nan_to_num_(0.0)  # a padding query with no allowed key: 0
        yield start, probabilities
