"""Token-to-token contributions that look inside the attention block: ALTI (Ferrando, Gállego &
Costa-jussà, EMNLP 2022), the norm of the weighted value vectors (Kobayashi, Kuribayashi, Yokoi &
Inui, EMNLP 2020) and value zeroing (Mohebbi, Zuidema, Chrupała & Alishahi, EACL 2023).

All work on one layer's internals in the transformers layout: attention probabilities
(B, H, n, n) (row = query), value vectors (B, H, n, d) after the value projection (its bias
included), and the output projection :math:`W_O` (H d, D) with :math:`y = x W_O + b_O`. Each
head's value vector of token j, projected, is :math:`f^h(x_j) = v^h_j W^h_O` (D,); the attention
output of token i is :math:`\\sum_j \\sum_h \\alpha^h_{ij} f^h(x_j) + b_O`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Union

import numpy as np
import torch
from torch import Tensor

from captum_attnflow.functional.compiled import njit_on_first_call
from captum_attnflow.functional.kernels import gpu_kernels

# Row blocks of the (B, rows, n, D) transformed vectors hold about this many numbers.
_BLOCK_NUMBERS = 2**23
# The GPU twins of the kernels here.
_TRITON = "captum_attnflow.functional.decomposition_triton"

# A layer's per-head probabilities: the whole (B, H, n, n) tensor, or its blocks of query rows as
# ``(start, block)`` pairs, ``block`` (B, H, r, n) the rows start..start + r, in order, each read
# once before the next is asked for (a lean capture's recomputed rows: capture/lean_heads.py).
Probabilities = Union[Tensor, Iterable[tuple[int, Tensor]]]


def _blocks(probabilities: Probabilities) -> Iterable[tuple[int, Tensor]]:
    return [(0, probabilities)] if isinstance(probabilities, Tensor) else probabilities


def projected_values(values: Tensor, output_weight: Tensor) -> Tensor:
    """(B, H, n, D) :math:`f^h(x_j) = v^h_j W^h_O`: each head's values (B, H, n, d) through its
    slice (d, D) of the output projection ``output_weight`` (H d, D)."""
    batch, heads, n, size = values.shape
    return torch.einsum("bhjd,hdk->bhjk", values.float(), output_weight.float().reshape(heads, size, -1))


def transformed_vectors(probabilities: Tensor, projected: Tensor, rows: slice) -> Tensor:
    """(B, r, n, D) :math:`\\sum_h \\alpha^h_{ij} f^h(x_j)` for the query rows ``rows`` (r of
    them) and every token j: token j's share of token i's attention output."""
    weights = probabilities[:, :, rows].float().permute(0, 3, 2, 1)  # (B, n_j, r, H)
    shares = torch.matmul(weights, projected.transpose(1, 2))  # (B, n_j, r, H) @ (B, n_j, H, D)
    return shares.transpose(1, 2)


def _row_blocks(batch: int, n: int, size: int, count: int | None = None) -> list[slice]:
    """Slices of ``count`` query rows (n if None) whose (B, rows, n, D) transformed vectors hold about _BLOCK_NUMBERS."""
    count = n if count is None else count
    step = max(1, _BLOCK_NUMBERS // max(1, batch * n * size))
    return [slice(start, min(count, start + step)) for start in range(0, count, step)]


def attention_norms(
    probabilities: Probabilities,
    values: Tensor,
    output_weight: Tensor,
    attention_mask: Tensor,
    key_mask: Tensor | None = None,
) -> Tensor:
    """Kobayashi et al.'s norm-based weights, (B, n, n): :math:`\\lVert \\sum_h \\alpha^h_{ij} f^h(x_j) \\rVert_2`,
    the length of what token j adds to token i's attention output; padding rows and columns 0.

    ``probabilities``: (B, H, n, n), or its blocks of rows (see :data:`Probabilities`), each
    block's rows computed as it comes; ``values`` (B, H, n, d), ``output_weight`` (H d, D),
    ``attention_mask`` (B, n) bool. A cross-attention's queries are not its keys: probabilities
    (B, H, m, n) of m queries over n keys, ``attention_mask`` (B, m) the queries' and ``key_mask``
    (B, n) the keys' (None: the keys are the queries), give (B, m, n).

    The vectors are never formed: their squared length is a quadratic form in the heads'
    weights, :math:`\\lVert \\sum_h \\alpha^h_{ij} f^h(x_j) \\rVert^2 = \\alpha_{ij}^\\top G_j \\alpha_{ij}`
    with :math:`G_j = (f^h(x_j) \\cdot f^{h'}(x_j))_{h h'}` the (H, H) Gram matrix of token j's
    projected values, H² multiply-adds a pair instead of H·D.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional.decomposition import attention_norms
        >>> probabilities = torch.softmax(torch.randn(1, 2, 3, 3), -1)  # (B, H, n, n)
        >>> values, weight = torch.randn(1, 2, 3, 4), torch.randn(8, 5)  # (B, H, n, d), (H d, D)
        >>> norms = attention_norms(probabilities, values, weight, torch.ones(1, 3, dtype=torch.bool))
        >>> vector = sum(probabilities[0, h, 0, 2] * values[0, h, 2] @ weight[4 * h:4 * h + 4] for h in range(2))
        >>> torch.allclose(norms[0, 0, 2], vector.norm())
        True
    """
    projected = projected_values(values, output_weight)
    batch, heads, n, _ = projected.shape
    key_mask = attention_mask if key_mask is None else key_mask
    gram = torch.einsum("bhjk,bgjk->bjhg", projected, projected).reshape(batch * n, heads, heads)  # (B n, H, H)
    norms = torch.empty(batch, attention_mask.shape[1], n, dtype=torch.float32, device=projected.device)
    for start, block in _blocks(probabilities):
        count = block.shape[2]
        # one (r, H) x (H, H) product per token j: a copy with the heads last, then one batched product
        weights = block.float().permute(0, 3, 2, 1).reshape(batch * n, count, heads)
        squares = torch.bmm(weights, gram).mul_(weights).sum(-1).view(batch, n, count)
        # rounding can take a length of 0 (a token nobody attends) a hair below 0
        norms[:, start : start + count] = squares.clamp(min=0).sqrt().transpose(1, 2)
    return norms * (attention_mask[:, :, None] & key_mask[:, None, :])


def alti_contributions(
    probabilities: Probabilities,
    values: Tensor,
    inputs: Tensor,
    output_weight: Tensor,
    output_bias: Tensor | None,
    attention_mask: Tensor,
    norm: tuple[Tensor, Tensor, float] | None = None,
    attention_scale: Tensor | None = None,
) -> Tensor:
    """ALTI's contributions of one attention block, (B, n, n), rows normalised over real tokens.

    The block's output for token i, residual included, is decomposed into one vector per input
    token, :math:`T_i(x_j) = \\sum_h \\alpha^h_{ij} f^h(x_j) + \\delta_{ij} x_i`, plus what
    belongs to no token (:math:`b_O`, and the norm's shift :math:`\\beta`). Pre-LN blocks
    (``norm=None``): the block's output is :math:`y_i = x_i + \\sum_j \\sum_h \\alpha^h_{ij} f^h(x_j) + b_O`.
    Post-LN blocks (``norm=(gamma, beta, eps)``): :math:`y_i = \\operatorname{LN}(\\ldots)`, and
    the LayerNorm is linearised with token i's own statistics,
    :math:`T_i(x_j) \\mapsto \\gamma \\odot (T_i(x_j) - \\mu(T_i(x_j))) / \\sigma_i`, :math:`\\sigma_i`
    the standard deviation (with eps) of the whole pre-norm vector of token i; the transformed
    vectors then sum to :math:`y_i` minus the terms of no token. Blocks that scale the attention's
    output before the residual (``attention_scale`` :math:`s`: Gemma's and OLMo 2's RMS norms
    linearised with token i's own statistics, DINOv2's layer scale):
    :math:`y_i = x_i + s_i \\odot (\\sum_j \\sum_h \\alpha^h_{ij} f^h(x_j) + b_O)` and
    :math:`T_i(x_j) = s_i \\odot \\sum_h \\alpha^h_{ij} f^h(x_j) + \\delta_{ij} x_i`. Then (paper, equation 9)

    .. math::
        c_{ij} = \\frac{\\max(0, \\lVert y_i \\rVert_1 - \\lVert y_i - T_i(x_j) \\rVert_1)}
                      {\\sum_k \\max(0, \\lVert y_i \\rVert_1 - \\lVert y_i - T_i(x_k) \\rVert_1)}.

    Args:
        probabilities: (B, H, n, n) attention probabilities, or their blocks of rows (see
            :data:`Probabilities`): every quantity of row i is computed from row i alone, block
            by block, so the whole (B, H, n, n) tensor need never exist.
        values: (B, H, n, d) value vectors, value bias included.
        inputs: (B, n, D) the block's input :math:`x` (the residual stream).
        output_weight, output_bias: :math:`W_O` (H d, D) and :math:`b_O` (D,) or None.
        attention_mask: (B, n) bool, True on real tokens.
        norm: ``(gamma (D,), beta (D,), eps)`` of the LayerNorm after the residual (post-LN), or None.
        attention_scale: (B, n, D) :math:`s_i`, the factor on token i's attention output before
            the residual, or None (not with ``norm``).

    Returns:
        float32 (B, n, n), row i the contributions to token i; rows of real tokens sum to 1,
        padding rows and columns are 0.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional.decomposition import alti_contributions
        >>> probabilities = torch.softmax(torch.randn(1, 2, 3, 3), -1)
        >>> values, inputs, weight = torch.randn(1, 2, 3, 4), torch.randn(1, 3, 8), torch.randn(8, 8)
        >>> mask = torch.ones(1, 3, dtype=torch.bool)
        >>> contributions = alti_contributions(probabilities, values, inputs, weight, None, mask)
        >>> torch.allclose(contributions.sum(-1), torch.ones(1, 3))
        True
    """
    if attention_scale is not None and norm is not None:
        raise ValueError("alti_contributions takes a LayerNorm after the residual or a scale before it, not both.")
    projected = projected_values(values, output_weight)
    batch, _, n, _ = projected.shape
    inputs, values, output_weight = inputs.float(), values.float(), output_weight.float()
    contributions = torch.empty(batch, n, n, dtype=torch.float32, device=projected.device)
    for start, block in _blocks(probabilities):
        rows = slice(start, start + block.shape[2])
        heads_out = (block.float() @ values).transpose(1, 2).reshape(batch, block.shape[2], -1)  # (B, r, H d)
        attention = heads_out @ output_weight
        if output_bias is not None:
            attention = attention + output_bias.float()
        block_scale = None if attention_scale is None else attention_scale[:, rows].float()
        if block_scale is not None:
            attention = attention * block_scale
        pre_norm = inputs[:, rows] + attention
        if norm is None:
            outputs, scale = pre_norm, None
        else:
            gamma, beta, eps = norm
            deviation = (pre_norm.var(-1, unbiased=False, keepdim=True) + eps).sqrt()  # (B, r, 1)
            outputs = (pre_norm - pre_norm.mean(-1, keepdim=True)) / deviation * gamma.float() + beta.float()
            scale = gamma.float() / deviation  # (B, r, D)
        distances = _distances_where_they_are(block, projected, inputs[:, rows], outputs, scale, block_scale, start)
        shares = (outputs.abs().sum(-1)[:, :, None] - distances).clamp(min=0)
        contributions[:, rows] = normalised_rows(shares, attention_mask, start)
    return contributions



def alti_cross_contributions(
    probabilities: Probabilities,
    values: Tensor,
    inputs: Tensor,
    output_weight: Tensor,
    output_bias: Tensor | None,
    attention_mask: Tensor,
    key_mask: Tensor,
    norm: tuple[Tensor, Tensor, float] | None = None,
) -> Tensor:
    """ALTI+'s contributions of a decoder's cross-attention block (Ferrando, Gállego, Tsiamas &
    Costa-jussà, EMNLP 2022, "Towards opening the black box of neural machine translation",
    section 3), (B, m, n + 1): the n encoder outputs, then the residual, rows normalised.

    Decoder position t's query reads the encoder's outputs :math:`e_j`; its block output, residual
    included, is decomposed as in :func:`alti_contributions` with the residual
    :math:`x_t` (the cross-attention's input stream) as one more vector:
    :math:`T_t(e_j) = \\sum_h \\alpha^h_{tj} f^h(e_j)` and :math:`T_t(x_t) = x_t`, summing to
    :math:`y_t = x_t + \\sum_j T_t(e_j) + b_O` (post-LN, ``norm`` given: each linearised with
    token t's own statistics, as there). Then
    :math:`c_{tj} \\propto \\max(0, \\lVert y_t \\rVert_1 - \\lVert y_t - T_t(\\cdot) \\rVert_1)`
    over the real encoder outputs and the residual.

    Args:
        probabilities: (B, H, m, n), decoder queries over encoder keys, or their blocks of rows
            (see :data:`Probabilities`).
        values: (B, H, n, d) the encoder outputs' value vectors, value bias included.
        inputs: (B, m, D) the residual stream :math:`x` entering the cross-attention block.
        output_weight, output_bias: :math:`W_O` (H d, D) and :math:`b_O` (D,) or None.
        attention_mask: (B, m) bool, the real decoder positions; ``key_mask`` (B, n) bool, the
            real encoder outputs.
        norm: ``(gamma, beta, eps)`` of the LayerNorm after the residual (post-LN), or None.

    Returns:
        float32 (B, m, n + 1): row t over the encoder outputs, then its residual; rows of real
        positions sum to 1 (a row with nothing left keeps its residual whole), padding rows 0.

    Example::

        >>> import torch
        >>> from captum_attnflow.functional.decomposition import alti_cross_contributions
        >>> probabilities = torch.softmax(torch.randn(1, 2, 3, 4), -1)  # 3 decoder queries, 4 encoder keys
        >>> values, inputs, weight = torch.randn(1, 2, 4, 4), torch.randn(1, 3, 8), torch.randn(8, 8)
        >>> shares = alti_cross_contributions(probabilities, values, inputs, weight, None,
        ...                                   torch.ones(1, 3, dtype=torch.bool), torch.ones(1, 4, dtype=torch.bool))
        >>> shares.shape, torch.allclose(shares.sum(-1), torch.ones(1, 3))
        (torch.Size([1, 3, 5]), True)
    """
    projected = projected_values(values, output_weight)
    batch, _, n, _ = projected.shape
    inputs, values, output_weight = inputs.float(), values.float(), output_weight.float()
    contributions = torch.empty(batch, inputs.shape[1], n + 1, dtype=torch.float32, device=projected.device)
    columns = torch.cat([key_mask.bool(), key_mask.new_ones(batch, 1, dtype=torch.bool)], 1)
    for start, block in _blocks(probabilities):
        rows = slice(start, start + block.shape[2])
        residual = inputs[:, rows]
        attention = (block.float() @ values).transpose(1, 2).reshape(batch, block.shape[2], -1) @ output_weight
        if output_bias is not None:
            attention = attention + output_bias.float()
        pre_norm = residual + attention
        if norm is None:
            outputs, scale, own = pre_norm, None, residual
        else:
            gamma, beta, eps = norm
            deviation = (pre_norm.var(-1, unbiased=False, keepdim=True) + eps).sqrt()
            outputs = (pre_norm - pre_norm.mean(-1, keepdim=True)) / deviation * gamma.float() + beta.float()
            scale = gamma.float() / deviation
            own = (residual - residual.mean(-1, keepdim=True)) * scale
        # a row offset of n: no encoder output is the query's own token
        distances = _distances_where_they_are(block, projected, residual, outputs, scale, None, n)
        distances = torch.cat([distances, (outputs - own).abs().sum(-1, keepdim=True)], -1)
        shares = (outputs.abs().sum(-1, keepdim=True) - distances).clamp(min=0) * columns[:, None]
        sums = shares.sum(-1, keepdim=True)
        shares[..., -1:] += sums == 0  # nothing left: the residual keeps the position whole
        real = attention_mask[:, rows, None].bool()
        contributions[:, rows] = shares / torch.where(sums > 0, sums, torch.ones_like(sums)) * real
    return contributions

def _distances_where_they_are(
    probabilities: Tensor,
    projected: Tensor,
    inputs: Tensor,
    outputs: Tensor,
    scale: Tensor | None,
    attention_scale: Tensor | None,
    row_offset: int = 0,
) -> Tensor:
    """(B, r, n) :math:`\\lVert y_i - T_i(x_j) \\rVert_1` of a block of r query rows, the first
    one ``row_offset`` (``probabilities`` (B, H, r, n), ``inputs``, ``outputs``, ``scale`` and
    ``attention_scale`` (B, r, D) those rows'), by device: the numba kernel on the CPU,
    the Triton kernel where it runs (:func:`~captum_attnflow.functional.kernels.gpu_kernels`),
    both without writing the transformed vectors; else, under autograd and for a scaled
    attention output (``attention_scale``), torch operations in row blocks."""
    if not probabilities.requires_grad and attention_scale is None:
        if inputs.device.type == "cpu":
            return _compiled_distances(probabilities, projected, inputs, outputs, scale, row_offset)
        kernels = gpu_kernels(inputs.device, _TRITON)
        if kernels is not None:
            return kernels.alti_distances(probabilities, projected, inputs, outputs, scale, row_offset)
    batch, _, n, size = projected.shape
    return torch.cat(
        [_distances(probabilities, projected, inputs, outputs, scale, rows, attention_scale, row_offset)
         for rows in _row_blocks(batch, n, size, probabilities.shape[2])], 1
    )


def _distances(
    probabilities: Tensor, projected: Tensor, inputs: Tensor, outputs: Tensor, scale: Tensor | None, rows: slice,
    attention_scale: Tensor | None = None, row_offset: int = 0,
) -> Tensor:
    """(B, r, n) :math:`\\lVert y_i - T_i(x_j) \\rVert_1` for the rows ``rows`` of ``probabilities``
    (and of ``inputs``, ``outputs``, ``scale``, ``attention_scale``), whose first row is query
    ``row_offset``, in torch ops; +inf where i != j and no head attends (see :func:`_compiled_distances`)."""
    vectors = transformed_vectors(probabilities, projected, rows)  # (B, r, n, D)
    if attention_scale is not None:
        vectors = vectors * attention_scale[:, rows, None]
    local = torch.arange(rows.stop - rows.start, device=inputs.device)
    own = local + rows.start + row_offset  # the query's own token; none past the last key (a cross-attention)
    inside = own < vectors.shape[2]
    local, own = local[inside], own[inside]
    vectors[:, local, own] += inputs[:, rows][:, inside]
    if scale is not None:
        vectors = (vectors - vectors.mean(-1, keepdim=True)) * scale[:, rows, None]
    distances = (outputs[:, rows, None] - vectors).abs().sum(-1)
    attended = probabilities[:, :, rows].ne(0).any(1)
    attended[:, local, own] = True
    return distances.masked_fill(~attended, float("inf"))


def _compiled_distances(
    probabilities: Tensor, projected: Tensor, inputs: Tensor, outputs: Tensor, scale: Tensor | None,
    row_offset: int = 0,
) -> Tensor:
    """(B, r, n) :math:`\\lVert y_i - T_i(x_j) \\rVert_1` of a block of r query rows, the first
    one ``row_offset`` (``probabilities`` (B, H, r, n); ``inputs``, ``outputs``, ``scale`` (B, r, D)),
    the same as :func:`_distances` on all its rows, in one compiled pass that never writes the
    (r, n, D) transformed vectors.

    Where i != j and no head attends (a causal or padding mask), :math:`T_i(x_j) = 0`: the
    distance is :math:`\\lVert y_i \\rVert_1` and the contribution 0, but computed it would be the
    rounding of two sums of :math:`|y_i|`. Those pairs hold +inf instead, so their contribution is
    exactly 0 and a causal model stays causal; none of them is computed (half the work of a decoder).
    """
    batch, heads, n, size = projected.shape
    count = probabilities.shape[2]
    centred = scale is not None
    if scale is None:
        scale = torch.ones(1, 1, 1)
    out = np.empty((batch, count, n), dtype=np.float32)
    arrays = (
        probabilities.float().contiguous().numpy(),
        projected.contiguous().numpy(),
        inputs.contiguous().numpy(),
        outputs.contiguous().numpy(),
        scale.float().contiguous().numpy(),
        projected.mean(-1).contiguous().numpy(),
        inputs.mean(-1).contiguous().numpy(),
    )
    tasks = batch * -(-count // _ROWS_PER_TASK)
    parts = max(1, min(torch.get_num_threads(), tasks))
    bounds = [tasks * part // parts for part in range(parts + 1)]
    # Python threads running the kernel without the GIL, as the flow kernel does: numba's own
    # parallel loops would start an OpenMP pool beside torch's.
    with ThreadPoolExecutor(parts) as pool:
        list(pool.map(lambda part: _distances_kernel(*arrays, centred, row_offset, out, bounds[part], bounds[part + 1]), range(parts)))
    return torch.from_numpy(out)


# The transformed vectors T_i(x_j) hold n^2 D numbers a layer (800 MB for BERT-base at n = 512):
# written out, each pass over them (add the residual, centre, scale, subtract, absolute value, sum)
# runs at memory speed. Here the rows of a task take one token j at a time, two rows i at once:
# each pass of the innermost loop reads four heads' projected values f^h(x_j) once for both rows
# (8 multiply-adds for 4 loads), adds them into two D-sized sums that stay in the L1 cache, and the
# last pass takes the distance on the fly. The mean of T_i(x_j), which the linearised LayerNorm
# subtracts, is linear in the heads: sum_h alpha^h_ij mean(f^h(x_j)) (+ mean(x_i)), with no pass
# over the sums. One row and one head a pass would load and store a sum for every multiply-add;
# here a load of f^h(x_j) feeds two, and a sum is stored once per four heads. A BLAS product does
# not serve: the contraction is over H heads only (K = 12), and it would write the vectors out.
_ROWS_PER_TASK = 16


@njit_on_first_call(cache=True, nogil=True, fastmath=True)
def _distances_kernel(
    probabilities, projected, inputs, outputs, scale, projected_means, input_means, centred, row_offset, out,
    first_task, last_task,
):  # pragma: no cover
    # Rows are the block's (i, of probabilities, inputs, outputs, scale, out); the query's own
    # token, whose input T_i(x_i) adds, is j = row_offset + i.
    batch, heads, n, size = projected.shape
    count = probabilities.shape[2]
    blocks = (count + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK
    groups = (heads + 3) // 4
    weights = np.zeros((_ROWS_PER_TASK, 4 * groups), dtype=np.float32)  # heads past H weigh 0
    means = np.empty(_ROWS_PER_TASK, dtype=np.float32)
    attended = np.empty(_ROWS_PER_TASK, dtype=np.bool_)
    sum0 = np.empty(size, dtype=np.float32)
    sum1 = np.empty(size, dtype=np.float32)
    for task in range(first_task, last_task):
        b = task // blocks
        first = (task % blocks) * _ROWS_PER_TASK
        rows = min(count, first + _ROWS_PER_TASK) - first
        for j in range(n):
            any_attended = False
            for r in range(rows):
                i = first + r
                attended[r] = i + row_offset == j
                mean = np.float32(0.0)
                for h in range(heads):
                    weight = probabilities[b, h, i, j]
                    weights[r, h] = weight
                    attended[r] = attended[r] or weight != 0.0
                    mean += weight * projected_means[b, h, j]
                if i + row_offset == j:
                    mean += input_means[b, i]
                means[r] = mean
                any_attended = any_attended or attended[r]
            if not any_attended:
                for r in range(rows):
                    out[b, first + r, j] = np.inf
                continue
            for r0 in range(0, rows, 2):
                r1 = min(r0 + 1, rows - 1)  # an odd last row is computed twice
                for group in range(groups):
                    h0 = 4 * group
                    h1, h2, h3 = min(h0 + 1, heads - 1), min(h0 + 2, heads - 1), min(h0 + 3, heads - 1)
                    a0, a1, a2, a3 = weights[r0, h0], weights[r0, h0 + 1], weights[r0, h0 + 2], weights[r0, h0 + 3]
                    c0, c1, c2, c3 = weights[r1, h0], weights[r1, h0 + 1], weights[r1, h0 + 2], weights[r1, h0 + 3]
                    if group == 0:
                        for k in range(size):
                            f0, f1, f2, f3 = projected[b, h0, j, k], projected[b, h1, j, k], projected[b, h2, j, k], projected[b, h3, j, k]
                            sum0[k] = a0 * f0 + a1 * f1 + a2 * f2 + a3 * f3
                            sum1[k] = c0 * f0 + c1 * f1 + c2 * f2 + c3 * f3
                    else:
                        for k in range(size):
                            f0, f1, f2, f3 = projected[b, h0, j, k], projected[b, h1, j, k], projected[b, h2, j, k], projected[b, h3, j, k]
                            sum0[k] += a0 * f0 + a1 * f1 + a2 * f2 + a3 * f3
                            sum1[k] += c0 * f0 + c1 * f1 + c2 * f2 + c3 * f3
                i0, i1 = first + r0, first + r1
                if i0 + row_offset == j:
                    for k in range(size):
                        sum0[k] += inputs[b, i0, k]
                if i1 + row_offset == j:
                    for k in range(size):
                        sum1[k] += inputs[b, i1, k]
                total0 = np.float32(0.0)
                total1 = np.float32(0.0)
                if centred:
                    m0, m1 = means[r0], means[r1]
                    for k in range(size):
                        total0 += abs(outputs[b, i0, k] - (sum0[k] - m0) * scale[b, i0, k])
                        total1 += abs(outputs[b, i1, k] - (sum1[k] - m1) * scale[b, i1, k])
                else:
                    for k in range(size):
                        total0 += abs(outputs[b, i0, k] - sum0[k])
                        total1 += abs(outputs[b, i1, k] - sum1[k])
                out[b, i0, j] = total0 if attended[r0] else np.inf
                out[b, i1, j] = total1 if attended[r1] else np.inf


def zeroed_attention_outputs(probabilities: Tensor, projected: Tensor, attention_outputs: Tensor, tokens: Tensor) -> Tensor:
    """The attention layer's outputs with token j's value vectors zeroed in every head, for each
    j in ``tokens`` (J,): (B, J, n, D),
    :math:`o_i - \\sum_h \\alpha^h_{ij} f^h(x_j)` from the outputs ``attention_outputs`` (B, n, D)
    (after the output projection) and the projected values ``projected`` (B, H, n, D)
    (:func:`projected_values`). Attention and the output projection are linear in the values,
    so one pass gives every zeroing, without running the projection again."""
    removed = torch.einsum("bhij,bhjk->bjik", probabilities[:, :, :, tokens].float(), projected[:, :, tokens])
    return attention_outputs.float()[:, None] - removed


def cosine_distances(zeroed_outputs: Tensor, outputs: Tensor) -> Tensor:
    """(B, n, J) :math:`1 - \\cos(\\tilde x^{(j)}_i, x_i)` from outputs (B, n, D) and the outputs
    with token j zeroed (B, J, n, D).

    Computed as :math:`\\lVert \\hat a - \\hat b \\rVert^2 / 2` of the unit vectors: zeroing one
    token often turns the output by 1e-5 or less, where 1 - cos in float32 keeps no digit."""
    zeroed = torch.nn.functional.normalize(zeroed_outputs.float(), dim=-1)
    original = torch.nn.functional.normalize(outputs.float(), dim=-1)[:, None]
    return ((zeroed - original).square().sum(-1) / 2).transpose(1, 2)


def normalised_rows(scores: Tensor, attention_mask: Tensor, start: int = 0) -> Tensor:
    """(B, r, n) non-negative ``scores`` of the query rows start..start + r (all n by default)
    with padding rows and columns set to 0 and each real row divided by its sum; a real row with
    nothing left keeps its token whole (1 on the diagonal); ``attention_mask`` (B, n) bool."""
    count, n = scores.shape[-2:]
    rows = attention_mask[:, start : start + count, None]
    scores = scores.float().clamp(min=0) * (rows & attention_mask[:, None, :])
    sums = scores.sum(-1, keepdim=True)
    own = torch.arange(start, start + count, device=scores.device)[:, None] == torch.arange(n, device=scores.device)
    scores = scores + ((sums == 0) & rows & own)
    return scores / torch.where(sums > 0, sums, torch.ones_like(sums))
