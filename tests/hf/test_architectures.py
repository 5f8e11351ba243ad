"""The architecture table: every model type it names is tested here, each block's pieces put back
together must give what the block computed (for the families whose attention runs in their own
modules, from the probabilities those modules return and the values split from their projections)."""

from __future__ import annotations

import pytest
import torch
import transformers
from families import FAMILIES, family_config
from helpers import TINY

from captum_attnflow.capture.internals import capture_internals
from captum_attnflow.hf.architectures import ARCHITECTURES, architecture_of, projection_weight
from captum_attnflow.models import AgreementConfig, AgreementModel
from captum_attnflow.models.tagger import TaggerModel, bundled_tagger_config

SMALL = dict(num_hidden_layers=3, max_position_embeddings=64, **TINY)
TOWERS = {
    "clip_text_model": ("text", transformers.CLIPTextModel),
    "clip_vision_model": ("vision", transformers.CLIPVisionModel),
    "siglip_text_model": ("text", transformers.SiglipTextModel),
    "siglip_vision_model": ("vision", transformers.SiglipVisionModel),
}
VISION = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, image_size=16, patch_size=8)
# An encoder-decoder's row names its encoder's blocks and its decoder's; the encoder's are rebuilt
# here, the decoder's cross-attention is tested against references (tests/attr/test_encoder_decoder_methods.py).
SEQ2SEQ = {
    "bart": dict(encoder_layers=3, encoder_attention_heads=4, encoder_ffn_dim=64, max_position_embeddings=64),
    "t5": dict(num_layers=3, num_heads=4, d_kv=8, d_ff=64),
}
for _kind in ("marian", "mbart", "m2m_100"):
    SEQ2SEQ[_kind] = dict(SEQ2SEQ["bart"], pad_token_id=1, decoder_start_token_id=2)


def _model(model_type: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if model_type == "captum_attnflow_agreement":
        return AgreementModel(AgreementConfig(num_hidden_layers=3)).eval()
    if model_type == "captum_attnflow_tagger":
        return TaggerModel(bundled_tagger_config(num_hidden_layers=3)).eval()
    if model_type == "distilbert":
        config = transformers.DistilBertConfig(vocab_size=60, dim=32, n_heads=4, hidden_dim=64, n_layers=3)
    elif model_type in ("vit", "deit", "dinov2"):
        config = transformers.AutoConfig.for_model(model_type, **VISION)
    elif model_type in TOWERS:
        kind, model_class = TOWERS[model_type]
        settings = VISION if kind == "vision" else SMALL
        return model_class(transformers.AutoConfig.for_model(model_type, **settings)).eval()
    elif model_type in SEQ2SEQ:
        config = transformers.AutoConfig.for_model(model_type, vocab_size=60, d_model=32, **SEQ2SEQ[model_type])
        return transformers.AutoModelForSeq2SeqLM.from_config(config).get_encoder().eval()
    elif model_type in ("llama", "mistral", "qwen2"):
        config = transformers.AutoConfig.for_model(model_type, num_key_value_heads=2, **SMALL)
    elif model_type in FAMILIES:
        layers = dict(layer_types=["sliding_attention", "full_attention", "sliding_attention"]) if model_type == "gemma3_text" else {}
        config = family_config(model_type, num_hidden_layers=3, n_layer=3, **layers)
    else:
        config = transformers.AutoConfig.for_model(model_type, **SMALL)
    return transformers.AutoModel.from_config(config).eval()


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_each_block_is_rebuilt_from_its_pieces(model_type):
    model = _model(model_type)
    vision = model_type in ("vit", "deit", "dinov2") or TOWERS.get(model_type, ("",))[0] == "vision"
    inputs = torch.randn(2, 3, 16, 16) if vision else torch.randint(5, 60, (2, 7))
    architecture, blocks = architecture_of(model, "test")
    assert len(blocks) == 3
    internals = capture_internals(model, inputs, blocks=blocks, own=architecture.own_attention)
    assert len(internals.probabilities) == len(internals.block_inputs) == 3
    with torch.no_grad():
        for index in range(2):
            block, x = blocks[index], internals.block_inputs[index]
            probabilities, values = internals.probabilities[index], internals.values[index]
            batch, heads, n, size = values.shape
            context = (probabilities @ values).transpose(1, 2).reshape(batch, n, heads * size)
            projection = architecture.output_projection(block)
            weight, bias = projection_weight(projection)
            assert torch.allclose(projection(context), context @ weight + (0 if bias is None else bias), atol=1e-6)
            rebuilt = architecture.after_attention(block, x, projection(context))
            assert torch.allclose(rebuilt, internals.block_inputs[index + 1], atol=1e-5)
            if architecture.post_norm is not None and architecture.post_norm(block) is not None:
                assert isinstance(architecture.post_norm(block), torch.nn.LayerNorm)


def test_outputs_are_the_models_own_and_the_model_is_restored():
    model = _model("llama")
    ids = torch.randint(5, 60, (2, 7))
    with torch.no_grad():
        expected = model(ids).last_hidden_state
    internals = capture_internals(model, ids)
    assert torch.allclose(internals.output.last_hidden_state, expected, atol=1e-5)
    assert model.config._attn_implementation == "sdpa"


def test_a_model_outside_the_table_is_refused_with_the_supported_types():
    torch.manual_seed(0)
    model = transformers.XLNetModel(transformers.XLNetConfig(vocab_size=60, d_model=32, n_layer=2, n_head=4, d_inner=64))
    with pytest.raises(ValueError, match="captum_attnflow_agreement.*xlm-roberta"):
        architecture_of(model, "ALTI")
    with pytest.raises(ValueError, match="holds no Hugging Face model"):
        architecture_of(torch.nn.Linear(2, 2), "ALTI")
