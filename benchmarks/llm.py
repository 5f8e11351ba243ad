"""Memory and time of every method through ``LLMAttentionAttribution`` on long prompts, beside
the model's own forward and Captum's ``LLMGradientAttribution``.

GPT-2-small geometry (L=12, H=12, hidden 768, random weights from a config, no download), CPU,
a word-level tokenizer over the names ``t0 .. t50256`` (one token per id). Each cell runs in a
fresh process, so each peak resident size (``ru_maxrss``) is that call's own. The paths
(``--methods``):

* forward: the model's sdpa forward over prompt + output, no gradients (the reference cost);
* captum: Captum's ``LLMGradientAttribution(LayerGradientXActivation(model, wte))`` explaining
  the given output tokens (one forward and backward per output token);
* raw, rollout, flow: ``LLMAttentionAttribution(RawAttention(model))`` (``AttentionRollout``,
  ``AttentionFlow``) at the last layer, all output tokens from one forward on the lean capture
  (queries and keys kept, each layer's head-fused rows recomputed in row blocks);
* stored_rollout: rollout with ``lean=False`` (eager attention, every layer's (H, n, n)
  probabilities stored): what the wrapper did before it ran on the lean capture;
* gradient_rollout: ``LLMAttentionAttribution(GradientWeightedRollout(model))``, each written
  token explained by its own logit (one forward, one backward per output token, each layer's
  gradient-weighted map recomputed in row blocks);
* stored: the same with ``GradientWeightedRollout(model, lean=False)`` (eager attention, every
  layer's probabilities and their gradients kept);
* attnlrp: ``LLMAttentionAttribution(AttnLRP(model))``.

Printed per cell: peak RSS, wall time of one call (after a warm-up at a 32-token prompt), and both
as ratios to the baseline's (``--baseline``, Captum's by default) from the same run. Targets: at
16 output tokens after 1536 prompt tokens, gradient_rollout and attnlrp at most 1.15x Captum's
peak memory and no slower; at 16 after 4096, raw and rollout at most 1.3x the forward's peak
memory and 2x its time (``--baseline forward``).

On a GPU (``--device cuda``) memory is the peak allocated above the model; the issue's table
there is Llama-3.2-1B's geometry in bfloat16:

    python benchmarks/llm.py [--cases 1536:16 512:1 ...] [--methods forward captum rollout ...]
        [--baseline captum|forward] [--threads N]
    python benchmarks/llm.py --device cuda --dtype bfloat16 --geometry llama-3.2-1b \
        --cases 2048:1 4096:16 8192:1 16384:1 --methods forward captum attnlrp rollout raw
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

# path: (the method's class, its ``lean`` argument)
METHODS = {
    "raw": ("RawAttention", None), "rollout": ("AttentionRollout", None), "flow": ("AttentionFlow", None),
    "stored_rollout": ("AttentionRollout", False), "gradient_rollout": ("GradientWeightedRollout", None),
    "stored": ("GradientWeightedRollout", False), "attnlrp": ("AttnLRP", None),
}


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
    from captum_attnflow import LLMAttentionAttribution

    if path == "forward":
        def forward(prompt, target):
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                model(torch.cat([ids, target[None]], 1).to(model.device))
        return forward
    if path == "captum":
        method = LLMGradientAttribution(LayerGradientXActivation(model, model.get_input_embeddings()), tokenizer)
    else:
        cls, lean = METHODS[path]
        options = {} if lean is None else {"lean": lean}  # AttnLRP has one path
        method = LLMAttentionAttribution(getattr(captum_attnflow, cls)(model, **options), tokenizer)
    options = {} if path == "captum" else {"show_progress": False}

    def attribute(prompt, target):
        from captum.attr import TextTokenInput

        return method.attribute(TextTokenInput(prompt, tokenizer), target=target, **options)

    return attribute


def language_model(geometry: str, positions: int, device: str, dtype: str):
    """A causal LM with random weights: GPT-2-small, or Llama-3.2-1B's geometry (16 layers, 32
    query heads sharing 8 key heads, hidden 2048), built on ``device`` in ``dtype``."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    if geometry == "gpt2-small":
        config, cls = GPT2Config(n_positions=max(1024, positions)), GPT2LMHeadModel
    else:
        config = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                             num_key_value_heads=8, head_dim=64, vocab_size=128256, rope_theta=500000.0,
                             max_position_embeddings=max(131072, positions), tie_word_embeddings=True)
        cls = LlamaForCausalLM
    with torch.device(device):  # initialised where it runs: a 1B model's random init on the CPU takes a while
        return cls(config).to(getattr(torch, dtype)).eval()


