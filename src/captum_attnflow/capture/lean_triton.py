"""Launching the Triton kernels of :mod:`captum_attnflow.capture.lean_triton_kernels`: the twin of
:func:`~captum_attnflow.capture.lean_blocks.fused_blocks` on a GPU, head-fused attention
probabilities computed tile by tile on chip (the maths and why are in that module's docstring).

On a GPU the tile sizes are timed once per kind of call (Triton's autotuner: a few seconds on a
first call); on CPU tensors the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` when
this module is imported) with the tiles of :data:`_TILE`, which is how the tests check them
against the torch path.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch
import triton
from torch import Tensor

from captum_attnflow.capture.lean_triton_kernels import _fused_probabilities, _fused_product, _row_statistics

_FUSIONS = {"mean": 0, "max": 1, "min": 2}
# Query rows and keys of a tile in the interpreter (on CPU tensors); on a GPU they are tuned.
_TILE = (64, 64)
_NO_MASK, _BOOL_MASK, _ADDITIVE_MASK = 0, 1, 2
# What the tiles multiply in the queries' own dtype; others (float64) are made float32 first.
_TILE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Row vectors one product kernel multiplies at once (the rows of a tl.dot: at least 16; more
# vectors walk the tiles again).
MAX_VECTORS = 64
# Programs per multiprocessor the product kernel's row chunks aim for (it has one per key tile
# otherwise: too few to hide memory latency on a large GPU).
_PROGRAMS_PER_SM = 4
# Rows of a chunk come in multiples of this (the largest tile).
_CHUNK_ROWS = 128


def _configs(tiles: tuple[tuple[int, int, int, int], ...]) -> list[triton.Config]:
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in tiles]


def _fitting(configs: list[triton.Config], named_args: dict[str, Any], **kwargs: Any) -> list[triton.Config]:
    """The configs whose query tile fits beside the others on chip, at most 128 x 64 numbers: 64
    rows for heads of 128; heads larger still (Gemma's 256) take the first config."""
    fitting = [c for c in configs if c.kwargs["BLOCK_M"] * kwargs["BLOCK_D"] <= 128 * 64]
    return fitting or configs[:1]


def _bench(kernel_call: Callable[[], Any], quantiles: Any) -> Any:
    """Time a config briefly: each kind of call is tuned once, and its first call waits for it."""
    return triton.testing.do_bench(kernel_call, warmup=5, rep=20, quantiles=quantiles)


# Triton's autotuner is not thread-safe (it stores a call's arguments on itself); launches
# are asynchronous, so holding this for one costs microseconds.
_TUNING = threading.Lock()
# Shorter calls take the default tiles: a few microseconds to gain, seconds of tuning to pay.
_TUNED_KEYS = 1024
# Timed on a GPU once per kind of call (these arguments and the tensors' dtypes), each kernel
# with the configs its loop structure suits: flash attention's shapes for the statistics, square
# tiles for the fused ones (every head is walked per tile).
_KEY = ["heads", "BLOCK_D", "keys_class", "MASK", "CAUSAL", "SOFTCAP", "GRADIENT"]
_TUNED = {
    _row_statistics: triton.autotune(
        _configs(((64, 64, 4, 2), (128, 64, 4, 2), (128, 64, 8, 3), (128, 128, 8, 2), (64, 128, 4, 3))),
        key=[k for k in _KEY if k != "GRADIENT"] + ["ROWS", "REAL"], prune_configs_by={"early_config_prune": _fitting},
        do_bench=_bench,
    )(_row_statistics),
    _fused_probabilities: triton.autotune(
        _configs(((64, 64, 4, 2), (128, 64, 8, 2), (64, 128, 8, 2), (128, 128, 8, 2), (64, 64, 4, 3), (128, 64, 4, 3))),
        key=[*_KEY, "FUSION", "ROWS"], prune_configs_by={"early_config_prune": _fitting}, do_bench=_bench,
    )(_fused_probabilities),
    _fused_product: triton.autotune(
        _configs(((64, 64, 4, 2), (128, 64, 8, 2), (64, 128, 8, 2), (128, 128, 8, 2), (64, 64, 4, 3))),
        key=[*_KEY, "BLOCK_C"], prune_configs_by={"early_config_prune": _fitting}, do_bench=_bench,
    )(_fused_product),
}


def _launch(kernel: triton.JITFunction, device: torch.device, grid: Callable[[dict], tuple], *args: Any, **kwargs: Any) -> None:
    """``kernel`` on ``device``: its tuned twin on a GPU for calls over at least
    :data:`_TUNED_KEYS` keys; else the tiles of :data:`_TILE` (the interpreter's on CPU
    tensors), halved rows for heads larger than 64."""
    if device.type != "cpu" and kwargs["n_keys"] >= _TUNED_KEYS:
        with _TUNING:  # the autotuner keeps each call's arguments on itself: one launch at a time
            _TUNED[kernel][grid](*args, **kwargs)
        return
    block_m, block_n = _TILE if kwargs["BLOCK_D"] <= 64 else (_TILE[0] // 2, _TILE[1])
    tiles = {"BLOCK_M": block_m, "BLOCK_N": block_n}
    kernel[grid(tiles)](*args, **kwargs, **tiles)


def _strides(tensor: Tensor | None, dims: int) -> tuple[int, ...]:
    return (0,) * dims if tensor is None else tuple(tensor.stride())


class _Call:
    """What the three kernels share of one attention call: its tensors, arguments, strides and
    flags, as the kernels take them."""

    def __init__(
        self, query: Tensor, key: Tensor, mask: Tensor | None, scaling: float, causal: bool,
        gradient: tuple[Tensor, Tensor] | None, softcap: float | None,
    ) -> None:
        if query.dtype not in _TILE_DTYPES:  # float64: computed in float32, as the torch path computes it
            query, key = query.float(), key.float()
            gradient = None if gradient is None else (gradient[0].float(), gradient[1].float())
        batch, heads, n, head_dim = query.shape
        kind = _NO_MASK if mask is None else _BOOL_MASK if mask.dtype == torch.bool else _ADDITIVE_MASK
        if mask is not None:
            mask = mask.expand(batch, mask.shape[1], n, mask.shape[-1])
            if mask.shape[1] == 1:
                mask = mask.expand(batch, heads, n, mask.shape[-1])
        self.query, self.key, self.batch, self.heads = query, key, batch, heads
        self.mask = query if mask is None else mask  # an unread pointer where there is no mask
        self.gradient = gradient if gradient is not None else (query, key)  # unread without GRADIENT
        self.device = query.device
        self.weighted = gradient is not None
        block_d = max(16, triton.next_power_of_2(head_dim))
        # float32 queries: three TF32 products (float32's accuracy), one where torch allows TF32
        precision = "tf32" if query.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 else "tf32x3"
        self.common = dict(
            heads=heads, groups=heads // key.shape[1], head_dim=head_dim, scaling=float(scaling),
            softcap=float(softcap or 1.0), keys_class=min(8, max(0, key.shape[2].bit_length() - 8)),
        )
        self.strides = dict(zip(
            ("stride_qb", "stride_qh", "stride_qn", "stride_qd", "stride_kb", "stride_kh", "stride_kn", "stride_kd",
             "stride_mb", "stride_mh", "stride_mq", "stride_mk"),
            (*query.stride(), *key.stride(), *_strides(mask, 4)), strict=True,
        ))
        self.gradient_strides = dict(zip(
            ("stride_gb", "stride_gh", "stride_gn", "stride_gd", "stride_vb", "stride_vh", "stride_vn", "stride_vd"),
            (*self.gradient[0].stride(), *self.gradient[1].stride()), strict=True,
        ))
        self.flags = dict(
            BLOCK_D=block_d, MASK=kind, CAUSAL=causal, SOFTCAP=softcap is not None,
            PRECISION="ieee" if query.device.type == "cpu" else precision,
            # Triton's interpreter (CPU tensors) multiplies bfloat16 tiles wrongly: there the tiles are
            # made float32 first, which gives the same products (those of two bfloat16 numbers are exact).
            UPCAST=query.device.type == "cpu",
        )

    def statistics(
        self, count: int, width: int, start: int = 0, rows: Tensor | None = None, real_keys: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Each head's row maximum and inverse sum of ``count`` rows (``start ...`` or ``rows``)
        over the first ``width`` keys, (2, B, H, count) float32, and with ``real_keys``
        (B, width) the share of each row's probability on those keys (B, H, count), else None."""
        statistics = torch.empty(2, self.batch, self.heads, count, dtype=torch.float32, device=self.device)
        real = torch.empty_like(statistics[0]) if real_keys is not None else None
        _launch(
            _row_statistics, self.device, lambda meta: (triton.cdiv(count, meta["BLOCK_M"]), self.batch * self.heads),
            self.query, self.key, self.mask, self.query if rows is None else rows, *statistics,
            self.query if real is None else real, self.query if real_keys is None else real_keys,
            start=start, n_rows=count, n_keys=width, **self.common, **self.strides,
            stride_rb=0 if rows is None else rows.stride(0), stride_real_b=0 if real_keys is None else real_keys.stride(0),
            **self.flags, ROWS=rows is not None, REAL=real_keys is not None,
        )
        return statistics, real


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
    call = _Call(query, key, mask, scaling, causal, gradient, softcap)
    count, width = out.shape[1], out.shape[2]
    statistics, _ = call.statistics(count, width, start, rows)
    _launch(
        _fused_probabilities, call.device,
        lambda meta: (triton.cdiv(width, meta["BLOCK_N"]), triton.cdiv(count, meta["BLOCK_M"]), call.batch),
        call.query, call.key, call.mask, call.query if rows is None else rows, *statistics, out, *call.gradient,
        start=start, n_rows=count, n_keys=width, **call.common, **call.strides,
        stride_rb=0 if rows is None else rows.stride(0),
        **dict(zip(("stride_ob", "stride_or", "stride_ok"), out.stride(), strict=True)), **call.gradient_strides,
        **call.flags, ROWS=rows is not None, FUSION=_FUSIONS[head_fusion], GRADIENT=gradient is not None,
    )
    return out


class RowProduct:
    """One attention call's head-mean probabilities :math:`W` (rows 0..R over the first w keys,
    optionally gradient-weighted) ready to multiply row vectors, never written out: the row
    statistics are computed once (:func:`row_product`), each product walks the tiles again.

    Attributes:
        real_sums: (B, R) :math:`\\sum_{j \\text{ real}} W_{ij}`, the head-mean probability on the
            keys ``real_keys`` marked (gradient weighting: None).
    """

    def __init__(self, call: _Call, count: int, width: int, real_keys: Tensor | None, real_sums: bool = False) -> None:
        """``real_keys`` (B, w) int8, or ``real_sums``: every key is real (no pass over them needed)."""
        self._call, self._count, self._width = call, count, width
        self._statistics, real = call.statistics(count, width, real_keys=real_keys)
        if real is not None:
            self.real_sums = real.mean(1)
        else:  # rows with a key (inverse sum > 0) put all of their probability on real keys
            self.real_sums = (self._statistics[1] > 0).float().mean(1) if real_sums else None

    def __call__(self, vectors: Tensor) -> Tensor:
        """``vectors`` (B, C, R) float32 times :math:`W`: (B, C, w) float32; the tiles are walked
        once for every :data:`MAX_VECTORS` vectors."""
        if vectors.shape[1] > MAX_VECTORS:
            return torch.cat([self(part) for part in vectors.split(MAX_VECTORS, 1)], 1)
        call, count, width = self._call, self._count, self._width
        batch, n_vectors = vectors.shape[0], vectors.shape[1]
        block_c = max(16, triton.next_power_of_2(n_vectors))
        # Enough programs to fill the device (one per key tile is too few): the rows in chunks of
        # whole tiles, whose partial products are summed after.
        units = 1 if call.device.type == "cpu" else torch.cuda.get_device_properties(call.device).multi_processor_count
        wanted = triton.cdiv(_PROGRAMS_PER_SM * units, triton.cdiv(width, _CHUNK_ROWS) * batch)
        chunk_rows = triton.cdiv(triton.cdiv(count, max(1, wanted)), _CHUNK_ROWS) * _CHUNK_ROWS
        chunks = triton.cdiv(count, chunk_rows)
        parts = torch.empty(chunks, batch, n_vectors, width, dtype=torch.float32, device=call.device)
        _launch(
            _fused_product, call.device, lambda meta: (triton.cdiv(width, meta["BLOCK_N"]), chunks, batch),
            call.query, call.key, call.mask, *self._statistics, vectors, parts, *call.gradient,
            n_rows=count, n_keys=width, **call.common, n_vectors=n_vectors, chunk_rows=chunk_rows, **call.strides,
            **dict(zip(("stride_ub", "stride_uc", "stride_un"), vectors.stride(), strict=True)),
            **dict(zip(("stride_pk", "stride_pb", "stride_pc", "stride_pn"), parts.stride(), strict=True)),
            **call.gradient_strides, **call.flags, BLOCK_C=block_c, GRADIENT=call.weighted,
            # float32 vectors by float32 probabilities: three TF32 products (float32's accuracy)
            PRODUCT_PRECISION="ieee" if call.device.type == "cpu" else "tf32x3",
        )
        return parts[0] if chunks == 1 else parts.sum(0)


def row_product(
    query: Tensor,
    key: Tensor,
    mask: Tensor | None,
    scaling: float,
    causal: bool,
    count: int,
    real_keys: Tensor | None = None,
    gradient: tuple[Tensor, Tensor] | None = None,
    softcap: float | None = None,
) -> RowProduct:
    """The :class:`RowProduct` of the first ``count`` query rows over all keys; arguments as
    in :func:`fused_probabilities` (heads fused by their mean). ``real_keys``: (B, n_k) bool,
    the keys whose probability :attr:`RowProduct.real_sums` adds up (not with ``gradient``)."""
    call = _Call(query, key, mask, scaling, causal, gradient, softcap)
    if real_keys is None or bool(real_keys.all()):  # every key real: a row's sum is 1, or 0 without any key
        return RowProduct(call, count, key.shape[2], None, real_sums=real_keys is not None)
    return RowProduct(call, count, key.shape[2], real_keys.to(torch.int8))
