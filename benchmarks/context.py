"""Time and memory of per-source scores (which source the answer came from), beside one forward
of the same prompt and the peers' calls.

Two settings (``--setting``):

* ``bundled``: the bundled context task's model and prompt (the retrieval language model on a
  held-out prompt of 32 facts, each fact a source, its answer explained).
  Targets: raw attention and rollout within 2x one forward's time;
  gradient-weighted rollout and AttnLRP no slower than Captum's ``LLMGradientAttribution`` on the
  same prompt and answer; leave-one-out (F + 1 forwards) and ContextCite (64 ablations, where its
  package is installed) stated beside them.
* ``long``: GPT-2-small geometry (random weights from a config, no download), 4096 prompt tokens
  in 256 sources of 16 words, 4 answer tokens. Target: rollout's source scores within 1.3x the
  forward's peak memory and 2x its time.

Each cell runs in a fresh process (``ru_maxrss`` is that call's own peak), after a warm-up call on
a short prompt, and times the median of ``--repeats`` calls (5; a call on the bundled model takes
milliseconds); ratios are to the forward of the same run::

    python benchmarks/context.py --setting bundled
    python benchmarks/context.py --setting long --paths forward raw rollout
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

PATHS = ("forward", "raw", "rollout", "flow", "gradient_rollout", "alti", "attnlrp", "captum_gradient",
         "leave-one-out", "attntrace", "contextcite-64")
METHOD_CLASSES = {"raw": "RawAttention", "rollout": "AttentionRollout", "flow": "AttentionFlow",
                  "gradient_rollout": "GradientWeightedRollout", "alti": "ALTI", "attnlrp": "AttnLRP"}


def setting(name: str, short: bool = False):
    """``(model, tokenizer, prompt, answer)`` of a setting (``short``: the warm-up's small prompt)."""
    import torch
    from captum.attr import TextTemplateInput

    if name == "bundled":
        from captum_attnflow.benchmark.context import load_context_task

        model, tokenizer, examples = load_context_task(1, seed=4 if short else 12345)
        return model, tokenizer, examples[0].prompt, examples[0].answer
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocabulary = 50257
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocabulary)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", pad_token="t0")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_positions=4200)
    model = transformers.GPT2LMHeadModel(config).eval()
    generator = torch.Generator().manual_seed(0)
    sources, words_per_source = (4, 4) if short else (256, 16)
    ids = torch.randint(1, vocabulary, (sources, words_per_source), generator=generator)
    values = [" ".join(f"t{i}" for i in row.tolist()) for row in ids]
    prompt = TextTemplateInput(" ".join(["{}"] * sources), values=values)
    return model, tokenizer, prompt, " t11 t12 t13 t14"


def call(path: str, model, tokenizer, prompt, answer):
    import torch
    from captum.attr import LayerGradientXActivation, LLMGradientAttribution, TextTokenInput

    import captum_attnflow
    from captum_attnflow import LLMAttentionAttribution
    from captum_attnflow.benchmark.context_methods import available_peers

    if path == "forward":
        from captum_attnflow.attr.llm_inputs import template_prompt

        ids = torch.cat([template_prompt(prompt, tokenizer).ids,
                         torch.tensor(tokenizer.encode(answer, add_special_tokens=False))])[None]
        with torch.no_grad():
            model(ids)
        return
    if path == "captum_gradient":  # Captum's gradient call takes token inputs only: the same text
        explainer = LLMGradientAttribution(LayerGradientXActivation(model, model.get_input_embeddings()), tokenizer)
        explainer.attribute(TextTokenInput(prompt.to_model_input(), tokenizer), target=answer)
        return
    if path in METHOD_CLASSES:
        method = getattr(captum_attnflow, METHOD_CLASSES[path])(model)
        LLMAttentionAttribution(method, tokenizer).attribute(prompt, target=answer)
        return
    available_peers()[path](model, tokenizer, prompt, answer, 0)


def cell(name: str, path: str, repeats: int) -> dict:
    """Run one path in this process: warm-up on a short prompt, then ``repeats`` timed calls (their median)."""
    import torch

    torch.set_num_threads(int(os.environ.get("CONTEXT_THREADS", "2")))
    call(path, *setting(name, short=True))
    model, tokenizer, prompt, answer = setting(name)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call(path, model, tokenizer, prompt, answer)
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times), "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=("bundled", "long"), default="bundled")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=None)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per cell, their median printed (default 5)")
    parser.add_argument("--cell", nargs=2, metavar=("SETTING", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        print(json.dumps(cell(*args.cell, args.repeats)))
        return
    import importlib.util

    paths = args.paths or [p for p in PATHS if p != "contextcite-64" or importlib.util.find_spec("context_cite")]
    if args.setting == "long" and args.paths is None:
        paths = ["forward", "raw", "rollout"]
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
          f"setting {args.setting}")
    results = {}
    for path in paths:
        out = subprocess.run([sys.executable, __file__, "--cell", args.setting, path, "--repeats", str(args.repeats)], capture_output=True, text=True)
        if out.returncode:
            print(f"{path}: failed\n{out.stderr[-2000:]}")
            continue
        results[path] = json.loads(out.stdout.strip().splitlines()[-1])
    base = results.get("forward")
    print("\n| path | peak memory | time |\n|---|---|---|")
    for path, result in results.items():
        memory, seconds = f"{result['peak_gib']:.2f} GiB", f"{result['seconds']:.3f} s"
        if base is not None:
            memory += f" ({result['peak_gib'] / base['peak_gib']:.2f}x)"
            seconds += f" ({result['seconds'] / base['seconds']:.2f}x)"
        print(f"| {path} | {memory} | {seconds} |")


if __name__ == "__main__":
    main()
