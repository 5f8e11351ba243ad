"""Triton twin of the numba kernel of :mod:`captum_attnflow.functional.decomposition`: ALTI's L1
distances without writing the (rows, n, D) transformed vectors.

The transformed vector of query i and token j is :math:`T_i(x_j) = \\sum_h \\alpha^h_{ij} f^h(x_j)`
(plus :math:`x_i` for the query's own token), n²·D numbers a layer: 51 GB for BERT-base at
n = 4096, which the torch path writes and reads in row blocks. Here one program takes a tile of
query rows i and one token j, as the numba kernel takes one token j at a time for a task of
rows: for each chunk of the D features it forms the tile's vectors in registers as one product
(rows, H) x (H, chunk) of the heads' weights and projected values, and reduces them on the spot
to :math:`\\lVert y_i - T_i(x_j) \\rVert_1` (the linearised LayerNorm applied first for a
post-LN block). Only the (B, rows, n) result is written. The kernel runs on CPU tensors
through Triton's interpreter (``TRITON_INTERPRET=1`` when triton is first imported), which is
how the tests check it against the torch path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

# Query rows of a tile and features of a chunk.
_TILE = (64, 64)
# The (rows, H) x (H, chunk) products in float32 FMA: ALTI's contributions are differences of
# nearly equal L1 norms, which TF32's 10-bit products would not keep.
_PRECISION = "ieee"


@triton.jit
def _token_distances(
    p_ptr, f_ptr, x_ptr, y_ptr, scale_ptr, f_mean_ptr, x_mean_ptr, out_ptr,
    n, count, row_offset, heads, size,
    stride_pb, stride_ph, stride_pi, stride_pj,
    stride_fb, stride_fh, stride_fj, stride_fk,
    BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    CENTRED: tl.constexpr, PRECISION: tl.constexpr,
):
    """Grid (n tokens j, row tiles, B): ``out[b, i, j]`` for the tile's rows i of a block of
    ``count`` query rows (the rows of ``p``, ``x``, ``y``, ``scale`` and ``out``), the first one
    query ``row_offset``: the L1 distance, +inf where i != j and no head attends."""
    j = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B n^2 and B H n D pass 2^31 at long inputs
    b = tl.program_id(2).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < count
    hs = tl.arange(0, BLOCK_H)
    weights = tl.load(
        p_ptr + b * stride_pb + hs[None, :] * stride_ph + rows[:, None] * stride_pi + j * stride_pj,
        mask=row_ok[:, None] & (hs[None, :] < heads), other=0.0,
    ).to(tl.float32)  # (rows, heads)
    own = rows + row_offset == j
    attended = own | (tl.max(tl.where(weights != 0.0, 1, 0), 1) > 0)
    total = tl.zeros((BLOCK_M,), tl.float32)
    if tl.max(tl.where(attended & row_ok, 1, 0), 0) > 0:  # a tile that no head attends is +inf
        if CENTRED:  # the mean of T_i(x_j), linear in the heads (and x_i for i = j)
            f_means = tl.load(f_mean_ptr + (b * heads + hs) * n + j, mask=hs < heads, other=0.0)
            mean = tl.sum(weights * f_means[None, :], 1)
            mean += tl.where(own, tl.load(x_mean_ptr + b * count + rows, mask=row_ok, other=0.0), 0.0)
        for first in range(0, size, BLOCK_K):
            ks = first + tl.arange(0, BLOCK_K)
            k_ok = ks < size
            projected = tl.load(
                f_ptr + b * stride_fb + hs[:, None] * stride_fh + j * stride_fj + ks[None, :] * stride_fk,
                mask=(hs[:, None] < heads) & k_ok[None, :], other=0.0,
            )  # (heads, chunk)
            vectors = tl.dot(weights, projected, input_precision=PRECISION)  # (rows, chunk)
            offsets = (b * count + rows[:, None]) * size + ks[None, :]
            inside = row_ok[:, None] & k_ok[None, :]
            vectors += tl.load(x_ptr + offsets, mask=inside & own[:, None], other=0.0)
            if CENTRED:
                vectors = (vectors - mean[:, None]) * tl.load(scale_ptr + offsets, mask=inside, other=0.0)
            outputs = tl.load(y_ptr + offsets, mask=inside, other=0.0)
            total += tl.sum(tl.where(inside, tl.abs(outputs - vectors), 0.0), 1)
    total = tl.where(attended, total, float("inf"))
    tl.store(out_ptr + (b * count + rows) * n + j, total, mask=row_ok)


def alti_distances(
    probabilities: Tensor, projected: Tensor, inputs: Tensor, outputs: Tensor, scale: Tensor | None,
    row_offset: int = 0,
) -> Tensor:
    """(B, r, n) :math:`\\lVert y_i - T_i(x_j) \\rVert_1` of a block of r query rows, the first
    one ``row_offset``, as :func:`~captum_attnflow.functional.decomposition._compiled_distances`
    gives it (+inf where i != j and no head attends): ``probabilities`` (B, H, r, n),
    ``projected`` (B, H, n, D) float32, the rows' ``inputs`` and ``outputs`` (B, r, D), their
    ``scale`` (B, r, D) of a post-LN block or None."""
    batch, heads, n, size = projected.shape
    count = probabilities.shape[2]
    projected = projected.float()
    out = torch.empty(batch, count, n, dtype=torch.float32, device=projected.device)
    block_m, block_k = _TILE
    centred = scale is not None
    inputs, outputs = inputs.float().contiguous(), outputs.float().contiguous()
    scale = scale.float().contiguous() if centred else outputs  # unread when not centred
    f_means, x_means = projected.mean(-1).contiguous(), inputs.mean(-1).contiguous()
    _token_distances[(n, triton.cdiv(count, block_m), batch)](  # n on the first axis, the one without a 65535 limit
        probabilities, projected, inputs, outputs, scale, f_means, x_means, out,
        n, count, row_offset, heads, size, *probabilities.stride(), *projected.stride(),
        BLOCK_M=block_m, BLOCK_H=max(16, triton.next_power_of_2(heads)), BLOCK_K=block_k,
        CENTRED=centred, PRECISION=_PRECISION,
    )
    return out
