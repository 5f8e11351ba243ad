"""Attention flow on a language model's long inputs against the model's own forward.

GPT-2-small geometry from a config (12 layers, 12 heads, width 768, vocabulary 50257, random
weights; nothing downloaded), B = 1, in one run:

* generation: ``LLMAttentionAttribution(AttentionFlow(model), tokenizer)`` explaining 16 given
  output tokens after a 512-token prompt (one forward pass, then the flow of the 16 predicting
  positions), against the model's forward over the same 528 tokens (its default sdpa
  attention, logits included); rollout the same way for comparison;
* one source at n = 2048: ``AttentionFlow(model).attribute(ids, position=n - 1)`` against the
  forward over the same 2048 tokens.

The tokenizer is a word-level one over the names ``t0 .. t50256`` (one token per id), so the
prompt is 512 random ids. Each call runs once to warm up (numba compiles or loads its kernels),
then ``--repeats`` times back to back with the forward; the script prints medians and the
median of the per-repeat ratios, the memory flow would need at n = 4096 and the machine.

    python benchmarks/generation.py [--repeats 3] [--skip-long]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import TYPE_CHECKING

# The heavy imports are in the functions that use them, so that --help answers at once.
if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PROMPT, OUTPUT, LONG = 512, 16, 2048


def word_tokenizer(vocabulary: int) -> PreTrainedTokenizerFast:
    """One token per id, named ``t<id>``; no special tokens are added."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = models.WordLevel({f"t{i}": i for i in range(vocabulary)}, unk_token="t0")
    tokenizer = Tokenizer(words)
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0", pad_token="t0")


def seconds(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def compare(name: str, forward, ours, repeats: int) -> None:
    """Time ``forward`` and ``ours`` back to back ``repeats`` times; print medians and the ratio."""
    ours()  # warm-up: numba kernels compiled or loaded from the cache
    pairs = [(seconds(forward), seconds(ours)) for _ in range(repeats)]
    forward_s = statistics.median(f for f, _ in pairs)
    ours_s = statistics.median(o for _, o in pairs)
    ratio = statistics.median(o / f for f, o in pairs)
    print(f"{name:<58} forward {forward_s:7.2f} s   ours {ours_s:7.2f} s   ours / forward {ratio:5.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (default 3)")
    parser.add_argument("--skip-long", action="store_true", help="skip the one source at n = 2048")
    args = parser.parse_args()
    import numba
    import torch
    from captum.attr import TextTokenInput
    from transformers import GPT2Config, GPT2LMHeadModel

    from captum_attnflow import AttentionFlow, AttentionRollout, LLMAttentionAttribution
    from captum_attnflow.functional._memory import available_bytes, flow_bytes

    torch.manual_seed(0)
    config = GPT2Config(n_positions=4096)
    model = GPT2LMHeadModel(config).eval()
    tokenizer = word_tokenizer(config.vocab_size)
    ids = torch.randint(1, config.vocab_size, (1, LONG))
    prompt = TextTokenInput(" ".join(f"t{i}" for i in ids[0, :PROMPT].tolist()), tokenizer)
    target = ids[0, PROMPT : PROMPT + OUTPUT]
    print(
        f"GPT-2-small geometry, random weights; torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"numba {numba.__version__} ({numba.get_num_threads()} threads), {os.cpu_count()} CPUs, "
        f"1-minute load {os.getloadavg()[0]:.1f} at the start"
    )

    def forward(n: int):
        def call():
            with torch.no_grad():
                model(ids[:, :n])

        return call

    for method in (AttentionRollout, AttentionFlow):
        explainer = LLMAttentionAttribution(method(model), tokenizer)
        compare(
            f"{method.__name__}: {OUTPUT} output tokens after {PROMPT} prompt tokens",
            forward(PROMPT + OUTPUT),
            lambda: explainer.attribute(prompt, target=target, show_progress=False),
            args.repeats,
        )
    if not args.skip_long:
        flow = AttentionFlow(model)
        compare(
            f"AttentionFlow: one source at n = {LONG}",
            forward(LONG),
            lambda: flow.attribute(ids, position=LONG - 1, show_progress=False),
            args.repeats,
        )
    needed = flow_bytes(
        layers=12, batch=1, n=4096, num_sources=1, out_layers=1, threads=numba.get_num_threads(), causal=True
    )
    available = available_bytes()
    print(
        f"flow memory at n = 4096 (L = 12, causal, one source, {numba.get_num_threads()} kernel threads), at most: "
        f"{needed / 2**30:.1f} GiB; available here: {'unknown' if available is None else f'{available / 2**30:.1f} GiB'}"
    )
    print(f"1-minute load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
