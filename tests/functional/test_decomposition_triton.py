"""The Triton kernel of functional/decomposition_triton.py (ALTI's L1 distances) against the torch
path of functional/decomposition.py: compiled on a CUDA device, else on CPU tensors through
Triton's interpreter (turned on by tests/conftest.py), with tiles smaller than the maps (several
row tiles and feature chunks, the last ones partial), causal and padded attention,
pre- and post-LN blocks, blocks of rows fed alone; and ALTI end to end with the kernel.

Tolerance: 1e-6 relative to the distances (float32 sums of D terms in another order)."""

from __future__ import annotations

import os

import pytest
import torch

from captum_attnflow import ALTI, load_agreement_model
from captum_attnflow.functional import decomposition

pytest.importorskip("triton", reason="the GPU kernels need triton (pip install triton, Linux x86-64)")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA device, and triton was imported before TRITON_INTERPRET=1 was set", allow_module_level=True)

from captum_attnflow.functional import decomposition_triton  # noqa: E402  (after the skips)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _layer(causal: bool, n: int = 21, heads: int = 3, size: int = 4, width: int = 40, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(2, heads, n, n, generator=generator)
    if causal:
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    scores[1, :, :, n - 6 :] = float("-inf")  # padding keys in the second example
    probabilities = torch.softmax(scores, -1)
    values, weight = torch.randn(2, heads, n, size, generator=generator), torch.randn(heads * size, width, generator=generator)
    inputs = torch.randn(2, n, width, generator=generator)
    outputs = inputs + torch.randn(2, n, width, generator=generator)
    scale = torch.rand(2, n, width, generator=generator) + 0.5
    return probabilities, decomposition.projected_values(values, weight), inputs, outputs, scale


def _on_device(*tensors):
    return [None if t is None else t.to(DEVICE) for t in tensors]


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(decomposition_triton, "_TILE", (16, 32))  # n = 21 rows, D = 40 features


# Two opposite (norm, mask) pairs in the test command (2-3 s each under the interpreter), all four when slow.
@pytest.mark.parametrize("post_norm, causal", [
    pytest.param(False, False, id="pre-LN-bidirectional"), pytest.param(True, True, id="post-LN-causal"),
    pytest.param(False, True, id="pre-LN-causal", marks=pytest.mark.slow),
    pytest.param(True, False, id="post-LN-bidirectional", marks=pytest.mark.slow),
])
def test_alti_distances_equal_the_torch_path(small_tiles, post_norm, causal):
    probabilities, projected, inputs, outputs, scale = _layer(causal)
    scale = scale if post_norm else None
    batch, _, n, size = projected.shape
    expected = torch.cat([decomposition._distances(probabilities, projected, inputs, outputs, scale, rows)
                          for rows in decomposition._row_blocks(batch, n, size)], 1)
    ours = decomposition_triton.alti_distances(*_on_device(probabilities, projected, inputs, outputs, scale)).cpu()
    assert torch.equal(torch.isinf(ours), torch.isinf(expected))  # pairs no head attends: +inf, not computed
    finite = torch.isfinite(expected)
    torch.testing.assert_close(ours[finite], expected[finite], atol=0, rtol=1e-6)


@pytest.mark.slow  # 15 s: the interpreter takes about 0.1 s a program
@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA tests/test_gpu.py compares the methods with the CPU")
def test_alti_on_the_kernel_equals_the_cpu_path(monkeypatch):
    """ALTI of the bundled post-LN model, padded, with the kernel in place of the numba kernel."""
    model, tokenizer = load_agreement_model()
    batch = tokenizer(["the keys to the cabinet are", "the key"], return_tensors="pt", padding=True)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    expected = ALTI(model).attribute(ids, attention_mask=mask, layer=None)
    monkeypatch.setattr(decomposition, "_compiled_distances", decomposition_triton.alti_distances)
    torch.testing.assert_close(ALTI(model).attribute(ids, attention_mask=mask, layer=None), expected, atol=1e-6, rtol=0)


# Every (norm, mask) pair runs in test_alti_distances_equal_the_torch_path; the blocks of rows run
# two opposite pairs in the test command (each about 5 s under the interpreter), all four when slow.
@pytest.mark.parametrize("post_norm, causal", [
    (False, False), (True, True),
    pytest.param(False, True, marks=pytest.mark.slow), pytest.param(True, False, marks=pytest.mark.slow),
], ids=["pre-LN-bidirectional", "post-LN-causal", "pre-LN-causal", "post-LN-bidirectional"])
def test_a_block_of_rows_gives_the_rows_of_the_whole_map(small_tiles, causal, post_norm):
    """Rows 5..18 fed alone with their offset, as a lean capture's recomputed blocks come: the
    own token (i = j) found at its place, the rows' inputs, outputs and scales read from the block."""
    probabilities, projected, inputs, outputs, scale = _layer(causal)
    scale = scale if post_norm else None
    rows = slice(5, 18)
    whole = decomposition_triton.alti_distances(*_on_device(probabilities, projected, inputs, outputs, scale)).cpu()
    block = decomposition_triton.alti_distances(*_on_device(
        probabilities[:, :, rows], projected, inputs[:, rows], outputs[:, rows], None if scale is None else scale[:, rows]
    ), row_offset=5).cpu()
    torch.testing.assert_close(block, whole[:, rows], atol=0, rtol=1e-6)
