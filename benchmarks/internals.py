"""Cost of the methods that read gradients or model internals, against the forward they explain.

BERT-base geometry from a config (L=12, H=12, hidden 768, random weights, no download), a sequence
classifier, B = 1, CPU. In one run it times, after one warm-up of each:

* baseline: the eager forward pass with ``output_attentions=True`` (what the stored-maps
  attention methods run);
* ``GradientWeightedRollout.attribute(ids, target=0, layer=None)``: a forward and a backward;
* ``AttnLRP.attribute(ids, target=0)``: a forward and a backward with its rules, against the
  model's own sdpa forward and backward of the same logit to the input embeddings (what
  Captum's ``Saliency`` on the embeddings runs);
* ``ALTI.attribute(ids, layer=None)``: a forward and the decomposition of every layer;
* the floor under ALTI: the transformed vectors :math:`T_i(x_j) = \\sum_h \\alpha^h_{ij} f^h(x_j)`
  of every pair and layer (n^2 H D multiply-adds a layer, what any exact ALTI computes) by
  torch's batched matrix product alone, in row blocks into one buffer, with no distance taken:
  the forward plus this is the least an exact ALTI costs with this machine's BLAS;
* ``ValueZeroing.attribute(ids, layer=None)`` at each ``--vz-n`` length (n variants of n tokens
  per layer re-run through the rest of the block), with the forward at that length.

Every repeat times the calls back to back, so load from other processes hits them alike; the
script prints medians and the median of the per-repeat ratios. Targets: gradient-weighted
rollout <= 2.5x the forward, ALTI <= 2x at n = 512; AttnLRP <= 1.5x a forward and backward;
value zeroing at n = 128 within 30 s.

    python benchmarks/internals.py [--n 512] [--vz-n 32 64 128] [--repeats 3] [--threads N]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import TYPE_CHECKING

# The heavy imports are in the functions that use them, so that --help answers at once.
if TYPE_CHECKING:
    from transformers import BertConfig


def seconds(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def timed(calls: dict, repeats: int) -> dict[str, list[float]]:
    for call in calls.values():  # warm-up
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            times[name].append(seconds(call))
    return times


def report(times: dict[str, list[float]], baseline: str) -> None:
    base = statistics.median(times[baseline])
    print(f"  {baseline:<28} {base:8.3f} s")
    for name, values in times.items():
        if name != baseline:
            ratios = [value / reference for value, reference in zip(values, times[baseline])]
            print(f"  {name:<28} {statistics.median(values):8.3f} s   {statistics.median(ratios):5.2f}x the {baseline}")


def transformed_vectors_floor(config: BertConfig, n: int, rows: int = 16):
    """A call that computes every layer's :math:`T_i(x_j)` (n, n, D) with ``torch.bmm`` over
    blocks of ``rows`` query rows: (n_j, rows, H) weights @ (n_j, H, D) projected values."""
    import torch

    heads, size, layers = config.num_attention_heads, config.hidden_size, config.num_hidden_layers
    weights = torch.softmax(torch.randn(n, n, heads), 1)  # (n_j, n_i, H)
    projected = torch.randn(n, heads, size)  # (n_j, H, D)
    buffer = torch.empty(n, rows, size)

    def call():
        for _ in range(layers):
            for first in range(0, n, rows):
                torch.bmm(weights[:, first:first + rows], projected, out=buffer)

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=512, help="sequence length of the GWR and ALTI rows (default 512)")
    parser.add_argument("--vz-n", type=int, nargs="*", default=[32, 64, 128], help="value-zeroing lengths")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (default 3)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from captum_attnflow import ALTI, AttnLRP, GradientWeightedRollout, ValueZeroing

    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}")

    torch.manual_seed(0)
    config = BertConfig(max_position_embeddings=max(512, args.n, *args.vz_n))
    model = BertForSequenceClassification(config).eval()
    gradient_rollout, alti, zeroing = GradientWeightedRollout(model), ALTI(model), ValueZeroing(model)

    def forward(ids):
        with torch.no_grad(), torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            config._attn_implementation = "eager"
            try:
                return model(ids, output_attentions=True)
            finally:
                config._attn_implementation = "sdpa"

    ids = torch.randint(1000, config.vocab_size, (1, args.n))
    transformed_vectors = transformed_vectors_floor(config, args.n)
    print(f"BERT-base, n = {args.n}, B = 1, medians of {args.repeats}:")
    times = timed({
        "eager forward": lambda: forward(ids),
        "GradientWeightedRollout": lambda: gradient_rollout.attribute(ids, target=0, layer=None, show_progress=False),
        "ALTI": lambda: alti.attribute(ids, layer=None, show_progress=False),
        "T_i(x_j) by bmm alone": transformed_vectors,
    }, args.repeats)
    report(times, "eager forward")
    floor = [f + t for f, t in zip(times["eager forward"], times["T_i(x_j) by bmm alone"])]
    ratios = [value / reference for value, reference in zip(floor, times["eager forward"])]
    print(f"  ALTI's floor (forward + T_i(x_j) by bmm): {statistics.median(ratios):5.2f}x the eager forward")
    lrp = AttnLRP(model)

    def forward_backward(ids):
        embeddings = model.get_input_embeddings()(ids).detach().requires_grad_()
        logit = model(inputs_embeds=embeddings).logits[:, 0].sum()
        return torch.autograd.grad(logit, embeddings)

    print(f"BERT-base, n = {args.n}, B = 1, AttnLRP against the sdpa forward + backward, medians of {args.repeats}:")
    report(timed({
        "forward + backward": lambda: forward_backward(ids),
        "AttnLRP": lambda: lrp.attribute(ids, target=0, show_progress=False),
    }, args.repeats), "forward + backward")
    for n in args.vz_n:
        short = torch.randint(1000, config.vocab_size, (1, n))
        print(f"BERT-base, n = {n}, B = 1, value zeroing, medians of {args.repeats}:")
        report(timed({
            "eager forward": lambda: forward(short),
            "ValueZeroing": lambda: zeroing.attribute(short, layer=None, show_progress=False),
        }, args.repeats), "eager forward")


if __name__ == "__main__":
    main()
