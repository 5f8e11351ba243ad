"""ALTI+, value zeroing, the attention norms and AttnLRP on encoder-decoders of five geometries (BART,
Marian, mBART, M2M-100, T5), against float64 references written from the papers and the weights."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import torch
from lrp_reference import seq2seq_attnlrp_reference
from references_seq2seq import alti_plus_reference, attention_norm_reference, value_zeroing_reference

from captum_attnflow import ALTI, AttentionNorm, AttnLRP, ValueZeroing
from tests.helpers import SEQ2SEQ, make_seq2seq, model_state, seq2seq_batch

REFERENCES = {ALTI: alti_plus_reference, ValueZeroing: value_zeroing_reference, AttentionNorm: attention_norm_reference}


@pytest.mark.parametrize("method", list(REFERENCES))
@pytest.mark.parametrize("kind", list(SEQ2SEQ))
def test_decompositions_match_the_float64_references(kind, method):
    """Every decoder layer's rows of a right-padded batch equal the reference's, computed example by
    example on the real tokens alone, so padding changes nothing."""
    model = make_seq2seq(kind)
    source, source_mask, decoder, decoder_mask, _ = seq2seq_batch()
    before = model_state(model)
    ours = method(model).encoder_decoder_rows(source, decoder, None, source_mask, decoder_mask)
    expected = REFERENCES[method](model, source, decoder, source_mask, decoder_mask)
    assert ours.shape == expected.shape == (3, 2, 4, 10) and ours.dtype == torch.float32
    torch.testing.assert_close(ours.double(), expected, atol=2e-6 * float(expected.abs().max()), rtol=1e-5)
    assert model_state(model) == before


@pytest.mark.parametrize("kind", ["marian", "t5"])
def test_alti_plus_splits_each_position_between_source_and_target_prefix(kind):
    model = make_seq2seq(kind)
    source, source_mask, decoder, decoder_mask, _ = seq2seq_batch()
    rows = ALTI(model).encoder_decoder_rows(source, decoder, -1, source_mask, decoder_mask)
    source_share, target_share = rows[..., :6].sum(-1), rows[..., 6:].sum(-1)
    torch.testing.assert_close(source_share + target_share, decoder_mask.float())
    assert bool((rows >= 0).all()) and bool((source_share[decoder_mask.bool()] > 0).all())
    later = torch.ones(4, 4).triu(1).bool()  # no position takes anything from a later decoder input
    assert rows[..., 6:][:, later].abs().max() == 0
    assert rows[1, :, 4:6].abs().max() == 0 and rows[1, 2:].abs().max() == 0  # padding


@pytest.mark.parametrize("feed_forward", ["relu", "gated-gelu"])
def test_attnlrp_of_t5_matches_the_rules_written_out(feed_forward):
    """The cross-attention's bilinear products by the uniform rule, its softmax by Proposition 3.1,
    against the layer-by-layer propagation of lrp_reference (float64; T5's norm takes its
    statistics in float32 even in a float64 model, hence 1e-5)."""
    torch.manual_seed(0)
    import transformers

    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=40, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=3, num_heads=2,
        feed_forward_proj=feed_forward, initializer_factor=3.0, decoder_start_token_id=2, pad_token_id=1,
    )).eval().double()
    source, source_mask, decoder, decoder_mask, written = seq2seq_batch()
    ours = AttnLRP(model).encoder_decoder_rows(source, decoder, written, -1, source_mask, decoder_mask)
    expected, _ = seq2seq_attnlrp_reference(model, source, decoder, written, source_mask, decoder_mask)
    assert ours.dtype == torch.float64 and ours[..., :6].abs().sum() > 0
    torch.testing.assert_close(ours, expected, atol=1e-5 * float(expected.abs().max()), rtol=1e-5)


@pytest.mark.parametrize("kind", list(SEQ2SEQ))
def test_attnlrp_runs_on_every_geometry_and_conserves_where_nothing_else_takes_the_logit(kind):
    model = make_seq2seq(kind)
    source, source_mask, decoder, decoder_mask, written = seq2seq_batch()
    before = model_state(model)
    rows = AttnLRP(model).encoder_decoder_rows(source, decoder, written, -1, source_mask, decoder_mask)
    assert rows.shape == (2, 4, 10) and rows[..., :6].abs().sum() > 0 and rows[..., 6:].abs().sum() > 0
    assert rows[1, :, 4:6].abs().max() == 0 and rows[1, 2:].abs().max() == 0
    assert model_state(model) == before
    if kind != "t5":
        return
    # T5 has no biases and no position embeddings: with every attention writing nothing, each
    # position's logit comes from its own decoder input alone, and all of it reaches that token.
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__ == "T5Attention":
                module.v.weight.zero_()
        logits = model(source, source_mask, decoder, decoder_mask).logits.gather(-1, written[..., None])[..., 0]
    rows = AttnLRP(model).encoder_decoder_rows(source, decoder, written, -1, source_mask, decoder_mask)
    own = rows[..., 6:].diagonal(dim1=1, dim2=2)
    torch.testing.assert_close(own * decoder_mask, logits * decoder_mask, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rows.sum(-1), own * decoder_mask)


@pytest.mark.parametrize("method", [ALTI, ValueZeroing, AttentionNorm, AttnLRP])
def test_the_one_stack_call_points_to_the_encoder_decoder_rows(method):
    model = make_seq2seq("bart")
    source, _, decoder, _, _ = seq2seq_batch()
    with pytest.raises(TypeError, match="encoder_decoder_rows"):
        method(model).attribute(source[:1], additional_forward_args=(None, decoder[:1]))


@pytest.mark.slow
def test_alti_plus_source_share_dominates_on_a_trained_reverser():
    """benchmarks/alti_plus_shares.py's Marian-geometry model trained to reverse its source (half a
    minute on one CPU thread): each copied symbol's prediction rests on the source, so its ALTI+
    source share dominates (0.85 on average measured, 0.10 untrained)."""
    script = runpy.run_path(str(Path(__file__).parents[2] / "benchmarks" / "alti_plus_shares.py"), run_name="shares")
    held_out = script["reversal_batch"](32, torch.Generator().manual_seed(1))
    model = script["train"](script["reversal_model"](), 600)
    assert script["accuracy"](model, held_out) > 0.95
    shares, real = script["source_shares"](ALTI, model, held_out)
    untrained, _ = script["source_shares"](ALTI, script["reversal_model"](), held_out)
    symbols = real & (held_out[4] != script["EOS"])
    assert float(shares[symbols].mean()) > 0.7 and float((shares[symbols] > 0.5).float().mean()) > 0.9
    assert float(untrained[symbols].mean()) < 0.3
