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
at the smaller, and the reverse), that growth over the floor, the CPU time of the call at each
depth (median over the repeats; with ``--threads 1`` the work done, which other jobs on the machine
change less than the wall time, also printed) and its ratio to the same method's without
recomputation (range over the repeats). Targets at 2 against 6 or 10 layers: attnlrp_recompute and
gradient_rollout_recompute grow by at most 1.3x the floor per layer, in at most 1.5x the time of the
same method without recomputation.

    python benchmarks/depth.py [--layers 2 6] [--prompt 2048] [--methods forward captum attnlrp ...]
        [--repeats 3] [--threads N] [--results cells.jsonl]
    python benchmarks/depth.py --computed 78 1.13   # longest prompts on an 80 GB GPU, computed
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
    """One measurement, in this (fresh) process: wall time, CPU time (user + system, all threads)
    and peak resident size."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    model = language_model(layers, args.prompt + 1)
    tokenizer = word_tokenizer(model.config.vocab_size)
    ids = torch.randint(1, model.config.vocab_size, (args.prompt + 1,))
    text = " ".join(f"t{i}" for i in ids[: args.prompt].tolist())
    call = explainer(path, model, tokenizer)
    call(" ".join(text.split()[:32]), ids[args.prompt :])  # warm-up
    start, cpu = time.perf_counter(), time.process_time()
    call(text, ids[args.prompt :])
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"seconds": seconds, "cpu": cpu, "mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10}


def floor_mib(prompt: int) -> float:
    """One layer's weights plus one layer's input (prompt + 1 tokens), float32, in MiB."""
    hidden, inter = GEOMETRY["hidden_size"], GEOMETRY["intermediate_size"]
    kv = hidden // GEOMETRY["num_attention_heads"] * GEOMETRY["num_key_value_heads"]
    weights = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter + 2 * hidden  # projections, two norms
    return 4 * (weights + (prompt + 1) * hidden) / 2**20


# The probe's cost per token of each kept layer, in numbers (float32 there), from the growth per
# layer measured at 2048 + 1 tokens (2 against 6 layers, this script's table in docs/performance.md)
# less the layer's weights: as a multiple of the widths a layer's backward pass saves
# (:func:`saved_widths`) without recomputation, and of the hidden size with it (the block's input).
MEASURED = {
    "captum": {"widths": 1.055}, "attnlrp": {"widths": 0.841}, "gradient_rollout": {"widths": 1.056},
    "attnlrp_recompute": {"hidden": 1.016, "widths": 0.841},
    "gradient_rollout_recompute": {"hidden": 1.030, "widths": 1.056},
}
# Geometries of the computed table: layers, hidden size, key-value width, intermediate size,
# vocabulary, parameters (bfloat16 weights), context length.
TARGETS = {
    "Llama-3.2-1B": dict(layers=16, hidden=2048, kv=512, intermediate=8192, vocabulary=128256, parameters=1.236e9,
                         context=131072),
    "Llama-3.1-8B": dict(layers=32, hidden=4096, kv=1024, intermediate=14336, vocabulary=128256, parameters=8.03e9,
                         context=131072),
}


def saved_widths(hidden: int, kv: int, intermediate: int) -> int:
    """Numbers per token that a Llama block's backward pass saves, counted from its operations:
    the two norms' inputs and outputs, the attention's inputs and output (7 D with the residual
    stream and the output projection's input), keys and values (2 D_kv), the gated feed-forward's
    gate, up, activated and product (4 I)."""
    return 7 * hidden + 2 * kv + 4 * intermediate


def computed_gib(path: str, geometry: dict, tokens: int, gpu_factor: float) -> float:
    """The computed peak GPU memory in GiB of one call of ``path`` on ``tokens`` tokens in bfloat16:
    the weights, 1 GiB of row blocks and allocator slack, and per token the kept layers (all L
    layers' activations, or each layer's input with recomputation, plus one layer's activations),
    the embeddings and their gradient (4 D), with recomputation the gradients in flight (4 D),
    and for Captum every position's logits and their gradient (2 V). ``gpu_factor`` scales the
    activations measured on the CPU in float32 to a GPU in bfloat16 (whose norms keep float32
    copies)."""
    hidden, vocabulary = geometry["hidden"], geometry["vocabulary"]
    layer = gpu_factor * MEASURED[path]["widths"] * saved_widths(hidden, geometry["kv"], geometry["intermediate"])
    if "hidden" in MEASURED[path]:
        per_token = geometry["layers"] * MEASURED[path]["hidden"] * hidden + layer + 8 * hidden
    else:
        per_token = geometry["layers"] * layer + 4 * hidden + (2 * vocabulary if path == "captum" else 0)
    return (2 * geometry["parameters"] + 2**30 + 2 * per_token * tokens) / 2**30


def computed_table(budget_gib: float, gpu_factor: float) -> None:
    """Print, computed and not measured, the longest prompt of each path that fits ``budget_gib``
    on one GPU for :data:`TARGETS` (beyond the model's context in brackets), and the memory of
    32768 + 1 tokens."""
    print(f"computed, not measured: one GPU with {budget_gib:g} GiB for tensors, bfloat16, B = 1; "
          f"the probe's per-layer costs x {gpu_factor:g}")
    print(f"{'path':27} " + " ".join(f"{name + ' longest':>22} {'GiB at 32k':>10}" for name in TARGETS))
    for path in MEASURED:
        cells = []
        for geometry in TARGETS.values():
            per_token = computed_gib(path, geometry, 1, gpu_factor) - computed_gib(path, geometry, 0, gpu_factor)
            longest = int((budget_gib - computed_gib(path, geometry, 0, gpu_factor)) / per_token)
            shown = f"{geometry['context']} ({longest})" if longest > geometry["context"] else str(longest)
            cells.append(f"{shown:>22} {computed_gib(path, geometry, 32769, gpu_factor):10.1f}")
        print(f"{path:27} " + " ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", nargs=2, type=int, default=[2, 6], help="the two depths compared")
    parser.add_argument("--prompt", type=int, default=2048, help="prompt tokens (one output token follows)")
    parser.add_argument("--methods", nargs="+", choices=["forward", "captum", *METHODS],
                        default=["forward", "captum", "attnlrp", "attnlrp_recompute", "gradient_rollout",
                                 "gradient_rollout_recompute"], help="the paths measured, in order")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per path and depth")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--results", default=None,
                        help="a JSON-lines file of the cells measured: those already in it are not run again "
                             "(a run cut short goes on where it stopped)")
    parser.add_argument("--computed", nargs=2, type=float, metavar=("GIB", "GPU_FACTOR"), default=None,
                        help="print instead the longest prompt per path on one GPU with GIB for tensors, computed from "
                             "the per-layer costs measured here (MEASURED) times GPU_FACTOR")
    parser.add_argument("--child", nargs=2, metavar=("PATH", "LAYERS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args)))
        return
    if args.computed:
        computed_table(*args.computed)
        return

    low, high = args.layers
    floor = floor_mib(args.prompt)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    print(f"{machine}, python {platform.python_version()}, 1-minute load at start {os.getloadavg()[0]:.1f}; "
          f"Llama-style geometry (hidden 1024, 16/4 heads, intermediate 2816), float32, {args.prompt} + 1 tokens, "
          f"{args.repeats} fresh processes per cell, torch threads {args.threads or 'default'}; "
          f"floor (one layer's weights + input) {floor:.0f} MiB", flush=True)
    done = []
    if args.results and os.path.exists(args.results):
        with open(args.results) as lines:
            done = [json.loads(line) for line in lines if line.strip()]
    key = lambda cell: (cell["path"], cell["layers"], cell["repeat"], cell["prompt"])  # noqa: E731
    measured = {key(cell) for cell in done}
    # Repeats outermost: each path's cells spread over the run, as the machine's load moves.
    environment = {**os.environ, "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_", "65536")}
    for repeat in range(args.repeats):
        for path in args.methods:
            for layers in (low, high):
                cell = {"path": path, "layers": layers, "repeat": repeat, "prompt": args.prompt}
                if key(cell) in measured:
                    continue
                command = [sys.executable, __file__, "--child", path, str(layers), "--prompt", str(args.prompt)]
                if args.threads:
                    command += ["--threads", str(args.threads)]
                run = subprocess.run(command, capture_output=True, text=True, env=environment)
                if run.returncode != 0:
                    print(f"# {path} {layers} layers failed: {run.stderr.strip().splitlines()[-1:]}", flush=True)
                    continue
                cell.update(json.loads(run.stdout.strip().splitlines()[-1]), load=os.getloadavg()[0])
                done.append(cell)
                print(f"# {cell}", flush=True)
                if args.results:
                    with open(args.results, "a") as lines:
                        lines.write(json.dumps(cell) + "\n")
    print(f"{'path':27} {f'peak @{low} MiB':>15} {f'peak @{high} MiB':>15} {'growth/layer MiB':>17} "
          f"{'vs floor':>10} {f'cpu @{low}':>9} {f'cpu @{high}':>9} {'cpu vs without':>14} {f'wall @{high}':>9}")
    cpu: dict[str, list[float]] = {}
    for path in args.methods:
        cells = {d: [c for c in done if c["path"] == path and c["layers"] == d and c["prompt"] == args.prompt]
                 for d in (low, high)}
        if not cells[low] or not cells[high]:
            continue
        peaks = {d: [c["mib"] for c in cells[d]] for d in (low, high)}
        growth = ((min(peaks[high]) - max(peaks[low])) / (high - low), (max(peaks[high]) - min(peaks[low])) / (high - low))
        seconds = {d: [c["cpu"] for c in cells[d]] for d in (low, high)}
        cpu[path] = seconds[high]
        without = cpu.get(path.removesuffix("_recompute")) if path.endswith("_recompute") else None
        ratio = f"{min(seconds[high]) / max(without):5.2f}-{max(seconds[high]) / min(without):<5.2f}x" if without else ""
        wall = statistics.median(c["seconds"] for c in cells[high])
        print(f"{path:27} {min(peaks[low]):6.0f}-{max(peaks[low]):<8.0f} {min(peaks[high]):6.0f}-{max(peaks[high]):<8.0f} "
              f"{growth[0]:7.0f}-{growth[1]:<9.0f} {growth[0] / floor:4.2f}-{growth[1] / floor:<4.2f}x "
              f"{statistics.median(seconds[low]):8.1f}s {statistics.median(seconds[high]):8.1f}s {ratio:>14} "
              f"{wall:8.1f}s", flush=True)
    loads = [c["load"] for c in done if c["prompt"] == args.prompt]
    if loads:
        print(f"1-minute load after each cell: {min(loads):.1f}-{max(loads):.1f}; now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
