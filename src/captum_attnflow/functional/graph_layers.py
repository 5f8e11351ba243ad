"""The layers of the attention graph computed from checked-shape attentions, their values checked on
the way: one compiled pass per layer on CPU without gradients, torch ops (differentiable, any
device) otherwise. :func:`~captum_attnflow.functional.graph.attention_graph` calls them."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from captum_attnflow.functional.checks import check_attention_values, check_row_statistics
from captum_attnflow.functional.compiled import njit_on_first_call
from captum_attnflow.functional.mixing import HEAD_FUSIONS, _mixed, fuse_heads


def _fused_graph(layers: list[Tensor], residual_alpha: float, head_fusion: str, mask: Tensor) -> Tensor:
    """(L, B, n, n) fused, residual-mixed graph; the attentions' values are checked on the way."""
    batch, _, n, _ = layers[0].shape
    graph = torch.empty(len(layers), batch, n, n, dtype=torch.float32, device=mask.device)
    if mask.device.type == "cpu" and not any(layer.requires_grad for layer in layers):
        heads = layers[0].shape[1]
        row_sums = np.empty((len(layers), batch, heads, n), dtype=np.float32)
        negative_sums = np.empty_like(row_sums)
        for index, layer in enumerate(layers):
            _compiled_graph_layer(
                layer.float(), mask, head_fusion, residual_alpha, graph[index], row_sums[index], negative_sums[index]
            )
        # One check of all layers' row statistics: a call per layer costs more than a small graph.
        check_row_statistics(torch.from_numpy(row_sums), torch.from_numpy(negative_sums), mask)
        return graph
    # Layer by layer rather than on a stacked copy: only the fused (L, B, n, n) graph is allocated.
    fused = []
    for layer in layers:
        layer = layer.float()
        check_attention_values(layer, mask)
        fused.append(fuse_heads(layer, head_fusion))
    return _mixed(torch.stack(fused), residual_alpha, mask)


def _head_graphs(layers: list[Tensor], residual_alpha: float, mask: Tensor) -> Tensor:
    """(L, B, H, n, n): every head residual-mixed on its own, padding removed."""
    heads = torch.stack([layer.float() for layer in layers])
    check_attention_values(heads, mask)
    return _mixed(heads, residual_alpha, mask[:, None])


def _compiled_graph_layer(
    layer: Tensor,
    mask: Tensor,
    head_fusion: str,
    residual_alpha: float,
    out: Tensor,
    row_sums: np.ndarray,
    negative_sums: np.ndarray,
) -> None:
    """One layer of :func:`attention_graph` for CPU tensors without gradients, written into ``out`` (B, n, n).

    The same maths as the torch ops above, in one pass over the attentions; the statistics
    the checks need, each row's sum and the sum of its negative entries, go to ``row_sums``
    and ``negative_sums`` (B, H, n).
    """
    _graph_layer_kernel(
        layer.contiguous().numpy(),
        mask.numpy(),
        HEAD_FUSIONS.index(head_fusion),
        float(residual_alpha),
        out.numpy(),
        row_sums,
        negative_sums,
    )


# Attentions are far larger than anything else here (144 MiB for BERT-base at n=512), so the
# graph costs about as much as reading them once. Torch needs a pass each for the row sums, the
# negativity check and the head fusion, and more for residual mixing on the (L, B, n, n) result;
# this kernel reads the attentions once, in memory order, checking each row while folding it
# into the fused (n, n) map that stays in cache, then mixes in the residual. One thread already
# runs at memory speed, and a thread pool would compete with torch's.
@njit_on_first_call(cache=True, fastmath={"reassoc", "contract", "nsz", "arcp"})
def _graph_layer_kernel(layer, mask, fusion, alpha, out, row_sums, negative_sums):  # pragma: no cover
    batch, heads, n, _ = layer.shape
    zero = np.float32(0.0)
    for b in range(batch):
        for h in range(heads):
            for i in range(n):
                row = layer[b, h, i]
                fused = out[b, i]
                total = zero
                negative = zero
                if h == 0:
                    for j in range(n):
                        value = row[j]
                        total += value
                        negative += min(value, zero)
                        fused[j] = value
                elif fusion == 0:
                    for j in range(n):
                        value = row[j]
                        total += value
                        negative += min(value, zero)
                        fused[j] += value
                elif fusion == 1:
                    for j in range(n):
                        value = row[j]
                        total += value
                        negative += min(value, zero)
                        fused[j] = value if value > fused[j] else fused[j]
                else:
                    for j in range(n):
                        value = row[j]
                        total += value
                        negative += min(value, zero)
                        fused[j] = value if value < fused[j] else fused[j]
                row_sums[b, h, i] = total
                negative_sums[b, h, i] = negative
        scale = alpha / heads if fusion == 0 else alpha
        for i in range(n):
            fused = out[b, i]
            if not mask[b, i]:
                fused[:] = zero
                continue
            for j in range(n):
                fused[j] = fused[j] * scale if mask[b, j] else zero
            fused[i] += 1.0 - alpha
            total = fused.sum()
            if total > 0:
                fused /= total
