"""Memory per layer of depth: how each method's peak grows with the number of layers, against the
floor of one layer's weights plus one layer's input, with and without layer-wise recomputation.

A Llama-style decoder (hidden 1024, 16 query heads sharing 4 key heads, intermediate 2816, random
weights from a config, no download) in float32 on the CPU, one prompt of 2048 tokens and one
output token, through the wrappers a user calls (a word-level tokenizer, one token per id). Each
cell (path x depth x repeat) runs in a fresh process, so each peak resident size
(``ru_maxrss``) is that call's own. The paths (``--methods``):

* forward: the model's forward over prompt + output, no gradients;
* captum: Captum's ``LLMGradientAttribution(LayerGradientXActivation(model, embed_tokens))``;
* attnlrp, gradient_rollout: ``LLMAttentionAttribution(AttnLRP(model, recompute=False))``,
  ``LLMAttentionAttribution(GradientWeightedRollout(model, recompute=False))``: every layer's
  activations kept for the backward pass (what they did before recomputation);
* attnlrp_recompute, gradient_rollout_recompute: the same with ``recompute=True``: each layer
  keeps its input, the backward pass recomputes one layer at a time;
* value_zeroing, alti, norm: ``ValueZeroing``, ``ALTI``, ``AttentionNorm`` (forward-only).

Each child runs with ``MALLOC_MMAP_THRESHOLD_=65536`` (unless set): glibc then returns every freed
tensor to the system at once, so the peak resident size is the peak of live memory (with glibc's
adaptive threshold, repeats of one cell differed by up to 100 MiB, 25 MiB a layer over 4 layers).
Printed per path: the peak at each depth (the range over ``--repeats`` processes), the growth per
layer between the two depths (its range: the smallest peak at the greater depth minus the largest
at the smaller, and the reverse), that growth over the floor, and the time at each depth (median
over the repeats) with its ratio to the same method's without recomputation. Targets at 2 against
6 or 10 layers: attnlrp_recompute and gradient_rollout_recompute grow by at most 1.3x the floor per
layer, in at most 1.5x the time of the same method without recomputation.

    python benchmarks/depth.py [--layers 2 6] [--prompt 2048] [--methods forward captum attnlrp ...]
        [--repeats 3] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm import word_tokenizer  # noqa: E402  (the sibling benchmark's tokenizer)

# path: (the method's class, its ``recompute`` argument)
METHODS = {
    "attnlrp": ("AttnLRP", False), "attnlrp_recompute": ("AttnLRP", True),
    "gradient_rollout": ("GradientWeightedRollout", False),
    "gradient_rollout_recompute": ("GradientWeightedRollout", True),
    "value_zeroing": ("ValueZeroing", None), "alti": ("ALTI", None), "norm": ("AttentionNorm", None),
}
GEOMETRY = dict(hidden_size=1024, intermediate_size=2816, num_attention_heads=16, num_key_value_heads=4,
                vocab_size=32000)


def language_model(layers: int, positions: int, **geometry):
    """The probe's Llama-style causal LM with ``layers`` layers, random weights, float32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=layers, max_position_embeddings=max(4096, positions),
                         **{**GEOMETRY, **geometry})
    return LlamaForCausalLM(config).eval()


def explainer(path: str, model, tokenizer):
    """A callable ``(prompt_text, target_ids)`` for ``path``."""
    import torch
    from captum.attr import LayerGradientXActivation, LLMGradientAttribution, TextTokenInput

    import captum_attnflow
    from captum_attnflow import LLMAttentionAttribution

    if path == "forward":
        def forward(prompt, target):
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                model(torch.cat([ids, target[None]], 1))
        return forward
    if path == "captum":
        method = LLMGradientAttribution(LayerGradientXActivation(model, model.get_input_embeddings()), tokenizer)
        return lambda prompt, target: method.attribute(TextTokenInput(prompt, tokenizer), target=target)
    cls, recompute = METHODS[path]
    options = {} if recompute is None else {"recompute": recompute}
    method = LLMAttentionAttribution(getattr(captum_attnflow, cls)(model, **options), tokenizer)
    return lambda prompt, target: method.attribute(TextTokenInput(prompt, tokenizer), target=target,
                                                   show_progress=False)


