"""The encoder-decoder joint graph: rollout against the equations, flow against networkx, T5/BART capture."""

from __future__ import annotations

import networkx as nx
import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from captum_attnflow.capture import seq2seq_attentions
from captum_attnflow.functional.encoder_decoder import (
    encoder_decoder_flow,
    encoder_decoder_raw_attention,
    encoder_decoder_rollout,
)

VOCAB = 50


def make_seq2seq(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if arch == "t5":
        config = transformers.T5Config(
            vocab_size=VOCAB, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=3, num_heads=2,
            decoder_start_token_id=0,
        )
        return transformers.T5ForConditionalGeneration(config).eval()
    config = transformers.BartConfig(
        vocab_size=VOCAB, d_model=16, encoder_layers=2, decoder_layers=3, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
    )
    return transformers.BartForConditionalGeneration(config).eval()


def random_maps(seed: int, batch=2, heads=3, n=5, m=4, encoder_layers=2, decoder_layers=3):
    generator = torch.Generator().manual_seed(seed)
    encoder = torch.softmax(torch.randn(encoder_layers, batch, heads, n, n, generator=generator), -1)
    causal = torch.ones(m, m).tril().bool()
    scores = torch.randn(decoder_layers, batch, heads, m, m, generator=generator).masked_fill(~causal, -torch.inf)
    decoder = torch.softmax(scores, -1)
    cross = torch.softmax(torch.randn(decoder_layers, batch, heads, m, n, generator=generator), -1)
    return encoder, decoder, cross


def residual(weights: torch.Tensor, alpha: float) -> torch.Tensor:
    mixed = alpha * weights + (1 - alpha) * torch.eye(weights.shape[-1])
    return mixed / mixed.sum(-1, keepdim=True)


def equations(encoder, decoder, cross, alpha, layer):
    """T, U of the docstring written out for one example: (m, n + m) after decoder layer ``layer``."""
    r_enc = torch.eye(encoder.shape[-1])
    for k in range(encoder.shape[0]):
        r_enc = residual(encoder[k].mean(0), alpha) @ r_enc
    m, n = cross.shape[-2:]
    t, u = torch.eye(m), torch.zeros(m, n)
    for index in range(layer):
        a = residual(decoder[index].mean(0), alpha)
        t_prime, u_prime = a @ t, a @ u
        t = (1 - alpha) * t_prime
        u = (1 - alpha) * u_prime + alpha * cross[index].mean(0) @ r_enc
    return torch.cat([u, t], -1)


@pytest.mark.parametrize("alpha", [0.5, 0.3, 1.0])
def test_rollout_follows_the_equations(alpha):
    encoder, decoder, cross = random_maps(0)
    scores = encoder_decoder_rollout(encoder, decoder, cross, layer=None, residual_alpha=alpha)
    for layer in range(1, 4):
        for b in range(2):
            expected = equations(encoder[:, b], decoder[:, b], cross[:, b], alpha, layer)
            torch.testing.assert_close(scores[layer - 1, b], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(encoder_decoder_rollout(encoder, decoder, cross, layer=2, residual_alpha=alpha), scores[1])


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    alpha=st.floats(0.0, 1.0),
    n=st.integers(1, 5),
    m=st.integers(1, 4),
)
def test_rollout_rows_are_distributions_over_source_and_target_tokens(seed, alpha, n, m):
    encoder, decoder, cross = random_maps(seed, batch=1, n=n, m=m)
    scores = encoder_decoder_rollout(encoder, decoder, cross, layer=None, residual_alpha=alpha)
    assert (scores >= 0).all()
    torch.testing.assert_close(scores.sum(-1), torch.ones(3, 1, m))
    # causal: no position takes anything from a later target token
    assert scores[..., n:].triu(1).abs().max() == 0


def test_raw_attention_is_one_layer_of_the_joint_graph():
    encoder, decoder, cross = random_maps(1)
    raw = encoder_decoder_raw_attention(encoder, decoder, cross, layer=2)
    torch.testing.assert_close(raw[..., :5], cross[1].mean(1))
    assert raw[..., 5:].abs().max() == 0
    mixed = encoder_decoder_raw_attention(encoder, decoder, cross, layer=None, residual_alpha=0.5)
    for b in range(2):
        torch.testing.assert_close(mixed[1, b, :, :5], 0.5 * cross[1, b].mean(0))
        torch.testing.assert_close(mixed[1, b, :, 5:], 0.5 * residual(decoder[1, b].mean(0), 0.5))


def networkx_flows(encoder, decoder, cross, alpha, layer):
    """Max flow from each decoder node after ``layer`` to each input token, on the joint graph itself."""
    graph = nx.DiGraph()
    n_layers_enc = encoder.shape[0]
    n, m = encoder.shape[-1], decoder.shape[-1]
    for k in range(1, n_layers_enc + 1):
        a = residual(encoder[k - 1].mean(0), alpha)
        for i in range(n):
            for j in range(n):
                graph.add_edge(("enc", k, i), ("enc", k - 1, j), capacity=float(a[i, j]))
    for d in range(1, layer + 1):
        a = residual(decoder[d - 1].mean(0), alpha)
        w = cross[d - 1].mean(0)
        for t in range(m):
            graph.add_edge(("dec", d, t), ("mid", d, t), capacity=1 - alpha)
            for s in range(n):
                graph.add_edge(("dec", d, t), ("enc", n_layers_enc, s), capacity=float(alpha * w[t, s]))
            for j in range(m):
                graph.add_edge(("mid", d, t), ("dec", d - 1, j), capacity=float(a[t, j]))
    sinks = [("enc", 0, s) for s in range(n)] + [("dec", 0, t) for t in range(m)]
    return torch.tensor(
        [[nx.maximum_flow_value(graph, ("dec", layer, p), sink) if sink in graph else 0.0 for sink in sinks]
         for p in range(m)]
    )


@pytest.mark.parametrize("alpha", [0.5, 0.8])
def test_flow_matches_networkx_on_the_joint_graph(alpha):
    encoder, decoder, cross = random_maps(2, batch=1, n=4, m=3)
    flows = encoder_decoder_flow(encoder, decoder, cross, layer=None, residual_alpha=alpha)
    for layer in (1, 3):
        expected = networkx_flows(encoder[:, 0], decoder[:, 0], cross[:, 0], alpha, layer)
        torch.testing.assert_close(flows[layer - 1, 0], expected.float(), atol=1e-5, rtol=1e-5)
    some = encoder_decoder_flow(encoder, decoder, cross, layer=2, sources=[-1, 0], residual_alpha=alpha)
    torch.testing.assert_close(some[0], flows[1, 0][[2, 0]])


def test_flow_is_bounded_by_rollout_paths_and_one():
    encoder, decoder, cross = random_maps(3)
    flows = encoder_decoder_flow(encoder, decoder, cross)
    rollout = encoder_decoder_rollout(encoder, decoder, cross)
    # a flow can use every path at once, a path's product never exceeds its narrowest edge
    assert (flows >= rollout - 1e-6).all() and (flows <= 1 + 1e-5).all()


def test_padding_is_removed_from_the_joint_graph():
    encoder, decoder, cross = random_maps(4, batch=1, n=3, m=2)
    # pad one source token and one decoder position; padding gets no attention in a real model
    pad_enc = torch.nn.functional.pad(encoder, (0, 1, 0, 1))
    pad_enc[..., 3, :] = 0.25
    pad_dec = torch.nn.functional.pad(decoder, (0, 1, 0, 1))
    pad_dec[..., 2, :] = 1 / 3
    pad_cross = torch.nn.functional.pad(cross, (0, 1, 0, 1))
    pad_cross[..., 2, :] = 0.25
    source_mask, target_mask = torch.tensor([[1, 1, 1, 0]]), torch.tensor([[1, 1, 0]])
    for function in (encoder_decoder_rollout, encoder_decoder_raw_attention, encoder_decoder_flow):
        alone = function(encoder, decoder, cross)
        padded = function(
            pad_enc, pad_dec, pad_cross, attention_mask=source_mask, decoder_attention_mask=target_mask
        )
        torch.testing.assert_close(padded[0, :2, [0, 1, 2, 4, 5]], alone[0], atol=1e-6, rtol=1e-6)
        assert padded[0, 2].abs().max() == 0 and padded[0, :, [3, 6]].abs().max() == 0


def test_wrong_cross_attention_shape_names_the_layout():
    encoder, decoder, cross = random_maps(5)
    with pytest.raises(ValueError, match=r"\(B, H, m, n_s\)"):
        encoder_decoder_rollout(encoder, decoder, cross.transpose(-1, -2))


@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_capture_from_t5_and_bart_leaves_the_model_as_it_was(arch):
    model = make_seq2seq(arch)
    model.train()
    model.lm_head.weight.requires_grad_(False)
    hooks_before = {name: dict(module._forward_hooks) for name, module in model.named_modules()}
    source = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 1, 1]])
    source_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    decoder = torch.tensor([[0, 11, 12], [0, 13, 14]])
    maps = seq2seq_attentions(model, source, decoder, source_mask)
    assert (len(maps.encoder), len(maps.decoder), len(maps.cross)) == (2, 3, 3)
    assert maps.decoder[0].shape == (2, 2, 3, 3) and maps.cross[0].shape == (2, 2, 3, 5)
    assert maps.cross[0][1, :, :, 3:].abs().max() == 0  # padding gets no cross-attention
    assert maps.decoder[0].triu(1).abs().max() == 0  # the decoder is causal
    assert model.training and all(m.training for m in model.modules())
    assert model.config._attn_implementation == "sdpa"
    assert not model.lm_head.weight.requires_grad
    assert {name: dict(module._forward_hooks) for name, module in model.named_modules()} == hooks_before
    with pytest.raises(IndexError):
        seq2seq_attentions(model, source, torch.tensor([[0, VOCAB + 5, 1], [0, 1, 1]]))
    assert model.training and model.config._attn_implementation == "sdpa"


