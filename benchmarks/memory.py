"""Memory and time of attention rollout on long inputs: lean capture against stored maps.

For each geometry and length, three fresh processes (so each peak is its own) run on one
sequence of random token ids, random weights from a config (no download), CPU:

* baseline: the model's sdpa forward alone, as loaded;
* stored maps: ``AttentionRollout(model, lean=False).attribute(ids, layer=None)``: eager
  attention returns every layer's (B, H, n, n) maps, L·H·n² numbers, then rollout;
* lean: ``AttentionRollout(model).attribute(ids, layer=None)``: each layer reduced to its
  head-fused (B, n, n) matrix during the forward (L·n² numbers), the model computing its
  outputs with sdpa.

Printed per case: peak resident memory of the process during its first call (``ru_maxrss``; on
CUDA the peak allocated GPU memory is printed too), the median wall time of ``--repeats`` calls (after one warm-up at
n = 64; the stored maps, which are no target, are timed once), and the ratios to the sdpa
forward from the same run. Geometries: BERT-base (L=12, H=12, hidden 768) and a
Llama-style decoder (L=12, H=12 query heads sharing 4 key heads, hidden 768, rotary positions).
Targets at n = 4096: lean rollout within 1.5 GiB peak RSS and 1.5x the sdpa forward's time.

    python benchmarks/memory.py [--lengths 512 2048 4096] [--geometries bert llama] [--threads N] [--repeats 3]
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

PATHS = ("sdpa forward", "stored maps", "lean")


def build(geometry: str, n: int):
    import torch
    from transformers import BertConfig, BertModel, LlamaConfig, LlamaModel

    torch.manual_seed(0)
    if geometry == "bert":
        return BertModel(BertConfig(max_position_embeddings=max(512, n))).eval()
    config = LlamaConfig(
        hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
        num_key_value_heads=4, max_position_embeddings=max(512, n), vocab_size=32000,
    )
    return LlamaModel(config).eval()


def child(geometry: str, n: int, path: str, threads: int | None, repeats: int) -> dict:
    """One measurement, in this (fresh) process."""
    import torch

    from captum_attnflow import AttentionRollout

    if threads:
        torch.set_num_threads(threads)
    model = build(geometry, n)
    ids = torch.randint(1000, 30000, (1, n))

    def call(inputs):
        if path == "sdpa forward":
            with torch.no_grad():
                return model(inputs).last_hidden_state
        return AttentionRollout(model, lean=path == "lean").attribute(inputs, layer=None)

    call(ids[:, :64])  # warm-up: numba and torch kernels, outside the timed call
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    times = []
    for repeat in range(1 if path == "stored maps" else repeats):
        start = time.perf_counter()
        call(ids)
        times.append(time.perf_counter() - start)
        if repeat == 0:  # the peak of one call; repeated calls only add the allocator's leftovers
            peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            gpu = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    seconds = statistics.median(times)
    return {"seconds": seconds, "rss_gib": peak_kib / 2**20, "gpu_gib": gpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 4096])
    parser.add_argument("--geometries", nargs="+", default=["bert", "llama"], choices=["bert", "llama"])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per case; the median is printed")
    parser.add_argument("--child", nargs=3, metavar=("GEOMETRY", "N", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        geometry, n, path = args.child
        print(json.dumps(child(geometry, int(n), path, args.threads, args.repeats)))
        return

    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"1-minute load at start {os.getloadavg()[0]:.1f}; B = 1, random weights, one fresh process per cell")
    print(f"{'geometry':9} {'n':>5} {'path':13} {'peak RSS':>9} {'time':>8} {'RSS ratio':>10} {'time ratio':>11}")
    for geometry in args.geometries:
        for n in args.lengths:
            results = {}
            for path in PATHS:
                command = [sys.executable, __file__, "--child", geometry, str(n), path, "--repeats", str(args.repeats)]
                if args.threads:
                    command += ["--threads", str(args.threads)]
                output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
                results[path] = json.loads(output.strip().splitlines()[-1])
            base = results["sdpa forward"]
            for path, result in results.items():
                gpu = f"  GPU peak {result['gpu_gib']:.2f} GiB" if result["gpu_gib"] is not None else ""
                print(f"{geometry:9} {n:5d} {path:13} {result['rss_gib']:7.2f} G {result['seconds']:7.2f}s "
                      f"{result['rss_gib'] / base['rss_gib']:9.2f}x {result['seconds'] / base['seconds']:10.2f}x{gpu}",
                      flush=True)
    print("targets at n = 4096: lean <= 1.5 GiB peak RSS and <= 1.5x the sdpa forward's time")


if __name__ == "__main__":
    main()
