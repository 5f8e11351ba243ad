"""The Triton kernels of hf/lean_triton.py against the torch path of hf/lean.py: compiled on a CUDA
device, else on CPU tensors through Triton's interpreter (tests/conftest.py turns it on before
triton is imported on a machine without CUDA). Small sizes: n not a multiple of the 64-key tiles,
padding, grouped-query heads, causality, bool and additive masks of every broadcast shape,
soft-capping, gradient weighting; and the lean methods end to end with the kernels in place of
the torch path.

Tolerances against the float32 torch path on the CPU: float32 inputs 1e-6 (the same float32 sums
in another order); bfloat16 inputs 1e-5 against the torch path on the same bfloat16 numbers
(products of two bfloat16 numbers are exact in float32, so only the order of the sums differs).
"""

from __future__ import annotations

import os

import pytest
import torch
import transformers
from helpers import CONFIGS, padded_batch

from captum_attnflow import AttentionRollout, GradientWeightedRollout
from captum_attnflow.capture import lean_blocks
from captum_attnflow.capture.lean_blocks import AttentionScores, fused_blocks, fused_rows
from captum_attnflow.functional import fuse_heads

pytest.importorskip("triton", reason="the GPU kernels need triton (pip install triton, Linux x86-64)")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA device, and triton was imported before TRITON_INTERPRET=1 was set", allow_module_level=True)

from captum_attnflow.capture import lean_triton  # noqa: E402  (after the skips: triton may be missing

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TOLERANCE = {torch.float32: 1e-6, torch.bfloat16: 1e-5, torch.float64: 1e-6}  # float64: computed in float32, as the torch path does


def run_kernel(query, key, mask, scaling, causal, fusion, out, **options):
    """:func:`lean_triton.fused_probabilities` on DEVICE, written back into the CPU ``out``."""
    moved = {k: None if v is None else v.to(DEVICE) if isinstance(v, torch.Tensor) else tuple(t.to(DEVICE) for t in v)
             for k, v in options.items() if k in ("rows", "gradient")}
    options = {**options, **moved}
    mask = None if mask is None else mask.to(DEVICE)
    result = lean_triton.fused_probabilities(
        query.to(DEVICE), key.to(DEVICE), mask, scaling, causal, fusion, out.to(DEVICE), **options
    )
    return out.copy_(result.cpu())


@pytest.fixture
def on_kernels(monkeypatch):
    """The library's one dispatch point sends every device to the kernels (interpreted on the CPU)."""
    monkeypatch.setattr(lean_blocks, "_kernels", lambda device: lean_triton)


def _inputs(n=37, batch=2, heads=4, kv_heads=2, dim=8, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, heads, n, dim, generator=generator).to(dtype)
    key = torch.randn(batch, kv_heads, n, dim, generator=generator).to(dtype)
    allowed = torch.ones(batch, n, dtype=torch.bool)
    allowed[-1, n - 7 :] = False  # right padding in the last example
    return query, key, allowed


def _masks(allowed):
    """(name, mask, causal): every form of mask the captures keep."""
    n = allowed.shape[1]
    keys = allowed[:, None, None]  # (B, 1, 1, n)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    lowest = torch.finfo(torch.float32).min
    whole_row = torch.zeros(allowed.shape[0], 1, n, n).masked_fill(~keys, lowest)
    whole_row[:, :, 5] = lowest
    return [
        ("none", None, False),
        ("causal", None, True),
        ("bool keys", keys, False),
        ("bool per query", keys & causal, False),  # (B, 1, n, n), padding and causality
        ("additive keys", torch.zeros(allowed.shape[0], 1, 1, n).masked_fill(~keys, lowest), False),
        ("additive -inf rows", torch.zeros(1, 1, n, n).masked_fill(~causal, float("-inf")), False),
        # eager's minimum over a whole row (query 5): uniform there, as eager gives it
        ("additive minimum, a row masked whole", whole_row, False),
    ]


def _torch_path(scores, fusion, **options):
    n, n_keys = scores.query.shape[2], scores.key.shape[2]
    out = torch.zeros(scores.query.shape[0], n, n_keys)
    for start, stop, block in fused_blocks(scores, fusion, **options):
        out[:, start:stop, : block.shape[-1]] = block
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=["float32", "bfloat16", "float64"])
def test_kernel_equals_the_torch_path(dtype):
    query, key, allowed = _inputs(dtype=dtype)
    for name, mask, causal in _masks(allowed):
        scores = AttentionScores(query, key, mask, 0.3, causal)
        out = torch.full((2, 37, 37), float("nan"))
        run_kernel(query, key, mask, 0.3, causal, "mean", out)
        torch.testing.assert_close(out, _torch_path(scores, "mean"), atol=TOLERANCE[dtype], rtol=0, msg=name)


