"""ALTI+'s source and target shares on a trained translation-geometry model, against the same
model untrained.

A tiny Marian-geometry encoder-decoder (post-LN, sinusoidal positions; 2 + 2 layers, d = 32, 4
heads, built from a config, no download) is trained in a few minutes on the CPU to reverse its
source: source ``a b c </s>``, target ``c b a </s>``, over 12 symbols, lengths 3 to 7. Every
output token is then a copy of one source token, so the prediction must rest on the source: the
source share of ALTI+ (Ferrando et al., EMNLP 2022), :math:`\\sum_j U[t, j]` of each output
position t, must dominate its target-prefix share. In one run the script prints, on held-out
pairs, the model's token accuracy, and per output position the mean source share of ALTI+ and
of value zeroing for the trained model beside the untrained one (their ratio), the machine and
its load.

    python benchmarks/alti_plus_shares.py [--steps 600] [--examples 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch
from transformers import MarianConfig, MarianMTModel

from captum_attnflow import ALTI, ValueZeroing
from captum_attnflow.models.training import adamw_with_schedule, optimizer_step

PAD, EOS, SYMBOLS = 0, 1, 12  # the symbols are ids 2..13; Marian starts its decoder with the pad id
VOCAB = 2 + SYMBOLS


def reversal_model(seed: int = 0) -> MarianMTModel:
    """The untrained Marian-geometry model."""
    torch.manual_seed(seed)
    config = MarianConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32,
        pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD, forced_eos_token_id=None,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        # token embeddings scaled by sqrt(d) as opus-mt's, and initialised as large as the
        # sinusoidal positions (std 0.6), so that the tokens are not lost among the positions
        scale_embedding=True, init_std=0.1,
    )
    return MarianMTModel(config)


def reversal_batch(size: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """``(source, source_mask, decoder_inputs, decoder_mask, targets)`` of ``size`` pairs padded on the right."""
    lengths = torch.randint(3, 8, (size,), generator=generator)
    width = int(lengths.max()) + 1
    source = torch.full((size, width), PAD)
    targets = torch.full((size, width), PAD)
    for b, length in enumerate(lengths.tolist()):
        symbols = torch.randint(2, VOCAB, (length,), generator=generator)
        source[b, : length + 1] = torch.cat([symbols, torch.tensor([EOS])])
        targets[b, : length + 1] = torch.cat([symbols.flip(0), torch.tensor([EOS])])
    mask = (source != PAD).long()
    decoder = torch.cat([torch.full((size, 1), PAD), targets[:, :-1]], 1)
    return source, mask, decoder, mask.clone(), targets


def train(model: MarianMTModel, steps: int, batch_size: int = 32, seed: int = 0) -> MarianMTModel:
    """Teacher-forced cross-entropy on the reversal task, AdamW with a linear schedule."""
    generator = torch.Generator().manual_seed(seed)
    optimizer, schedule = adamw_with_schedule(model, lr=3e-3, weight_decay=0.01, warmup=steps // 10, steps=steps)
    model.train()
    for _ in range(steps):
        source, mask, decoder, decoder_mask, targets = reversal_batch(batch_size, generator)
        logits = model(source, mask, decoder, decoder_mask).logits
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets.masked_fill(decoder_mask == 0, -100))
        optimizer_step(loss, model, optimizer, schedule)
    return model.eval()


def accuracy(model: MarianMTModel, batch: tuple[torch.Tensor, ...]) -> float:
    source, mask, decoder, decoder_mask, targets = batch
    with torch.no_grad():
        predicted = model(source, mask, decoder, decoder_mask).logits.argmax(-1)
    real = decoder_mask.bool()
    return float((predicted == targets)[real].float().mean())


def source_shares(method: type, model: MarianMTModel, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(shares, real)``: (B, m) each output position's source share after the last decoder layer, and its mask."""
    source, mask, decoder, decoder_mask, _ = batch
    rows = method(model).encoder_decoder_rows(source, decoder, -1, mask, decoder_mask)
    return rows[..., : source.shape[1]].sum(-1), decoder_mask.bool()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--examples", type=int, default=64, help="held-out pairs explained")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {args.threads} torch threads, "
          f"load {os.getloadavg()[0]:.1f}; torch {torch.__version__}")
    held_out = reversal_batch(args.examples, torch.Generator().manual_seed(1))
    untrained = reversal_model()
    start = time.perf_counter()
    trained = train(reversal_model(), args.steps)
    print(f"trained {args.steps} steps in {time.perf_counter() - start:.0f} s; held-out token accuracy "
          f"{accuracy(trained, held_out):.3f} (untrained {accuracy(untrained, held_out):.3f})")
    for method in (ALTI, ValueZeroing):
        shares, real = source_shares(method, trained, held_out)
        base, _ = source_shares(method, untrained, held_out)
        print(f"{method.__name__}: mean source share per output position (trained / untrained, ratio)")
        for t in range(shares.shape[1]):
            if real[:, t].any():
                ours, theirs = float(shares[:, t][real[:, t]].mean()), float(base[:, t][real[:, t]].mean())
                print(f"  position {t}: {ours:.3f} / {theirs:.3f}  ({ours / theirs:.2f}x)")
        symbols = real & (held_out[4] != EOS)
        for name, where in (("copied symbols", symbols), ("end of sentence", held_out[4] == EOS), ("all tokens", real)):
            ours, theirs = float(shares[where].mean()), float(base[where].mean())
            print(f"  {name}: {ours:.3f} / {theirs:.3f} ({ours / theirs:.2f}x); least {float(shares[where].min()):.3f}; "
                  f"source dominant (> 0.5) at {float((shares[where] > 0.5).float().mean()):.1%}")


if __name__ == "__main__":
    main()