def child(path: str, layers: int, args: argparse.Namespace) -> dict:
    """One measurement, in this (fresh) process: wall time and peak resident size."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    model = language_model(layers, args.prompt + 1)
    tokenizer = word_tokenizer(model.config.vocab_size)
    ids = torch.randint(1, model.config.vocab_size, (args.prompt + 1,))
    text = " ".join(f"t{i}" for i in ids[: args.prompt].tolist())
    call = explainer(path, model, tokenizer)
    call(" ".join(text.split()[:32]), ids[args.prompt :])  # warm-up
    start = time.perf_counter()
    call(text, ids[args.prompt :])
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10}


def floor_mib(prompt: int) -> float:
    """One layer's weights plus one layer's input (prompt + 1 tokens), float32, in MiB."""
    hidden, inter = GEOMETRY["hidden_size"], GEOMETRY["intermediate_size"]
    kv = hidden // GEOMETRY["num_attention_heads"] * GEOMETRY["num_key_value_heads"]
    weights = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter + 2 * hidden  # projections, two norms
    return 4 * (weights + (prompt + 1) * hidden) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", nargs=2, type=int, default=[2, 6], help="the two depths compared")
    parser.add_argument("--prompt", type=int, default=2048, help="prompt tokens (one output token follows)")
    parser.add_argument("--methods", nargs="+", choices=["forward", "captum", *METHODS],
                        default=["forward", "captum", "attnlrp", "attnlrp_recompute", "gradient_rollout",
                                 "gradient_rollout_recompute"], help="the paths measured, in order")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per path and depth")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--child", nargs=2, metavar=("PATH", "LAYERS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args)))
        return

    low, high = args.layers
    floor = floor_mib(args.prompt)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    print(f"{machine}, python {platform.python_version()}, 1-minute load at start {os.getloadavg()[0]:.1f}; "
          f"Llama-style geometry (hidden 1024, 16/4 heads, intermediate 2816), float32, {args.prompt} + 1 tokens, "
          f"{args.repeats} fresh processes per cell; floor (one layer's weights + input) {floor:.0f} MiB")
    print(f"{'path':27} {f'peak @{low} MiB':>15} {f'peak @{high} MiB':>15} {'growth/layer MiB':>17} "
          f"{'vs floor':>10} {f'time @{low}':>9} {f'time @{high}':>9} {'time vs without':>15}")
    # Repeats outermost: each path's cells spread over the run, as the machine's load moves.
    cells: dict[str, dict[int, list[dict]]] = {path: {low: [], high: []} for path in args.methods}
    environment = {**os.environ, "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_", "65536")}
    for repeat in range(args.repeats):
        for path in args.methods:
            for layers in (low, high):
                command = [sys.executable, __file__, "--child", path, str(layers), "--prompt", str(args.prompt)]
                if args.threads:
                    command += ["--threads", str(args.threads)]
                run = subprocess.run(command, capture_output=True, text=True, env=environment)
                if run.returncode != 0:
                    print(f"# {path} {layers} layers failed: {run.stderr.strip().splitlines()[-1]}", flush=True)
                    continue
                cells[path][layers].append(json.loads(run.stdout.strip().splitlines()[-1]))
                print(f"# repeat {repeat + 1}: {path}, {layers} layers: {cells[path][layers][-1]}, "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"{'path':27} {f'peak @{low} MiB':>15} {f'peak @{high} MiB':>15} {'growth/layer MiB':>17} "
          f"{'vs floor':>10} {f'time @{low}':>9} {f'time @{high}':>9} {'time vs without':>15}")
    times: dict[str, float] = {}
    for path in args.methods:
        if not cells[path][low] or not cells[path][high]:
            continue
        peaks = {d: [c["mib"] for c in cells[path][d]] for d in (low, high)}
        growth = ((min(peaks[high]) - max(peaks[low])) / (high - low), (max(peaks[high]) - min(peaks[low])) / (high - low))
        seconds = {d: statistics.median(c["seconds"] for c in cells[path][d]) for d in (low, high)}
        times[path] = seconds[high]
        without = times.get(path.removesuffix("_recompute")) if path.endswith("_recompute") else None
        ratio = f"{seconds[high] / without:14.2f}x" if without else ""
        print(f"{path:27} {min(peaks[low]):6.0f}-{max(peaks[low]):<8.0f} {min(peaks[high]):6.0f}-{max(peaks[high]):<8.0f} "
              f"{growth[0]:7.0f}-{growth[1]:<9.0f} {growth[0] / floor:4.2f}-{growth[1] / floor:<4.2f}x "
              f"{seconds[low]:8.1f}s {seconds[high]:8.1f}s {ratio}", flush=True)
    print(f"1-minute load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