def test_capture_rejects_a_decoder_only_model():
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_head=2, n_layer=1))
    with pytest.raises(ValueError, match="not an encoder-decoder"):
        seq2seq_attentions(model, torch.tensor([[1, 2]]), torch.tensor([[0]]))


@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_rollout_of_a_real_model_follows_the_equations(arch):
    model = make_seq2seq(arch)
    maps = seq2seq_attentions(model, torch.tensor([[5, 6, 7, 8, 2]]), torch.tensor([[0, 11, 12]]))
    scores = encoder_decoder_rollout(maps.encoder, maps.decoder, maps.cross, layer=-1)
    expected = equations(
        torch.stack(maps.encoder)[:, 0], torch.stack(maps.decoder)[:, 0], torch.stack(maps.cross)[:, 0], 0.5, 3
    )
    torch.testing.assert_close(scores[0], expected, atol=1e-5, rtol=1e-5)


def _composition_loops(encoder_maps, decoder_maps, layer):
    """[U T] after decoder layer ``layer`` for one example, written out: R_enc = C_Le ... C_1;
    U_l = S_l U_{l-1} + X_l R_enc, T_l = S_l T_{l-1} from T_0 = I, U_0 = 0."""
    rolled = torch.eye(encoder_maps.shape[-1], dtype=torch.float64)
    for c in encoder_maps:
        rolled = c @ rolled
    n, m = encoder_maps.shape[-1], decoder_maps.shape[-2]
    u, t = torch.zeros(m, n, dtype=torch.float64), torch.eye(m, dtype=torch.float64)
    for d in decoder_maps[:layer]:
        cross, own = d[:, :n], d[:, n:]
        u, t = own @ u + cross @ rolled, own @ t
    return torch.cat([u, t], -1)


