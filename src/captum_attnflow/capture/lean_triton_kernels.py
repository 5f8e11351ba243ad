"""Triton twin of :func:`~captum_attnflow.capture.lean_blocks.fused_blocks`: head-fused attention probabilities
computed tile by tile on chip.

The torch operations of :mod:`captum_attnflow.capture.lean` write every head's (rows, n) scores to
memory and read them back for the mask, the softmax and the fusion; on a GPU that traffic, not
the arithmetic, sets the time (a Llama-1B layer at n = 16384: 70 ms against 2.6 ms for its own
flash attention). Here, as in flash attention, no per-head score leaves the chip. For a block of
query rows, per head :math:`h`, with the scores in base-2 units
:math:`t_h = \\log_2(e)\\,(c \\tanh((q_h k_h^\\top s) / c) + M)` (soft-capping :math:`c` if any,
mask :math:`M`: bool, additive, or causality),

1. :func:`_row_statistics` walks the key tiles once and keeps each row's maximum
   :math:`m_h = \\max_j t_{hj}` and inverse sum :math:`1 / l_h`, :math:`l_h = \\sum_j 2^{t_{hj} - m_h}`
   (updated online, as flash attention does), two numbers a row and head, and on request the
   share of the row's probability on the real (unpadded) keys;
2. :func:`_fused_probabilities` recomputes each (rows, keys) tile of scores of every head,
   :math:`P_h = 2^{t_h - m_h} / l_h`, optionally weights it by the gradient
   :math:`(P_h \\odot \\nabla O_h V_h^\\top)^+`, and fuses the heads (mean, max or min) in
   registers: the block's fused rows are the only (rows, n) numbers written;
3. or :func:`_fused_product` multiplies row vectors by the head-mean tiles as they are made,
   :math:`u W` with :math:`W = \\frac1H \\sum_h P_h`, so that rollout's product with a layer
   writes no (rows, n) number at all: each program owns a tile of keys and walks the rows.

:math:`q k^\\top` runs on tensor cores in the model's dtype with float32 accumulation: bfloat16
and float16 as they are; float32 as three TF32 products (``tf32x3``, float32's accuracy, as
sdpa's float32 kernels compute), or one when torch allows TF32 for matmuls. The softmax is
float32. Rows without any allowed key come out 0, as in the torch path. The kernels are launched
(tiles chosen, tuned on a GPU, the interpreter on CPU tensors) by :mod:`captum_attnflow.capture.lean_triton`.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _log2_scores(
    q_ptr, k_ptr, mask_ptr, b, h, h_kv, rows, keys, row_ok, n_keys,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_mb, stride_mh, stride_mq, stride_mk,
    head_dim, scaling, softcap,
    BLOCK_D: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """(BLOCK_M, BLOCK_N) float32 scores of head ``h`` for query positions ``rows`` and key
    positions ``keys`` in base-2 units (times log2(e), for exp2); -inf where a key is not allowed
    or past ``n_keys``."""
    dims = tl.arange(0, BLOCK_D)
    q = tl.load(
        q_ptr + b * stride_qb + h * stride_qh + rows[:, None] * stride_qn + dims[None, :] * stride_qd,
        mask=row_ok[:, None] & (dims[None, :] < head_dim), other=0.0,
    )
    k = tl.load(
        k_ptr + b * stride_kb + h_kv * stride_kh + keys[None, :] * stride_kn + dims[:, None] * stride_kd,
        mask=(keys[None, :] < n_keys) & (dims[:, None] < head_dim), other=0.0,
    )
    if UPCAST:
        q, k = q.to(tl.float32), k.to(tl.float32)
    s = tl.dot(q, k, input_precision=PRECISION, out_dtype=tl.float32)
    if SOFTCAP:  # c tanh(s / c), tanh through exp (the interpreter has no tanh)
        s = s * scaling
        s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0))
        if MASK != 2:
            s = s * 1.4426950408889634
    elif MASK != 2:
        s = s * (scaling * 1.4426950408889634)
    else:
        s = s * scaling
    allowed = row_ok[:, None] & (keys[None, :] < n_keys)
    if CAUSAL:
        allowed = allowed & (keys[None, :] <= rows[:, None])
    if MASK != 0:
        m = tl.load(
            mask_ptr + b * stride_mb + h * stride_mh + rows[:, None] * stride_mq + keys[None, :] * stride_mk,
            mask=allowed, other=0,
        )
        if MASK == 1:
            allowed = allowed & (m != 0)
        else:
            # Eager attention adds the dtype's minimum to masked scores, which overflows times
            # log2(e): kept finite, a row masked whole is uniform there as in eager; -inf stays.
            s = s + m.to(tl.float32)
            s = tl.where(s == float("-inf"), s, tl.maximum(s, -2.35865e38) * 1.4426950408889634)
    return tl.where(allowed, s, float("-inf"))


@triton.jit
def _row_positions(rows_ptr, start, b, block, n_rows, stride_rb, BLOCK_M: tl.constexpr, ROWS: tl.constexpr):
    """The query positions of rows ``block * BLOCK_M ...`` of the block and which of them exist."""
    index = block.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = index < n_rows
    if ROWS:
        rows = tl.load(rows_ptr + b * stride_rb + index, mask=row_ok, other=0)
    else:
        rows = start + index
    return rows, row_ok


@triton.jit
def _row_statistics(
    q_ptr, k_ptr, mask_ptr, rows_ptr, max_ptr, inv_ptr, real_ptr, real_keys_ptr,
    start, n_rows, n_keys, heads, groups, head_dim, scaling, softcap, keys_class,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_mb, stride_mh, stride_mq, stride_mk, stride_rb, stride_real_b,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    MASK: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr, ROWS: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, REAL: tl.constexpr,
):
    """Row maximum :math:`m` and inverse sum :math:`1 / \\sum_j 2^{t_j - m}` of one head's scores,
    rows of a BLOCK_M tile, over all keys ((B, H, R) each; 0 and 0 for a row without any allowed
    key), and with ``REAL`` the share of each row's probability on the keys ``real_keys`` marks;
    grid (row tiles, B * H)."""
    bh = tl.program_id(1).to(tl.int64)  # 64-bit offsets: a (B, n, n) map passes 2^31 numbers at B n^2
    b, h = bh // heads, bh % heads
    rows, row_ok = _row_positions(rows_ptr, start, b, tl.program_id(0), n_rows, stride_rb, BLOCK_M, ROWS)
    hi = n_keys
    if CAUSAL:  # keys after the tile's last row are never seen
        hi = tl.minimum(n_keys, tl.max(tl.where(row_ok, rows, 0), 0) + 1)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    r_i = tl.zeros((BLOCK_M,), tl.float32)
    for first in range(0, hi, BLOCK_N):
        keys = first + tl.arange(0, BLOCK_N)
        t = _log2_scores(
            q_ptr, k_ptr, mask_ptr, b, h, h // groups, rows, keys, row_ok, n_keys,
            stride_qb, stride_qh, stride_qn, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
            stride_mb, stride_mh, stride_mq, stride_mk, head_dim, scaling, softcap,
            BLOCK_D, MASK, CAUSAL, SOFTCAP, PRECISION, UPCAST,
        )
        m_new = tl.maximum(m_i, tl.max(t, 1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing allowed yet
        decay = tl.exp2(m_i - shift)
        e = tl.exp2(t - shift[:, None])
        l_i = l_i * decay + tl.sum(e, 1)
        if REAL:
            real = tl.load(real_keys_ptr + b * stride_real_b + keys, mask=keys < n_keys, other=0)
            r_i = r_i * decay + tl.sum(tl.where(real[None, :] != 0, e, 0.0), 1)
        m_i = m_new
    offset = (b * heads + h) * n_rows + tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    empty = l_i == 0.0
    tl.store(max_ptr + offset, tl.where(empty, 0.0, m_i), mask=row_ok)
    tl.store(inv_ptr + offset, tl.where(empty, 0.0, 1.0 / tl.where(empty, 1.0, l_i)), mask=row_ok)
    if REAL:
        tl.store(real_ptr + offset, tl.where(empty, 0.0, r_i / tl.where(empty, 1.0, l_i)), mask=row_ok)


@triton.jit
def _head_probabilities(
    q_ptr, k_ptr, mask_ptr, max_ptr, inv_ptr, dout_ptr, v_ptr, b, h, rows, row_ok, keys, row_index,
    n_rows, n_keys, heads, groups, head_dim, scaling, softcap,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_mb, stride_mh, stride_mq, stride_mk,
    stride_gb, stride_gh, stride_gn, stride_gd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    BLOCK_D: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr, GRADIENT: tl.constexpr,
):
    """Head ``h``'s probabilities of one tile, :math:`2^{t - m} / l` (``row_index``: the rows'
    places in the statistics), gradient-weighted :math:`(P \\odot \\nabla O V^\\top)^+`
    with ``GRADIENT``."""
    t = _log2_scores(
        q_ptr, k_ptr, mask_ptr, b, h, h // groups, rows, keys, row_ok, n_keys,
        stride_qb, stride_qh, stride_qn, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
        stride_mb, stride_mh, stride_mq, stride_mk, head_dim, scaling, softcap,
        BLOCK_D, MASK, CAUSAL, SOFTCAP, PRECISION, UPCAST,
    )
    offset = (b * heads + h) * n_rows + row_index
    m = tl.load(max_ptr + offset, mask=row_ok, other=0.0)
    inverse = tl.load(inv_ptr + offset, mask=row_ok, other=0.0)
    p = tl.exp2(t - m[:, None]) * inverse[:, None]  # 0 where t = -inf, and in rows without any key
    if GRADIENT:  # (P_h * dO_h V_h^T)^+
        dims = tl.arange(0, BLOCK_D)
        g = tl.load(
            dout_ptr + b * stride_gb + h * stride_gh + rows[:, None] * stride_gn + dims[None, :] * stride_gd,
            mask=row_ok[:, None] & (dims[None, :] < head_dim), other=0.0,
        )
        v = tl.load(
            v_ptr + b * stride_vb + (h // groups) * stride_vh + keys[None, :] * stride_vn + dims[:, None] * stride_vd,
            mask=(keys[None, :] < n_keys) & (dims[:, None] < head_dim), other=0.0,
        )
        g = g.to(v.dtype)
        if UPCAST:
            g, v = g.to(tl.float32), v.to(tl.float32)
        p = tl.maximum(p * tl.dot(g, v, input_precision=PRECISION, out_dtype=tl.float32), 0.0)
    return p


@triton.jit
def _fused_probabilities(
    q_ptr, k_ptr, mask_ptr, rows_ptr, max_ptr, inv_ptr, out_ptr, dout_ptr, v_ptr,
    start, n_rows, n_keys, heads, groups, head_dim, scaling, softcap, keys_class,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_mb, stride_mh, stride_mq, stride_mk, stride_rb,
    stride_ob, stride_or, stride_ok,
    stride_gb, stride_gh, stride_gn, stride_gd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    MASK: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr, ROWS: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, FUSION: tl.constexpr, GRADIENT: tl.constexpr,
):
    """One (BLOCK_M rows, BLOCK_N keys) tile of the head-fused probabilities, every head's
    probabilities recomputed from the row statistics and fused in registers; grid (key tiles,
    row tiles, B)."""
    b = tl.program_id(2).to(tl.int64)  # 64-bit offsets: a (B, n, n) map passes 2^31 numbers at B n^2
    # Key tiles vary fastest, so the programs running together share their rows' queries (in L2)
    # and stream the keys: rows fastest would read every query tile from memory once per key tile.
    key_tile, row_tile = tl.program_id(0), tl.program_id(1)
    rows, row_ok = _row_positions(rows_ptr, start, b, row_tile, n_rows, stride_rb, BLOCK_M, ROWS)
    row_index = row_tile.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # the rows' places in the statistics and ``out``
    keys = key_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    if FUSION == 2:
        fused = tl.full((BLOCK_M, BLOCK_N), float("inf"), tl.float32)
    else:
        fused = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    seen = True
    if CAUSAL:  # a tile wholly after the rows' positions is 0 for every head
        seen = key_tile * BLOCK_N <= tl.max(tl.where(row_ok, rows, 0), 0)
    if seen:
        for h in range(0, heads):
            p = _head_probabilities(
                q_ptr, k_ptr, mask_ptr, max_ptr, inv_ptr, dout_ptr, v_ptr, b, h, rows, row_ok, keys, row_index,
                n_rows, n_keys, heads, groups, head_dim, scaling, softcap,
                stride_qb, stride_qh, stride_qn, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
                stride_mb, stride_mh, stride_mq, stride_mk, stride_gb, stride_gh, stride_gn, stride_gd,
                stride_vb, stride_vh, stride_vn, stride_vd,
                BLOCK_D, MASK, CAUSAL, SOFTCAP, PRECISION, UPCAST, GRADIENT,
            )
            if FUSION == 0:
                fused += p
            elif FUSION == 1:
                fused = tl.maximum(fused, p)
            else:
                fused = tl.minimum(fused, p)
        if FUSION == 0:
            fused = fused * (1.0 / heads)
    else:
        fused = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    tl.store(
        out_ptr + b * stride_ob + row_index[:, None] * stride_or + keys[None, :] * stride_ok,
        fused, mask=row_ok[:, None] & (keys[None, :] < n_keys),
    )


@triton.jit
def _fused_product(
    q_ptr, k_ptr, mask_ptr, max_ptr, inv_ptr, u_ptr, part_ptr, dout_ptr, v_ptr,
    n_rows, n_keys, heads, groups, head_dim, scaling, softcap, keys_class, n_vectors, chunk_rows,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_mb, stride_mh, stride_mq, stride_mk,
    stride_ub, stride_uc, stride_un,
    stride_pk, stride_pb, stride_pc, stride_pn,
    stride_gb, stride_gh, stride_gn, stride_gd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr,
    MASK: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr, GRADIENT: tl.constexpr, PRODUCT_PRECISION: tl.constexpr,
):
    """Row vectors ``u`` (B, C, R) times the head-mean probabilities of rows
    ``chunk * chunk_rows ...`` (a chunk of the R rows), over one tile of BLOCK_N keys: the
    chunk's partial product (C, BLOCK_N), written to ``part[chunk, b]``; grid (key tiles,
    chunks, B). The probability tiles stay in registers."""
    key_tile, chunk, b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    keys = key_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    vectors = tl.arange(0, BLOCK_C)
    first_row = chunk * chunk_rows
    last_row = tl.minimum(n_rows, first_row + chunk_rows)
    if CAUSAL:  # rows before the tile's first key see none of it
        first_row = tl.maximum(first_row, (key_tile * BLOCK_N) // BLOCK_M * BLOCK_M)
    product = tl.zeros((BLOCK_C, BLOCK_N), tl.float32)
    for row_start in range(first_row, last_row, BLOCK_M):
        rows = row_start + tl.arange(0, BLOCK_M)
        row_ok = rows < last_row
        fused = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for h in range(0, heads):
            fused += _head_probabilities(
                q_ptr, k_ptr, mask_ptr, max_ptr, inv_ptr, dout_ptr, v_ptr, b, h, rows, row_ok, keys, rows.to(tl.int64),
                n_rows, n_keys, heads, groups, head_dim, scaling, softcap,
                stride_qb, stride_qh, stride_qn, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
                stride_mb, stride_mh, stride_mq, stride_mk, stride_gb, stride_gh, stride_gn, stride_gd,
                stride_vb, stride_vh, stride_vn, stride_vd,
                BLOCK_D, MASK, CAUSAL, SOFTCAP, PRECISION, UPCAST, GRADIENT,
            )
        u = tl.load(
            u_ptr + b * stride_ub + vectors[:, None] * stride_uc + rows[None, :] * stride_un,
            mask=(vectors[:, None] < n_vectors) & row_ok[None, :], other=0.0,
        )
        product += tl.dot(u, fused, input_precision=PRODUCT_PRECISION, out_dtype=tl.float32)
    product = product * (1.0 / heads)
    tl.store(
        part_ptr + chunk * stride_pk + b * stride_pb + vectors[:, None] * stride_pc + keys[None, :] * stride_pn,
        product, mask=(vectors[:, None] < n_vectors) & (keys[None, :] < n_keys),
    )
