"""Every method on one GPU, beside the model's own forward and Captum's call in the same run.

Random weights from configs (no download). First one attention layer's recomputation alone
(:func:`kernel_table`: the row statistics, the row product and the fused probabilities beside
the layer's own sdpa attention, BERT-base float32 at n = 8192, Llama-3.2-1B bfloat16 at 16384),
then two tables of the methods:

* BERT-base geometry (L=12, H=12, hidden 768), float32, B = 1, n = 512, 4096, 8192 (``--bert``):
  the model's sdpa forward, forward + backward, and the library's methods explaining the first
  token ([CLS]) after every layer: lean rollout, gradient-weighted rollout, AttnLRP, and the
  methods that read the blocks' internals: ALTI and the attention norms (n <= 4096: they keep
  every layer's probabilities) and value zeroing (n = 512: n variants a layer);
* Llama-3.2-1B geometry (L=16, H=32, 8 key heads, hidden 2048), bfloat16, 16384 tokens
  (``--llama``): the forward, the lean rollout of the last position, and one output token
  explained by ``LLMAttentionAttribution(GradientWeightedRollout(model))`` and by Captum's
  ``LLMGradientAttribution(LayerGradientXActivation(model, embed_tokens))``.

Each cell: one warm-up call, then one timed call (synchronised), its time, its ratio to the
forward of the same model in the same run (and to Captum's for the Llama rows), and the peak GPU
memory allocated during the timed call, with its ratio to the last reference's (the forward +
backward's for BERT, Captum's for Llama). Targets: BERT n = 8192 rollout <= 1.3x the forward and
gradient-weighted rollout <= 1.2x the forward + backward; ALTI and the norms at n = 4096 <= 3x
the forward and within 2 GiB; value zeroing at n = 512 <= 20x; Llama lean rollout <= 2x the
forward, gradient-weighted rollout no slower than Captum's call and within its memory. About
3 minutes on one H100.

    python benchmarks/gpu.py [--bert 512 4096 8192] [--llama 16384] [--smoke]

``--smoke``: tiny models and sizes, on the CPU when there is no GPU (the test command runs it).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import time
from typing import TYPE_CHECKING, Callable

# The heavy imports are in the functions that use them, so that --help answers at once.
if TYPE_CHECKING:
    import torch

BYTES_GIB = 2**30


def word_tokenizer(vocabulary: int):
    """A word-level tokenizer over the names ``t0 .. t{vocabulary - 1}``, one token per id."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocabulary)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", pad_token="t0")


def measure(call: Callable[[], object], device: torch.device) -> tuple[float, float | None]:
    """(seconds, peak GiB allocated or None on the CPU) of one call after a warm-up."""
    import torch

    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / BYTES_GIB if device.type == "cuda" else None
    return seconds, peak


class Table:
    """Prints one row per measured call, ratios to the named reference rows."""

    def __init__(self, title: str, references: tuple[str, ...], device: torch.device) -> None:
        self.references, self.device, self.seconds, self.peaks = references, device, {}, {}
        print(f"\n{title}")
        print(f"{'':44} {'time':>10} " + " ".join(f"{'/ ' + r:>14}" for r in references)
              + f" {'peak GPU':>10} {'/ ' + references[-1]:>14}")

    def row(self, name: str, call: Callable[[], object]) -> None:
        import torch

        try:
            seconds, peak = measure(call, self.device)
        except (RuntimeError, ValueError, torch.cuda.OutOfMemoryError) as error:  # one cell failing, not the table
            print(f"{name:44} failed: {type(error).__name__}: {str(error).splitlines()[0][:120]}")
            return
        finally:
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        self.seconds[name], self.peaks[name] = seconds, peak
        ratios = " ".join(
            f"{seconds / self.seconds[r]:13.2f}x" if r in self.seconds else f"{'':14}" for r in self.references
        )
        memory = f"{peak:8.2f} G" if peak is not None else f"{'-':>10}"
        last = self.peaks.get(self.references[-1])
        memory_ratio = f" {peak / last:13.2f}x" if peak is not None and last else ""
        print(f"{name:44} {seconds * 1e3:8.1f} ms {ratios} {memory}{memory_ratio}", flush=True)


