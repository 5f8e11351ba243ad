"""hf/lean_heads.py: each head's probabilities recomputed from a lean capture, by blocks of rows,
against explicit softmax(q k^T s + M) on the whole map and against the maps a model returns itself."""

from __future__ import annotations

import pytest
import torch
from helpers import make_tiny_model

from captum_attnflow.capture.lean import lean_capture
from captum_attnflow.capture.lean_blocks import AttentionScores
from captum_attnflow.capture.lean_heads import head_blocks


def _whole(scores: AttentionScores, rows: int | None) -> torch.Tensor:
    blocks = [(start, block.clone()) for start, block in head_blocks(scores, rows)]
    assert [start for start, _ in blocks] == sorted({start for start, _ in blocks})  # in order, no row twice
    return torch.cat([block for _, block in blocks], 2)


def _reference(query, key, scaling, allowed=None, additive=None, softcap=None):
    """Explicit per-head probabilities, float64, rows with no allowed key 0."""
    keys = key.double().repeat_interleave(query.shape[1] // key.shape[1], 1)
    scores = query.double() @ keys.transpose(-1, -2) * scaling
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if additive is not None:
        scores = scores + additive.double()
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, -1).nan_to_num(0.0)


@pytest.mark.parametrize("rows", [1, 3, None, 100], ids=["one-row", "three-rows", "budget", "whole"])
@pytest.mark.parametrize("case", ["no-mask", "causal", "padding", "broadcast-mask", "additive", "softcap"])
def test_blocks_equal_the_explicit_softmax(rows, case):
    generator = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, n, size = 2, 4, 2, 7, 8
    query = torch.randn(batch, heads, n, size, generator=generator)
    key = torch.randn(batch, kv_heads, n, size, generator=generator)
    scaling, mask, causal, softcap = 0.3, None, False, None
    allowed, additive = None, None
    if case == "causal":
        causal, allowed = True, torch.ones(n, n, dtype=torch.bool).tril()
    elif case == "padding":  # the second example's last 3 tokens are padding, query rows included: those rows 0
        real = torch.ones(batch, n, dtype=torch.bool)
        real[1, 4:] = False
        mask = allowed = (real[:, None, :, None] & real[:, None, None, :]) & torch.ones(n, n, dtype=torch.bool).tril()
    elif case == "broadcast-mask":  # (B, 1, 1, n): one row of the mask for every query
        mask = allowed = torch.tensor([[True] * n, [True] * 5 + [False] * 2])[:, None, None, :]
    elif case == "additive":
        mask = additive = torch.randn(1, 1, n, n, generator=generator)
    elif case == "softcap":
        softcap, causal, allowed = 2.0, True, torch.ones(n, n, dtype=torch.bool).tril()
    scores = AttentionScores(query, key, mask, scaling, causal, softcap)
    expected = _reference(query, key, scaling, allowed, additive, softcap)
    torch.testing.assert_close(_whole(scores, rows).double(), expected, atol=1e-6, rtol=0)
    if case == "padding":
        assert _whole(scores, rows)[1, :, 4:].abs().sum() == 0


def test_causal_call_with_keys_before_its_rows():
    """A call of 3 query rows over 5 keys (a cache's 2 keys first) sees the keys up to its own position."""
    query, key = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4)
    allowed = torch.ones(3, 5, dtype=torch.bool).tril(2)
    expected = _reference(query, key, 0.5, allowed)
    torch.testing.assert_close(_whole(AttentionScores(query, key, None, 0.5, True), 2).double(), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", ["bert", "llama"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_blocks_equal_the_maps_the_model_returns(arch, side):
    """The tiny models' own eager maps (GQA, rotary, causal for Llama), padding on either side;
    padding query rows, which the model fills with whatever its softmax gives, are 0 here."""
    second, real = ([6, 8, 10, 11, 0, 0], [1, 1, 1, 1, 0, 0]) if side == "right" else ([0, 0, 6, 8, 10, 11], [0, 0, 1, 1, 1, 1])
    ids, mask = torch.tensor([[5, 9, 13, 22, 7, 30], second]), torch.tensor([[1] * 6, real])
    model = make_tiny_model(arch)
    eager = make_tiny_model(arch, attn_implementation="eager")
    with torch.no_grad():
        expected = eager(ids, attention_mask=mask, output_attentions=True).attentions
        with lean_capture(model) as capture:
            model(ids, attention_mask=mask)
    real = mask.bool()
    for layer, maps in zip(capture.layers, expected):
        ours = _whole(layer, rows=2)
        keep = real[:, None, :, None]
        torch.testing.assert_close(ours * keep, maps * keep, atol=1e-6, rtol=0)


def test_blocks_sized_by_the_budget_hold_whole_tiles_of_rows(monkeypatch):
    """Where more than a tile of rows fits, a block holds whole tiles of the distance kernels
    (64 rows), the rest in the last block; the budget is never exceeded."""
    from captum_attnflow.capture import lean_heads

    query = torch.randn(1, 12, 300, 8)
    scores = AttentionScores(query, query, None, 0.3, False)
    monkeypatch.setattr(lean_heads, "_BLOCK_BYTES", 4 * 12 * 300 * 150)  # 150 rows fit
    assert [block.shape[2] for _, block in head_blocks(scores)] == [128, 128, 44]
    monkeypatch.setattr(lean_heads, "_BLOCK_BYTES", 4 * 12 * 300 * 40)  # less than a tile
    assert [block.shape[2] for _, block in head_blocks(scores)] == [40] * 7 + [20]
