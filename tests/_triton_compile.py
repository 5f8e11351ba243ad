"""Compile every Triton kernel launch of the library's GPU wrappers for an H100 (sm_90), no GPU needed.

Run by tests/test_triton_compile.py in a process without TRITON_INTERPRET (the interpreter
accepts code the compiler refuses: mixed types across branches, loop bounds, dot shapes). The
kernels' launches are recorded instead of run, on CPU tensors of the shapes the wrappers get,
and each distinct signature is compiled to a cubin by Triton's own compiler and ptxas, as a
first call on the GPU would. ``UPCAST`` (the interpreter's float32 tiles) and the products'
precisions are set as on CUDA; a kernel's first launch is compiled with every config the GPU
tunes it over too. Prints one line per compiled variant and ``compiled N``.

    python tests/_triton_compile.py [--all]
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from captum_attnflow.capture import lean_triton
from captum_attnflow.functional import decomposition_triton

H100 = GPUTarget("cuda", 90, 32)
TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.bool: "i1", torch.int64: "i64"}


class Recorder:
    """Stands for a kernel: ``kernel[grid](*args, **kwargs)`` records the launch."""

    def __init__(self, kernel) -> None:
        self.kernel, self.launches = kernel, []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((args, kwargs))


def source(kernel, args: tuple, kwargs: dict) -> tuple[dict, dict]:
    """The kernel's (signature, constexprs) for a launch with ``args`` and ``kwargs``."""
    values = dict(zip((p.name for p in kernel.params), args)) | kwargs
    signature, constexprs = {}, {}
    for param in kernel.params:
        value = values[param.name]
        if param.is_constexpr:
            signature[param.name], constexprs[param.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = "*" + TYPES[value.dtype]
        elif isinstance(value, float):
            signature[param.name] = "fp32"
        else:
            signature[param.name] = "i32" if -(2**31) <= value < 2**31 else "i64"
    if "UPCAST" in constexprs:
        constexprs["UPCAST"] = False  # as on CUDA
    for name in ("PRECISION", "PRODUCT_PRECISION"):
        if constexprs.get(name) == "ieee":  # the interpreter's; CUDA's (torch's default: no TF32 for matmuls)
            constexprs[name] = "tf32x3"
    return signature, constexprs


def lean_launches(everything: bool) -> None:
    """The wrapper's calls: each mask form, causality, rows, gradients, soft-capping, fusions, dtypes."""
    batch, heads, n = 2, 4, 40
    allowed = torch.ones(batch, n, dtype=torch.bool)
    masks = {"none": None, "bool": allowed[:, None, None], "additive": torch.zeros(batch, 1, 1, n)}
    dtypes = (torch.float32, torch.bfloat16)
    cases = itertools.product(dtypes, masks, (False, True), (False, True), (False, True), ("mean", "max", "min"))
    if not everything:  # every flag on and off at least once, each dtype
        cases = [(torch.bfloat16, "none", True, False, True, "mean"), (torch.bfloat16, "additive", False, True, False, "max"),
                 (torch.float32, "bool", True, False, True, "min"), (torch.float32, "none", False, True, False, "mean"),
                 (torch.bfloat16, "none", True, False, False, "max"), (torch.float64, "none", True, False, True, "mean")]
    for dtype, mask, causal, rows, gradient, fusion in cases:
        dim = 256 if (mask, fusion) == ("none", "max") else 64  # Gemma's heads: half the rows a tile
        query, key = torch.zeros(batch, heads, n, dim, dtype=dtype), torch.zeros(batch, heads // 2, n, dim, dtype=dtype)
        options = {"softcap": 30.0} if gradient else {}  # soft-capping with every other flag of one case
        if rows:
            options["rows"] = torch.zeros(batch, 3, dtype=torch.int64)
        if gradient:
            options["gradient"] = (torch.zeros(batch, heads, n, dim, dtype=dtype), key)
        out = torch.empty(batch, 3 if rows else n, n)
        mask_tensor = masks[mask] if masks[mask] is None or dtype == torch.float32 or mask == "bool" else masks[mask].to(dtype)
        lean_triton.fused_probabilities(query, key, mask_tensor, 0.125, causal, fusion, out, **options)
        if fusion == "mean" and not rows:  # rollout's row product, with the probability on the real keys
            options.pop("rows", None)
            real = None if gradient else allowed
            product = lean_triton.row_product(query, key, mask_tensor, 0.125, causal, n, real, **options)
            product(torch.zeros(batch, 3, n))


def decomposition_launches() -> None:
    probabilities, projected = torch.zeros(2, 12, 40, 40), torch.zeros(2, 12, 40, 96)
    inputs = outputs = scale = torch.zeros(2, 40, 96)
    decomposition_triton.alti_distances(probabilities, projected, inputs, outputs, None)
    decomposition_triton.alti_distances(probabilities.bfloat16(), projected, inputs, outputs, scale)
    decomposition_triton.alti_distances(torch.zeros(2, 32, 40, 40), torch.zeros(2, 32, 40, 96), inputs, outputs, None)  # Llama's 32 heads


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--all", action="store_true", help="every combination of the flags (slow)")
    everything = parser.parse_args().all
    recorders = {
        (lean_triton, "_row_statistics"), (lean_triton, "_fused_probabilities"), (lean_triton, "_fused_product"),
        (decomposition_triton, "_token_distances"),
    }
    recorded = []
    for module, name in recorders:
        recorder = Recorder(getattr(module, name))
        setattr(module, name, recorder)
        recorded.append(recorder)
    lean_launches(everything)
    decomposition_launches()
    compiled = set()
    for recorder in recorded:
        for launch, (args, kwargs) in enumerate(recorder.launches):
            # the interpreter's tiles; on the GPU's first launch of a kernel, every config it is tuned over
            tuned = lean_triton._TUNED.get(recorder.kernel)
            configs = [None] if tuned is None or launch > 0 else [None, *tuned.configs]
            for config in configs:
                options = {} if config is None else {"num_warps": config.num_warps, "num_stages": config.num_stages}
                signature, constexprs = source(recorder.kernel, args, kwargs | ({} if config is None else config.kwargs))
                key = (recorder.kernel.fn.__name__, tuple(signature.items()), tuple(sorted(constexprs.items())),
                       tuple(options.items()))
                if key in compiled:
                    continue
                source_code = ASTSource(fn=recorder.kernel, signature=signature, constexprs=constexprs)
                triton.compile(source_code, target=H100, options=options)
                compiled.add(key)
                print(recorder.kernel.fn.__name__, dict(sorted(constexprs.items())), options, flush=True)
    print(f"compiled {len(compiled)}")


if __name__ == "__main__":
    sys.exit(main())