def bert_table(sizes: list[int], device: torch.device, smoke: bool) -> None:
    for n in sizes:  # one model at a time on the device
        _bert_rows(n, device, smoke)


def _bert_rows(n: int, device: torch.device, smoke: bool) -> None:
    import torch
    import transformers

    from captum_attnflow import ALTI, AttentionNorm, AttentionRollout, AttnLRP, GradientWeightedRollout, ValueZeroing

    torch.manual_seed(0)
    geometry = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64) if smoke else {}
    config = transformers.BertConfig(max_position_embeddings=n, num_labels=2, **geometry)
    with device:  # initialised where it runs
        model = transformers.BertForSequenceClassification(config).eval()
    ids = torch.randint(1000 if not smoke else 5, config.vocab_size, (1, n), device=device)
    table = Table(
        f"BERT-base geometry (L={config.num_hidden_layers}, H={config.num_attention_heads}, hidden "
        f"{config.hidden_size}), float32, B = 1, n = {n}",
        ("sdpa forward", "forward + backward"), device,
    )

    def forward():
        with torch.no_grad():
            return model(ids).logits

    def forward_backward():
        model(ids).logits[:, 0].sum().backward()
        model.zero_grad(set_to_none=True)

    table.row("sdpa forward", forward)
    table.row("forward + backward", forward_backward)
    table.row("rollout, every layer (lean)", lambda: AttentionRollout(model).attribute(ids, position=0, layer=None))
    table.row("gradient-weighted rollout, every layer",
              lambda: GradientWeightedRollout(model).attribute(ids, target=0, position=0, layer=None))
    table.row("AttnLRP", lambda: AttnLRP(model).attribute(ids, target=0))
    if n <= 4096:
        table.row("ALTI, every layer", lambda: ALTI(model).attribute(ids, position=0, layer=None))
        table.row("attention norms", lambda: AttentionNorm(model).attribute(ids, position=0))
    if n <= 512:
        table.row("value zeroing, every layer", lambda: ValueZeroing(model).attribute(ids, position=0, layer=None))


def llama_table(tokens: int, device: torch.device, smoke: bool) -> None:
    import torch
    import transformers
    from captum.attr import LayerGradientXActivation, LLMGradientAttribution, TextTokenInput

    from captum_attnflow import AttentionRollout, GradientWeightedRollout, LLMAttentionAttribution

    torch.manual_seed(0)
    if smoke:
        config = transformers.LlamaConfig(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=tokens + 1)
    else:  # Llama-3.2-1B's geometry
        config = transformers.LlamaConfig(
            vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
            num_key_value_heads=8, head_dim=64, max_position_embeddings=131072, rope_theta=500000.0,
            tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001,
        )
    dtype = torch.bfloat16
    with device:  # initialised where it runs (1.2 billion random weights)
        model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    tokenizer = word_tokenizer(config.vocab_size)
    ids = torch.randint(5, config.vocab_size, (tokens + 1,))
    prompt = " ".join(f"t{i}" for i in ids[:tokens].tolist())
    target = ids[tokens:]  # one output token
    inputs = ids[None, :tokens].to(device)
    table = Table(
        f"Llama-3.2-1B geometry (L={config.num_hidden_layers}, H={config.num_attention_heads}, "
        f"{config.num_key_value_heads} key heads, hidden {config.hidden_size}), bfloat16, {tokens} tokens",
        ("forward", "captum"), device,
    )

    def forward():
        with torch.no_grad():
            return model(inputs).logits

    captum = LLMGradientAttribution(LayerGradientXActivation(model, model.model.embed_tokens), tokenizer)
    ours = LLMAttentionAttribution(GradientWeightedRollout(model), tokenizer)
    table.row("forward", forward)
    table.row("lean rollout of the last position", lambda: AttentionRollout(model).attribute(inputs, position=tokens - 1))
    table.row("captum", lambda: captum.attribute(TextTokenInput(prompt, tokenizer), target=target))
    table.row("gradient-weighted rollout (LLM wrapper)",
              lambda: ours.attribute(TextTokenInput(prompt, tokenizer), target=target, show_progress=False))


