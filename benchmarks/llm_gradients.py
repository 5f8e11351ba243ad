"""Memory and time of the gradient-based attention methods on long prompts, beside Captum's own.

GPT-2-small geometry (L=12, H=12, hidden 768, random weights from a config, no download), CPU,
a word-level tokenizer over the names ``t0 .. t50256`` (one token per id). Each cell runs in a
fresh process, so each peak resident size (``ru_maxrss``) is that call's own:

* forward: the model's sdpa forward over prompt + output, no gradients (the reference cost);
* captum: Captum's ``LLMGradientAttribution(LayerGradientXActivation(model, wte))`` explaining
  the given output tokens (one forward and backward per output token);
* gradient_rollout: ``LLMAttentionAttribution(GradientWeightedRollout(model))``, each written
  token explained by its own logit (one forward, one backward per output token, each layer's
  gradient-weighted map recomputed in row blocks);
* stored: the same with ``GradientWeightedRollout(model, lean=False)`` (eager attention, every
  layer's probabilities and their gradients kept), only with ``--stored``;
* attnlrp: ``LLMAttentionAttribution(AttnLRP(model))``, when the package has it.

Printed per cell: peak RSS, wall time of one call (after a warm-up at a 32-token prompt), and both
as ratios to Captum's from the same run. Targets (16 output tokens after 1536 prompt tokens):
gradient_rollout and attnlrp at most 1.15x Captum's peak memory and no slower than it.

    python benchmarks/llm_gradients.py [--cases 1536:16 512:1 1024:1 2048:1 4096:1] [--stored] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

BASELINE = "captum"


def word_tokenizer(vocabulary: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocabulary)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", pad_token="t0")


def explainer(path: str, model, tokenizer):
    """A callable ``(prompt_text, target_ids)`` for ``path``."""
    import torch
    from captum.attr import LayerGradientXActivation, LLMGradientAttribution

    import captum_attnflow
    from captum_attnflow import GradientWeightedRollout, LLMAttentionAttribution

    if path == "forward":
        def forward(prompt, target):
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                model(torch.cat([ids, target[None]], 1))
        return forward
    if path == "captum":
        method = LLMGradientAttribution(LayerGradientXActivation(model, model.transformer.wte), tokenizer)
    elif path == "attnlrp":
        method = LLMAttentionAttribution(captum_attnflow.AttnLRP(model), tokenizer)
    else:
        method = LLMAttentionAttribution(GradientWeightedRollout(model, lean=path != "stored"), tokenizer)
    options = {} if path == "captum" else {"show_progress": False}

    def attribute(prompt, target):
        from captum.attr import TextTokenInput

        return method.attribute(TextTokenInput(prompt, tokenizer), target=target, **options)

    return attribute


def child(path: str, prompt_length: int, outputs: int, threads: int | None) -> dict:
    """One measurement, in this (fresh) process."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = GPT2Config(n_positions=max(1024, prompt_length + outputs))
    model = GPT2LMHeadModel(config).eval()
    tokenizer = word_tokenizer(config.vocab_size)
    ids = torch.randint(1, config.vocab_size, (prompt_length + outputs,))
    text = " ".join(f"t{i}" for i in ids[:prompt_length].tolist())
    call = explainer(path, model, tokenizer)
    call(" ".join(text.split()[:32]), ids[prompt_length : prompt_length + outputs])  # warm-up
    start = time.perf_counter()
    call(text, ids[prompt_length:])
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=["1536:16", "512:1", "1024:1", "2048:1", "4096:1"],
                        help="PROMPT:OUTPUT token counts")
    parser.add_argument("--stored", action="store_true", help="also the stored-probabilities path (slow, large)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--child", nargs=3, metavar=("PATH", "PROMPT", "OUTPUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        path, prompt_length, outputs = args.child
        print(json.dumps(child(path, int(prompt_length), int(outputs), args.threads)))
        return

    import captum_attnflow

    paths = ["forward", BASELINE, "gradient_rollout"] + (["stored"] if args.stored else [])
    paths += ["attnlrp"] if hasattr(captum_attnflow, "AttnLRP") else []
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"1-minute load at start {os.getloadavg()[0]:.1f}; GPT-2-small geometry, random weights, B = 1, "
          "one fresh process per cell")
    print(f"{'prompt':>6} {'out':>4} {'path':17} {'peak RSS':>9} {'time':>9} {'RSS / captum':>13} {'time / captum':>14}")
    for case in args.cases:
        prompt_length, outputs = (int(part) for part in case.split(":"))
        results = {}
        for path in paths:
            command = [sys.executable, __file__, "--child", path, str(prompt_length), str(outputs)]
            if args.threads:
                command += ["--threads", str(args.threads)]
            run = subprocess.run(command, capture_output=True, text=True)
            if run.returncode != 0:
                print(f"{prompt_length:6d} {outputs:4d} {path:17} failed: {run.stderr.strip().splitlines()[-1]}")
                continue
            results[path] = json.loads(run.stdout.strip().splitlines()[-1])
            base = results.get(BASELINE)
            result = results[path]
            ratios = (
                f"{result['rss_gib'] / base['rss_gib']:12.2f}x {result['seconds'] / base['seconds']:13.2f}x"
                if base else ""
            )
            print(f"{prompt_length:6d} {outputs:4d} {path:17} {result['rss_gib']:7.2f} G {result['seconds']:8.2f}s {ratios}",
                  flush=True)
    print(f"1-minute load at the end {os.getloadavg()[0]:.1f}; targets at 1536:16: ours <= 1.15x captum's peak RSS, "
          "time <= captum's")


if __name__ == "__main__":
    main()