def child(path: str, prompt_length: int, outputs: int, args: argparse.Namespace) -> dict:
    """One measurement, in this (fresh) process: wall time, and peak memory (the process's peak
    resident size on the CPU; on CUDA the peak allocated above the model)."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = language_model(args.geometry, prompt_length + outputs, args.device, args.dtype)
    tokenizer = word_tokenizer(model.config.vocab_size)
    ids = torch.randint(1, model.config.vocab_size, (prompt_length + outputs,))
    text = " ".join(f"t{i}" for i in ids[:prompt_length].tolist())
    call = explainer(path, model, tokenizer)
    call(" ".join(text.split()[:32]), ids[prompt_length : prompt_length + outputs])  # warm-up
    cuda = torch.device(args.device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        held = torch.cuda.memory_allocated()
    start = time.perf_counter()
    call(text, ids[prompt_length:])
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if cuda:
        return {"seconds": seconds, "memory_gib": (torch.cuda.max_memory_allocated() - held) / 2**30}
    return {"seconds": seconds, "memory_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=["1536:16", "512:1", "1024:1", "2048:1", "4096:1"],
                        help="PROMPT:OUTPUT token counts")
    parser.add_argument("--methods", nargs="+", choices=["forward", "captum", *METHODS],
                        default=["forward", "captum", "gradient_rollout", "attnlrp"], help="the paths measured, in order")
    parser.add_argument("--baseline", default="captum", help="the path the ratios divide by (default: captum)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--geometry", choices=["gpt2-small", "llama-3.2-1b"], default="gpt2-small")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--dtype", default="float32", help="the model's dtype: float32 (default) or bfloat16")
    parser.add_argument("--child", nargs=3, metavar=("PATH", "PROMPT", "OUTPUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        path, prompt_length, outputs = args.child
        print(json.dumps(child(path, int(prompt_length), int(outputs), args)))
        return

    baseline = args.baseline
    paths = [baseline] + [path for path in args.methods if path != baseline]
    if args.device == "cpu":
        machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    else:
        import torch

        machine = torch.cuda.get_device_name(torch.device(args.device))
    print(f"{machine}, python {platform.python_version()}, 1-minute load at start {os.getloadavg()[0]:.1f}; "
          f"{args.geometry} geometry in {args.dtype}, random weights, B = 1, one fresh process per cell")
    memory = "peak RSS" if args.device == "cpu" else "GPU peak"  # on CUDA: allocated above the model
    print(f"{'prompt':>6} {'out':>4} {'path':17} {memory:>9} {'time':>9} {'mem / ' + baseline:>13} {'time / ' + baseline:>14}")
    for case in args.cases:
        prompt_length, outputs = (int(part) for part in case.split(":"))
        results = {}
        for path in paths:
            command = [sys.executable, __file__, "--child", path, str(prompt_length), str(outputs),
                       "--geometry", args.geometry, "--device", args.device, "--dtype", args.dtype]
            if args.threads:
                command += ["--threads", str(args.threads)]
            run = subprocess.run(command, capture_output=True, text=True)
            if run.returncode != 0:
                print(f"{prompt_length:6d} {outputs:4d} {path:17} failed: {run.stderr.strip().splitlines()[-1]}")
                continue
            results[path] = json.loads(run.stdout.strip().splitlines()[-1])
            base = results.get(baseline)
            result = results[path]
            ratios = (
                f"{result['memory_gib'] / base['memory_gib']:12.2f}x {result['seconds'] / base['seconds']:13.2f}x"
                if base else ""
            )
            print(f"{prompt_length:6d} {outputs:4d} {path:17} {result['memory_gib']:7.2f} G {result['seconds']:8.2f}s {ratios}",
                  flush=True)
    print(f"1-minute load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