def _random_contributions(seed, batch=2, n=5, m=4, encoder_layers=2, decoder_layers=3):
    generator = torch.Generator().manual_seed(seed)
    encoder = torch.softmax(torch.randn(encoder_layers, batch, n, n, generator=generator, dtype=torch.float64), -1)
    scores = torch.randn(decoder_layers, batch, m, n + m, generator=generator, dtype=torch.float64)
    scores[..., n:] = scores[..., n:].masked_fill(~torch.ones(m, m, dtype=torch.bool).tril(), -torch.inf)
    return encoder, torch.softmax(scores, -1)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_contributions_compose_as_written_out(seed):
    from captum_attnflow.functional.encoder_decoder import encoder_decoder_contributions

    encoder, decoder = _random_contributions(seed)
    scores = encoder_decoder_contributions(encoder, decoder, layer=None)
    for layer in range(1, 4):
        for b in range(2):
            expected = _composition_loops(encoder[:, b], decoder[:, b], layer)
            torch.testing.assert_close(scores[layer - 1, b].double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(scores.sum(-1), torch.ones(3, 2, 4))  # each position split between source and prefix


def test_padding_takes_no_share_and_leaves_the_real_tokens_unchanged():
    """The maps of an example padded on the right, whatever its padding rows and columns hold, give
    the real tokens' rows of the example alone, and 0 on padding."""
    from captum_attnflow.functional.encoder_decoder import encoder_decoder_contributions

    encoder, decoder = _random_contributions(5, batch=1, n=4, m=3)
    alone = encoder_decoder_contributions(encoder, decoder, None)
    generator = torch.Generator().manual_seed(6)
    padded_encoder = torch.rand(2, 1, 5, 5, generator=generator, dtype=torch.float64)
    padded_encoder[..., :4, :4] = encoder
    padded_decoder = torch.rand(3, 1, 4, 9, generator=generator, dtype=torch.float64)
    padded_decoder[..., :3, [0, 1, 2, 3, 5, 6, 7]] = decoder
    padded = encoder_decoder_contributions(padded_encoder, padded_decoder, None, torch.tensor([[1, 1, 1, 1, 0]]),
                                           torch.tensor([[1, 1, 1, 0]]))
    torch.testing.assert_close(padded[:, :, :3][..., [0, 1, 2, 3, 5, 6, 7]], alone)
    assert padded[..., 4].abs().max() == 0 and padded[..., 8].abs().max() == 0 and padded[:, :, 3].abs().max() == 0


@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_rollout_is_the_composition_of_its_residual_mixed_maps(alpha):
    """Rollout's joint graph is the contributions' composition with X = alpha W_cross, S = (1 - alpha) A."""
    from captum_attnflow.functional.encoder_decoder import encoder_decoder_contributions

    encoder, decoder, cross = random_maps(1)
    mixed_encoder = torch.stack([residual(layer.mean(1), alpha) for layer in encoder])
    joint = torch.cat([alpha * cross.mean(2), (1 - alpha) * torch.stack([residual(d.mean(1), alpha) for d in decoder])], -1)
    torch.testing.assert_close(
        encoder_decoder_contributions(mixed_encoder, joint, None),
        encoder_decoder_rollout(encoder, decoder, cross, layer=None, residual_alpha=alpha), atol=1e-5, rtol=1e-5,
    )
