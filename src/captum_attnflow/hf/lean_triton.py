"""Triton twin of :func:`~captum_attnflow.hf.lean.fused_blocks`: head-fused attention probabilities
computed tile by tile on chip.

The torch operations of :mod:`captum_attnflow.hf.lean` write every head's (rows, n) scores to
memory and read them back for the mask, the softmax and the fusion; on a GPU that traffic, not
the arithmetic, sets the time (a Llama-1B layer at n = 16384: 70 ms against 2.6 ms for its own
flash attention). Here, as in flash attention, no per-head score leaves the chip. For a block of
query rows, per head :math:`h`,

1. :func:`_row_statistics` walks the key tiles once and keeps the row maximum
   :math:`m_h = \\max_j s_{hj}` and the sum :math:`l_h = \\sum_j e^{s_{hj} - m_h}` of the scores
   :math:`s_h = c \\tanh((q_h k_h^\\top s) / c) + M` (soft-capping :math:`c` if any, mask
   :math:`M`: bool, additive, or causality), 2 numbers a row and head;
2. :func:`_fused_probabilities` recomputes each (rows, keys) tile of scores of every head,
   :math:`P_h = e^{s_h - m_h} / l_h`, optionally weights it by the gradient
   :math:`(P_h \\odot \\nabla O_h V_h^\\top)^+`, and fuses the heads (mean, max or min) in
   registers: the block's fused rows are the only (rows, n) numbers written.

:math:`q k^\\top` runs in the model's dtype with float32 accumulation (tensor cores for
bfloat16 and float16; for float32 the IEEE product unless torch allows TF32 for matmuls, as
sdpa does); the softmax is float32. Rows without any allowed key come out 0, as in the torch
path. The kernels run on CPU tensors through Triton's interpreter (``TRITON_INTERPRET=1`` when
this module is imported), which is how the tests check them against the torch path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

_FUSIONS = {"mean": 0, "max": 1, "min": 2}
# Query rows and keys of a tile (halved rows for heads larger than 64).
_TILE = (64, 64)
_NO_MASK, _BOOL_MASK, _ADDITIVE_MASK = 0, 1, 2
# What the tiles multiply in the queries' own dtype; others (float64) are made float32 first.
_TILE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _scores(
    q_ptr, k_ptr, mask_ptr, b, h, h_kv, rows, keys, row_ok, n_keys,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_mb, stride_mh, stride_mq, stride_mk,
    head_dim, scaling, softcap,
    BLOCK_D: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """(BLOCK_M, BLOCK_N) float32 scores of head ``h`` for query positions ``rows`` and key
    positions ``keys``; -inf where a key is not allowed or past ``n_keys``."""
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
    s = tl.dot(q, k, input_precision=PRECISION, out_dtype=tl.float32) * scaling
    if SOFTCAP:  # c tanh(s / c), tanh through exp (the interpreter has no tanh)
        s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0))
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
            s = s + m.to(tl.float32)
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
    q_ptr, k_ptr, mask_ptr, rows_ptr, max_ptr, sum_ptr,
    start, n_rows, n_keys, heads, groups, head_dim, scaling, softcap,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_mb, stride_mh, stride_mq, stride_mk, stride_rb,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    MASK: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr, ROWS: tl.constexpr, PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Row maximum and sum of exponentials of one head's scores, rows of a BLOCK_M tile, over
    all keys: (B, H, R) each, for grid (row tiles, B * H)."""
    bh = tl.program_id(1).to(tl.int64)  # 64-bit offsets: a (B, n, n) map passes 2^31 numbers at B n^2
    b, h = bh // heads, bh % heads
    rows, row_ok = _row_positions(rows_ptr, start, b, tl.program_id(0), n_rows, stride_rb, BLOCK_M, ROWS)
    hi = n_keys
    if CAUSAL:  # keys after the tile's last row are never seen
        hi = tl.minimum(n_keys, tl.max(tl.where(row_ok, rows, 0), 0) + 1)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    for first in range(0, hi, BLOCK_N):
        keys = first + tl.arange(0, BLOCK_N)
        s = _scores(
            q_ptr, k_ptr, mask_ptr, b, h, h // groups, rows, keys, row_ok, n_keys,
            stride_qb, stride_qh, stride_qn, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
            stride_mb, stride_mh, stride_mq, stride_mk, head_dim, scaling, softcap,
            BLOCK_D, MASK, CAUSAL, SOFTCAP, PRECISION, UPCAST,
        )
        m_new = tl.maximum(m_i, tl.max(s, 1))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing allowed yet
        l_i = l_i * tl.exp(m_i - shift) + tl.sum(tl.exp(s - shift[:, None]), 1)
        m_i = m_new
    offset = (b * heads + h) * n_rows + tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    tl.store(max_ptr + offset, m_i, mask=row_ok)
    tl.store(sum_ptr + offset, l_i, mask=row_ok)


