"""Compile the CPU kernels into numba's on-disk cache: ``python -m captum_attnflow.functional.precompile``.

numba compiles a kernel on its first call in a process unless its cache (``__pycache__`` beside
the source) holds it: flow's max-flow kernel takes about 28 s of one core, ALTI's distances
about 8 s. ``scripts/install.sh`` runs this once after installing, so that neither a user's
first call nor each process of the test command pays it. Each kernel is compiled for the
argument types the library passes it, by calling the functions that run them on tiny
inputs: flow on encoder and causal attention (flows kept both ways), rollout's rows in float32 and float64, ALTI's
contributions pre- and post-LN in float32 and float64.
"""

from __future__ import annotations

import time

import torch

from captum_attnflow.functional._maxflow import max_flows
from captum_attnflow.functional.decomposition import alti_contributions
from captum_attnflow.functional.flow import flow
from captum_attnflow.functional.rollout import rollout_rows


def precompile() -> float:
    """Call every CPU kernel once on tiny inputs; returns the seconds it took."""
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(0)
    attentions = torch.softmax(torch.randn(3, 1, 2, 6, 6, generator=generator), -1)
    causal = torch.softmax(torch.randn(3, 1, 2, 6, 6, generator=generator).tril().masked_fill(
        torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf")), -1)
    for maps in (attentions, causal):
        flow(maps, sources=[0, 5], show_progress=False)  # flows in the graph's layout (a small graph)
        max_flows(maps.mean(2)[:, 0].numpy(), [0, 5], pooled=True)  # pooled flows, as large graphs keep them
        for dtype in (torch.float32, torch.float64):
            rollout_rows(maps.to(dtype), position=[0, 5], layer=None)
    for dtype in (torch.float32, torch.float64):
        probabilities = torch.softmax(torch.randn(1, 2, 5, 5, generator=generator, dtype=dtype), -1)
        values = torch.randn(1, 2, 5, 3, generator=generator, dtype=dtype)
        inputs = torch.randn(1, 5, 6, generator=generator, dtype=dtype)
        weight, bias = torch.randn(6, 6, generator=generator, dtype=dtype), torch.randn(6, generator=generator, dtype=dtype)
        mask = torch.ones(1, 5, dtype=torch.bool)
        for norm in (None, (torch.ones(6, dtype=dtype), torch.zeros(6, dtype=dtype), 1e-5)):
            alti_contributions(probabilities, values, inputs, weight, bias, mask, norm)
    return time.perf_counter() - start


if __name__ == "__main__":
    print(f"compiled the CPU kernels into numba's cache in {precompile():.0f} s")