@pytest.mark.parametrize("fusion", ["max", "min"])
def test_kernel_fuses_heads_by_max_and_min(fusion):
    query, key, allowed = _inputs()
    for name, mask, causal in _masks(allowed)[1:4:2]:  # causal; padding and causality in one mask
        out = torch.full((2, 37, 37), float("nan"))
        run_kernel(query, key, mask, 0.3, causal, fusion, out)
        expected = _torch_path(AttentionScores(query, key, mask, 0.3, causal), fusion)
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=0, msg=name)


def test_tiles_smaller_than_the_map(monkeypatch):
    """Several tiles of rows and keys, the last ones partial (n = 37, tiles of 16 rows and 32 keys)."""
    monkeypatch.setattr(lean_triton, "_TILE", (16, 32))
    query, key, allowed = _inputs()
    for name, mask, causal in _masks(allowed)[1:4]:
        out = torch.full((2, 37, 37), float("nan"))
        run_kernel(query, key, mask, 0.3, causal, "mean", out)
        expected = _torch_path(AttentionScores(query, key, mask, 0.3, causal), "mean")
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=0, msg=name)


def test_causal_with_a_mask_skips_later_keys_and_equals_the_torch_path():
    """A padded decoder: causality and a padding mask together (the tiles after the rows skipped)."""
    query, key, allowed = _inputs(n=70)
    mask = allowed[:, None, None] & torch.ones(70, 70, dtype=torch.bool).tril()
    scores = AttentionScores(query, key, mask, 0.3, False)
    assert scores.attends_causally
    out = torch.full((2, 70, 70), float("nan"))
    run_kernel(query, key, mask, 0.3, True, "mean", out)
    torch.testing.assert_close(out, _torch_path(scores, "mean"), atol=1e-6, rtol=0)


def test_kernel_writes_a_view_of_rows_and_keys():
    """A block start..stop over the first w keys, into a strided view of a larger map."""
    query, key, _ = _inputs(n=40, heads=2, kv_heads=1, dim=20)  # head size 20: padded to 32 in the tile
    scores = AttentionScores(query, key, None, 0.25, True)
    expected = _torch_path(scores, "mean")
    out = torch.full((2, 40, 40), -1.0)
    run_kernel(query, key, None, 0.25, True, "mean", out[:, 21:33, :33], start=21)
    torch.testing.assert_close(out[:, 21:33, :33], expected[:, 21:33, :33], atol=1e-6, rtol=0)
    assert (out[:, :21] == -1).all() and (out[:, 33:] == -1).all() and (out[:, :, 33:] == -1).all()


def test_padding_queries_without_any_key_are_zero():
    query, key, allowed = _inputs(n=20)
    mask = allowed[:, None, :, None] & allowed[:, None, None, :]  # padding queries see nothing
    out = torch.full((2, 20, 20), float("nan"))
    run_kernel(query, key, mask, 0.3, False, "mean", out)
    assert (out[-1, 13:] == 0).all() and torch.isfinite(out).all()
    torch.testing.assert_close(out, _torch_path(AttentionScores(query, key, mask, 0.3, False), "mean"), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_gradient_weighted_blocks_equal_the_torch_path(dtype):
    """(P_h * dO_h V_h^T)^+ fused over heads, grouped-query values, every mask form."""
    query, key, allowed = _inputs(dtype=dtype)
    generator = torch.Generator().manual_seed(1)
    grad_output = torch.randn(2, 37, 4, 8, generator=generator).to(dtype).transpose(1, 2)  # (B, H, n, d), strided
    value = torch.randn(2, 2, 37, 8, generator=generator).to(dtype)
    for name, mask, causal in _masks(allowed):
        scores = AttentionScores(query, key, mask, 0.3, causal)
        out = torch.full((2, 37, 37), float("nan"))
        run_kernel(query, key, mask, 0.3, causal, "mean", out, gradient=(grad_output, value))
        expected = _torch_path(scores, "mean", gradient=(grad_output, value))
        torch.testing.assert_close(out, expected, atol=TOLERANCE[dtype], rtol=0, msg=name)


def test_rows_equal_the_torch_path():
    query, key, allowed = _inputs()
    positions = torch.tensor([[0, 36, 5, 17], [29, 30, 0, 35]])
    for name, mask, causal in _masks(allowed):
        scores = AttentionScores(query, key, mask, 0.3, causal)
        out = torch.full((2, 4, 37), float("nan"))
        run_kernel(query, key, mask, 0.3, causal, "max", out, rows=positions)
        expected = fused_rows(scores, "max", positions, torch.empty(2, 4, 37))
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=0, msg=name)