@triton.jit
def _fused_probabilities(
    q_ptr, k_ptr, mask_ptr, rows_ptr, max_ptr, sum_ptr, out_ptr, dout_ptr, v_ptr,
    start, n_rows, n_keys, heads, groups, head_dim, scaling, softcap,
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
    keys = key_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    if FUSION == 2:
        fused = tl.full((BLOCK_M, BLOCK_N), float("inf"), tl.float32)
    else:
        fused = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    seen = True
    if CAUSAL:  # a tile wholly after the rows' positions is 0 for every head
        seen = key_tile * BLOCK_N <= tl.max(tl.where(row_ok, rows, 0), 0)
    if seen:
        dims = tl.arange(0, BLOCK_D)
        for h in range(0, heads):
            s = _scores(
                q_ptr, k_ptr, mask_ptr, b, h, h // groups, rows, keys, row_ok, n_keys,
                stride_qb, stride_qh, stride_qn, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
                stride_mb, stride_mh, stride_mq, stride_mk, head_dim, scaling, softcap,
                BLOCK_D, MASK, CAUSAL, SOFTCAP, PRECISION, UPCAST,
            )
            offset = (b * heads + h) * n_rows + row_tile * BLOCK_M + tl.arange(0, BLOCK_M)
            m_i = tl.load(max_ptr + offset, mask=row_ok, other=0.0)
            l_i = tl.load(sum_ptr + offset, mask=row_ok, other=0.0)
            shift = tl.where(m_i == float("-inf"), 0.0, m_i)
            # a row without any allowed key (l = 0) is 0
            p = tl.exp(s - shift[:, None]) / tl.where(l_i > 0, l_i, 1.0)[:, None]
            if GRADIENT:  # (P_h * dO_h V_h^T)^+
                g = tl.load(
                    dout_ptr + b * stride_gb + h * stride_gh + rows[:, None] * stride_gn + dims[None, :] * stride_gd,
                    mask=row_ok[:, None] & (dims[None, :] < head_dim), other=0.0,
                )
                v = tl.load(
                    v_ptr + b * stride_vb + (h // groups) * stride_vh + keys[None, :] * stride_vn
                    + dims[:, None] * stride_vd,
                    mask=(keys[None, :] < n_keys) & (dims[:, None] < head_dim), other=0.0,
                )
                g = g.to(v.dtype)
                if UPCAST:
                    g, v = g.to(tl.float32), v.to(tl.float32)
                p = tl.maximum(p * tl.dot(g, v, input_precision=PRECISION, out_dtype=tl.float32), 0.0)
            if FUSION == 0:
                fused += p
            elif FUSION == 1:
                fused = tl.maximum(fused, p)
            else:
                fused = tl.minimum(fused, p)
        if FUSION == 0:
            fused = fused / heads
    else:
        fused = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    index = row_tile.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)  # the rows' places in ``out``
    tl.store(
        out_ptr + b * stride_ob + index[:, None] * stride_or + keys[None, :] * stride_ok,
        fused, mask=row_ok[:, None] & (keys[None, :] < n_keys),
    )


def _strides(tensor: Tensor | None, dims: int) -> tuple[int, ...]:
    return (0,) * dims if tensor is None else tuple(tensor.stride())


def fused_probabilities(
    query: Tensor,
    key: Tensor,
    mask: Tensor | None,
    scaling: float,
    causal: bool,
    head_fusion: str,
    out: Tensor,
    start: int = 0,
    rows: Tensor | None = None,
    gradient: tuple[Tensor, Tensor] | None = None,
    softcap: float | None = None,
) -> Tensor:
    """Head-fused probabilities of query rows into ``out`` (B, R, w) float32, over the first w keys.

    Args:
        query: (B, H, n, d) queries, key: (B, H_kv, n_k, d) keys (grouped-query heads: query
            head h reads key head h // (H / H_kv)), both in the model's dtype.
        mask: None or transformers' 4-D mask, bool (True = attend) or additive, any shape
            broadcastable to (B, 1 or H, n, n_k).
        scaling: :math:`s`; ``causal``: no query sees a later key (key j is allowed for query i
            only if j <= i, besides the mask, which then allows no more): the key tiles after a
            tile's last row are skipped.
        head_fusion: ``"mean"``, ``"max"`` or ``"min"``.
        out: (B, R, w) float32, any strides (a view into a larger (B, n, n) map).
        start: the rows are ``start .. start + R``, or ``rows`` (B, R) positions if given.
        gradient: ``(grad_output (B, H, n, d), value (B, H_kv, n_k, d))``: the probabilities
            weighted by :math:`(P_h \\odot \\nabla O_h V_h^\\top)^+` before fusion.
        softcap: :math:`c` of soft-capped scores, or None.

    Returns:
        Tensor: ``out``.
    """
    if query.dtype not in _TILE_DTYPES:  # float64: computed in float32, as the torch path computes it
        query, key = query.float(), key.float()
        gradient = None if gradient is None else (gradient[0].float(), gradient[1].float())
    batch, heads, n, head_dim = query.shape
    count, width = out.shape[1], out.shape[2]
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_m, block_n = _TILE if block_d <= 64 else (_TILE[0] // 2, _TILE[1])  # rows, keys: on chip with d
    kind = _NO_MASK if mask is None else _BOOL_MASK if mask.dtype == torch.bool else _ADDITIVE_MASK
    if mask is not None:
        mask = mask.expand(batch, mask.shape[1], n, mask.shape[-1])
        if mask.shape[1] == 1:
            mask = mask.expand(batch, heads, n, mask.shape[-1])
    precision = "tf32" if query.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 else "ieee"
    row_max = torch.empty(batch, heads, count, dtype=torch.float32, device=query.device)
    row_sum = torch.empty_like(row_max)
    common = dict(
        start=start, n_rows=count, n_keys=width, heads=heads, groups=heads // key.shape[1], head_dim=head_dim,
        scaling=float(scaling), softcap=float(softcap or 1.0),
    )
    strides = (*query.stride(), *key.stride(), *_strides(mask, 4), 0 if rows is None else rows.stride(0))
    flags = dict(
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, MASK=kind, CAUSAL=causal,
        SOFTCAP=softcap is not None, ROWS=rows is not None, PRECISION=precision,
        # Triton's interpreter (CPU tensors) multiplies bfloat16 tiles wrongly: there the tiles are
        # made float32 first, which gives the same products (those of two bfloat16 numbers are exact).
        UPCAST=query.device.type == "cpu",
    )
    mask_arg = query if mask is None else mask  # an unread pointer where there is no mask
    rows_arg = query if rows is None else rows
    row_tiles = triton.cdiv(count, block_m)
    _row_statistics[(row_tiles, batch * heads)](
        query, key, mask_arg, rows_arg, row_max, row_sum, **common, **_named(strides, _STAT_STRIDES), **flags
    )
    grad_output, value = gradient if gradient is not None else (query, key)
    _fused_probabilities[(triton.cdiv(width, block_n), row_tiles, batch)](
        query, key, mask_arg, rows_arg, row_max, row_sum, out, grad_output, value, **common,
        **_named(strides, _STAT_STRIDES), **_named((*out.stride(), *grad_output.stride(), *value.stride()), _OUT_STRIDES),
        **flags, FUSION=_FUSIONS[head_fusion], GRADIENT=gradient is not None,
    )
    return out


_STAT_STRIDES = (
    "stride_qb", "stride_qh", "stride_qn", "stride_qd", "stride_kb", "stride_kh", "stride_kn", "stride_kd",
    "stride_mb", "stride_mh", "stride_mq", "stride_mk", "stride_rb",
)
_OUT_STRIDES = (
    "stride_ob", "stride_or", "stride_ok", "stride_gb", "stride_gh", "stride_gn", "stride_gd",
    "stride_vb", "stride_vh", "stride_vn", "stride_vd",
)


def _named(values: tuple[int, ...], names: tuple[str, ...]) -> dict[str, int]:
    return dict(zip(names, values, strict=True))