def kernel_table(device: torch.device, smoke: bool) -> None:
    """One attention layer's recomputation alone, random queries and keys: the layer's own sdpa
    attention beside the row statistics pass, the row product (16 vectors, statistics
    included) and the fused probabilities of every row written out (the blocks' path)."""
    import torch

    geometries = [("BERT-base layer", 12, 12, 8192, False, torch.float32),
                  ("Llama-3.2-1B layer", 32, 8, 16384, True, torch.bfloat16)]
    for geometry in geometries:  # one layer's tensors at a time on the device
        _kernel_rows(*geometry, device=device, smoke=smoke)


def _kernel_rows(name: str, heads: int, kv_heads: int, n: int, causal: bool, dtype: torch.dtype, device: torch.device,
                 smoke: bool) -> None:
    import torch

    from captum_attnflow.capture import lean_triton

    n = 96 if smoke else n
    torch.manual_seed(0)
    query = torch.randn(1, heads, n, 64, device=device, dtype=dtype)
    key, value = torch.randn(2, 1, kv_heads, n, 64, device=device, dtype=dtype)
    real = torch.ones(1, n, dtype=torch.bool, device=device)
    vectors = torch.rand(1, 16, n, device=device)
    table = Table(f"{name} alone ({heads} heads, {kv_heads} key heads, d = 64), {str(dtype)[6:]}, n = {n}"
                  f"{', causal' if causal else ''}", ("sdpa",), device)
    table.row("sdpa", lambda: torch.nn.functional.scaled_dot_product_attention(
        query, key, value, is_causal=causal, enable_gqa=kv_heads != heads))
    table.row("row statistics (pass 1)", lambda: lean_triton.row_product(query, key, None, 0.125, causal, n, real))
    product = lean_triton.row_product(query, key, None, 0.125, causal, n, real)
    table.row("row product of 16 vectors (pass 2)", lambda: product(vectors))
    out = torch.empty(1, n, n, device=device)
    table.row("fused probabilities written (both passes)", lambda: lean_triton.fused_probabilities(
        query, key, None, 0.125, causal, "mean", out))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bert", type=int, nargs="*", default=None, help="BERT sequence lengths (default 512 4096 8192)")
    parser.add_argument("--llama", type=int, nargs="*", default=None, help="Llama prompt lengths (default 16384)")
    parser.add_argument("--smoke", action="store_true", help="tiny models and sizes; the CPU when there is no GPU")
    args = parser.parse_args(argv)
    import torch
    import transformers

    if not torch.cuda.is_available() and not args.smoke:
        parser.error("no CUDA device: this benchmark measures a GPU (--smoke runs it tiny on the CPU)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bert = args.bert if args.bert is not None else ([16, 24] if args.smoke else [512, 4096, 8192])
    llama = args.llama if args.llama is not None else ([16] if args.smoke else [16384])
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    triton = "Triton kernels" if device.type == "cuda" and _has_triton() else "torch operations (no Triton kernels)"
    print(f"{name}; torch {torch.__version__}, transformers {transformers.__version__}; {triton}; "
          "one call after a warm-up; peak GPU memory allocated during the call")
    start = time.perf_counter()
    if device.type == "cuda" or _has_triton() and os.environ.get("TRITON_INTERPRET") == "1":  # CPU tensors: the interpreter
        kernel_table(device, args.smoke)
    bert_table(bert, device, args.smoke)
    for tokens in llama:
        llama_table(tokens, device, args.smoke)
    print(f"\n{time.perf_counter() - start:.0f} s in all")


def _has_triton() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


if __name__ == "__main__":
    main()