def test_soft_capped_scores():
    """c tanh(q k^T s / c) before the mask, as Gemma 2 caps its scores."""
    query, key, allowed = _inputs()
    mask = allowed[:, None, None]
    scores = torch.tanh(query @ key.repeat_interleave(2, 1).transpose(-1, -2) * 0.9 / 2.0) * 2.0
    expected = fuse_heads(torch.softmax(scores.masked_fill(~mask, float("-inf")), -1), "mean")
    out = torch.empty(2, 37, 37)
    run_kernel(query, key, mask, 0.9, False, "mean", out, softcap=2.0)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    uncapped = run_kernel(query, key, mask, 0.9, False, "mean", torch.empty(2, 37, 37))
    assert (uncapped - expected).abs().max() > 1e-2  # the cap changes the maps
    capped = AttentionScores(query, key, mask, 0.9, False, 2.0)  # the torch path's cap, as a capture keeps it
    torch.testing.assert_close(_torch_path(capped, "mean"), expected, atol=1e-6, rtol=0)


def test_the_dispatch_passes_every_score_term(on_kernels, monkeypatch):
    """fused_blocks and fused_rows on the kernels read the capture's soft-cap and causality."""
    query, key, allowed = _inputs(n=20)
    positions = torch.tensor([[0, 19], [7, 3]])
    for scores in (AttentionScores(query, key, allowed[:, None, None], 0.9, False, 2.0),
                   AttentionScores(query, key, None, 0.9, True, 1.5)):
        ours = _torch_path(scores, "mean"), fused_rows(scores, "mean", positions, torch.empty(2, 2, 20))
        monkeypatch.setattr(lean_blocks, "_kernels", lambda device: None)
        expected = _torch_path(scores, "mean"), fused_rows(scores, "mean", positions, torch.empty(2, 2, 20))
        monkeypatch.setattr(lean_blocks, "_kernels", lambda device: lean_triton)
        for result, reference in zip(ours, expected):
            torch.testing.assert_close(result, reference, atol=1e-6, rtol=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on CUDA tests/test_gpu.py compares the methods with the CPU")
@pytest.mark.parametrize(
    ("arch", "block_bytes"),
    # grouped-query heads, causality and padding in the test command (the interpreter takes 0.3 s a launch)
    [("llama", None), pytest.param("llama", 2 * 9 * 4 * 3, marks=pytest.mark.slow),
     pytest.param("bert", None, marks=pytest.mark.slow), pytest.param("bert", 2 * 9 * 4 * 3, marks=pytest.mark.slow),
     pytest.param("gpt2", None, marks=pytest.mark.slow)],
)
def test_lean_methods_on_the_kernels_equal_the_torch_path(on_kernels, monkeypatch, arch, block_bytes):
    """Rollout (block by block, the explained rows of the top layer alone) and gradient-weighted
    rollout with the dispatch sending every block to the kernels: what the torch path gives.
    ``block_bytes``: blocks of two rows of 9 keys (B = 3), narrow causal ones; None: one block."""
    config = CONFIGS[arch]()
    config.initializer_range = 0.2  # maps far from uniform
    torch.manual_seed(0)
    head = transformers.AutoModelForSequenceClassification if arch == "bert" else transformers.AutoModelForCausalLM
    model = head.from_config(config).eval()
    ids, mask = padded_batch(seed=3, batch=3)
    last = mask.sum(-1) - 1
    if block_bytes is not None:
        monkeypatch.setattr(lean_blocks, "_BLOCK_BYTES", block_bytes)
    results = []
    for use_kernels in (True, False):
        if not use_kernels:
            monkeypatch.setattr(lean_blocks, "_kernels", lambda device: None)
        results.append([
            AttentionRollout(model).attribute(ids, attention_mask=mask, position=last, layer=None),
            GradientWeightedRollout(model).attribute(ids, attention_mask=mask, position=last, layer=None, target=1),
        ])
    for ours, expected in zip(*results):
        torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0)


def test_blocks_sized_by_the_device(monkeypatch):
    """The CPU keeps its cache-sized blocks; a GPU takes a share of its free memory, capped; the
    kernels write only fused rows, so their blocks hold H times the rows of the torch path's."""
    assert lean_blocks._block_bytes(torch.device("cpu")) == lean_blocks._BLOCK_BYTES
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (80 * 2**30, 80 * 2**30))
    assert lean_blocks._block_bytes(torch.device("cuda")) == lean_blocks._GPU_BLOCK_BYTES
    assert lean_blocks._kernels(torch.device("cpu")) is None and lean_blocks._kernels(torch.device("cuda")) is lean_triton
    query, key, _ = _inputs(n=4096, batch=1, heads=4, kv_heads=4)
    scores = AttentionScores(query, key, None, 0.3, False)
    _, torch_rows, torch_scratch = lean_blocks._plan(scores)
    monkeypatch.setattr(lean_blocks, "_kernels", lambda device: lean_triton)
    _, kernel_rows, kernel_scratch = lean_blocks._plan(scores)
    assert kernel_rows == 4 * torch_rows and kernel_scratch == kernel_rows < torch_scratch


