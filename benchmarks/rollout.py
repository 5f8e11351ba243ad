"""Cost of attention rollout against the model forward it explains (issue 3, item 5).

BERT-base geometry from a config (L=12, H=12, hidden 768, random weights, no download), one
sequence of n=512 tokens, CPU, eager attention. In one run it times

* baseline: the forward pass with ``output_attentions=True``;
* ours: ``rollout_rows(attentions, position, layer=None)``, the rollout of one position at
  every layer, which is what ``AttentionRollout.attribute(..., layer=None)`` computes on top of
  that forward, checks included;
* for reference, the full-matrix ``rollout`` (all positions, O(L n^3)).

After one warm-up of each, every repeat times the three back to back, so load from other
processes hits them alike; the script prints medians and the median of the per-repeat ratios.
Target: rollout_rows <= 2% of the forward.

    python benchmarks/rollout.py [--n 512] [--repeats 5] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time


def seconds(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=512, help="sequence length (default 512)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats of each (default 5)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    import torch  # after the arguments: --help answers at once
    from transformers import BertConfig, BertModel

    from captum_attnflow.functional import rollout, rollout_rows

    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    config = BertConfig(max_position_embeddings=max(512, args.n), attn_implementation="eager")
    model = BertModel(config).eval()
    inputs = torch.randint(1000, config.vocab_size, (1, args.n))

    def forward():
        with torch.no_grad():
            return model(inputs, output_attentions=True).attentions

    attentions = forward()
    calls = {
        "forward": forward,
        "rows": lambda: rollout_rows(attentions, position=0, layer=None),
        "full": lambda: rollout(attentions),
    }
    for call in calls.values():
        call()
    times = {name: [] for name in calls}
    for _ in range(args.repeats):
        for name, call in calls.items():
            times[name].append(seconds(call))
    forward_s, rows_s, full_s = (statistics.median(times[name]) for name in calls)
    rows_ratio = statistics.median(r / f for r, f in zip(times["rows"], times["forward"]))
    full_ratio = statistics.median(r / f for r, f in zip(times["full"], times["forward"]))

    print(f"BERT-base geometry, L={config.num_hidden_layers} H={config.num_attention_heads} "
          f"hidden={config.hidden_size}, B=1, n={args.n}, CPU, {torch.get_num_threads()} threads, eager attention, "
          f"median of {args.repeats}")
    print(f"baseline  forward with attentions        {forward_s * 1e3:9.1f} ms")
    print(f"ours      rollout_rows(layer=None)       {rows_s * 1e3:9.1f} ms   ratio {rows_ratio:6.2%}  (target <= 2%)")
    print(f"reference full rollout (L, B, n, n)      {full_s * 1e3:9.1f} ms   ratio {full_ratio:6.2%}")


if __name__ == "__main__":
    main()