def _product_reference(scores, vectors, real_keys=None, gradient=None):
    """``vectors`` times the head-mean map of the torch path, and its row sums over ``real_keys``."""
    fused = _torch_path(scores, "mean", gradient=gradient)[:, : vectors.shape[-1]]
    sums = None if real_keys is None else (fused * real_keys[:, None, :]).sum(-1)
    return vectors @ fused, sums


# Under the interpreter a mask form costs about 2 s: the test command runs the causal flag and the
# richest boolean and additive masks, the others when slow; the chunks' summing is the same for
# every form, so it runs on the richest one.
_PRODUCT_FORMS = [
    pytest.param(index, chunked, id=f"{name}{', chunks of 16 rows' if chunked else ''}",
                 marks=() if name in ("causal", "bool per query", "additive minimum, a row masked whole") else pytest.mark.slow)
    for index, (name, _, _) in enumerate(_masks(torch.ones(1, 8, dtype=torch.bool)))
    for chunked in (False, True)
    if not chunked or name == "additive minimum, a row masked whole"
]


@pytest.mark.parametrize("form, chunked", _PRODUCT_FORMS)
def test_row_products_equal_the_product_with_the_map(monkeypatch, form, chunked):
    """u W without W written: every mask form, tiles smaller than the map, rows in chunks whose
    partial products are summed, and the head-mean probability on the real keys."""
    monkeypatch.setattr(lean_triton, "_TILE", (16, 32))
    if chunked:
        monkeypatch.setattr(lean_triton, "_CHUNK_ROWS", 16)
        monkeypatch.setattr(lean_triton, "_PROGRAMS_PER_SM", 8)
    query, key, allowed = _inputs()
    vectors = torch.rand(2, 3, 37, generator=torch.Generator().manual_seed(2))
    for name, mask, causal in _masks(allowed)[form : form + 1]:
        scores = AttentionScores(query, key, mask, 0.3, causal)
        product = lean_triton.row_product(query.to(DEVICE), key.to(DEVICE), None if mask is None else mask.to(DEVICE),
                                          0.3, causal, 37, real_keys=allowed.to(DEVICE))
        expected, sums = _product_reference(scores, vectors, allowed.float())
        torch.testing.assert_close(product(vectors.to(DEVICE)).cpu(), expected, atol=1e-6, rtol=0, msg=name)
        torch.testing.assert_close(product.real_sums.cpu(), sums, atol=1e-6, rtol=0, msg=name)
        # every key real: the row sums come from the statistics alone (1, or 0 for a row without keys)
        every = torch.ones_like(allowed)
        product = lean_triton.row_product(query.to(DEVICE), key.to(DEVICE), None if mask is None else mask.to(DEVICE),
                                          0.3, causal, 37, real_keys=every.to(DEVICE))
        _, sums = _product_reference(scores, vectors, every.float())
        torch.testing.assert_close(product.real_sums.cpu(), sums, atol=1e-6, rtol=0, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_gradient_weighted_row_products_of_the_leading_rows(dtype):
    """The gradient-weighted map's first 20 rows times 70 vectors (two tiles of 64 and more than one call)."""
    query, key, allowed = _inputs(dtype=dtype)
    generator = torch.Generator().manual_seed(1)
    grad_output = torch.randn(2, 37, 4, 8, generator=generator).to(dtype).transpose(1, 2)
    value = torch.randn(2, 2, 37, 8, generator=generator).to(dtype)
    vectors = torch.rand(2, 70, 20, generator=generator)
    mask = allowed[:, None, None] & torch.ones(37, 37, dtype=torch.bool).tril()
    scores = AttentionScores(query, key, mask, 0.3, False)
    moved = tuple(t.to(DEVICE) for t in (grad_output, value))
    product = lean_triton.row_product(query.to(DEVICE), key.to(DEVICE), mask.to(DEVICE), 0.3, True, 20, gradient=moved)
    expected, _ = _product_reference(scores, vectors, gradient=(grad_output, value))
    torch.testing.assert_close(product(vectors.to(DEVICE)).cpu(), expected, atol=TOLERANCE[dtype], rtol=0)
    assert product.real_sums is None
