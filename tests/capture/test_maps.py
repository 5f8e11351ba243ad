
import pytest
import torch
import transformers
from torch import nn

from helpers import FirstTokenClassifier, model_state
from captum_attnflow import eager_attention, extract_attentions
from helpers import IDS, eager_attentions, make_tiny_model


def full_state(model):
    """model_state plus what extraction touches besides: output_attentions of every config."""
    configs = [getattr(m, "config", None) for m in model.modules()]
    return model_state(model), [c.output_attentions for c in configs if c is not None]


def test_sdpa_model_gives_the_eager_models_attentions_and_is_left_unchanged(arch):
    model = make_tiny_model(arch)
    assert model.config._attn_implementation == "sdpa"
    with torch.no_grad():  # the problem extraction solves: sdpa returns no attentions
        assert not model(IDS, output_attentions=True).attentions
    before = full_state(model)
    attentions = extract_attentions(model, IDS)
    assert len(attentions) == 3 and attentions[0].shape == (2, 4, 6, 6)
    for ours, reference in zip(attentions, eager_attentions(arch, IDS)):
        torch.testing.assert_close(ours, reference)
    assert full_state(model) == before
    assert model.config._attn_implementation == "sdpa"


def test_output_capturing_hooks_of_transformers_are_removed_and_reinstalled_when_needed(arch):
    model = make_tiny_model(arch)
    before = full_state(model)
    first = extract_attentions(model, IDS)
    assert full_state(model) == before
    second = extract_attentions(model, IDS)
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b)
    model.set_attn_implementation("eager")
    with torch.no_grad():  # the model's own capturing still works after ours
        assert len(model(IDS, output_attentions=True).attentions) == 3


def test_model_is_restored_when_the_forward_raises():
    model = make_tiny_model("bert")
    model.train()
    model.embeddings.word_embeddings.weight.requires_grad_(False)
    handle = model.register_forward_hook(lambda *args: None)
    before = full_state(model)
    with pytest.raises(IndexError):
        extract_attentions(model, torch.tensor([[5, 500]]))  # id beyond the vocabulary
    assert full_state(model) == before
    assert model.training and model.config._attn_implementation == "sdpa"
    handle.remove()


def test_eager_attention_switches_and_restores_every_submodel():
    wrapper = FirstTokenClassifier("bert")
    with eager_attention(wrapper):
        assert wrapper.encoder.config._attn_implementation == "eager"
    assert wrapper.encoder.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="inside"):
        with eager_attention(wrapper):
            raise RuntimeError("inside")
    assert wrapper.encoder.config._attn_implementation == "sdpa"


def tiny_vit_config():
    return transformers.ViTConfig(
        image_size=8, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64,
    )


def test_vision_transformer_attentions():
    torch.manual_seed(0)
    model = transformers.ViTModel(tiny_vit_config()).eval()
    pixels = torch.randn(2, 3, 8, 8)
    attentions = extract_attentions(model, pixels)
    assert len(attentions) == 2 and attentions[0].shape == (2, 4, 5, 5)  # 4 patches + CLS
    model.set_attn_implementation("eager")
    with torch.no_grad():
        for ours, reference in zip(attentions, model(pixels, output_attentions=True).attentions):
            torch.testing.assert_close(ours, reference)


ENCODER_DECODERS = {
    "bart": lambda: transformers.BartModel(
        transformers.BartConfig(
            vocab_size=60, d_model=32, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        )
    ),
    "t5": lambda: transformers.T5ForConditionalGeneration(
        transformers.T5Config(vocab_size=60, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=1, num_heads=4)
    ),
}


@pytest.mark.parametrize("name", sorted(ENCODER_DECODERS))
def test_encoder_decoder_models_give_their_encoders_attentions(name):
    torch.manual_seed(0)
    model = ENCODER_DECODERS[name]().eval()  # sdpa, as loaded; T5 cannot even run without decoder inputs
    before = full_state(model)
    mask = torch.ones_like(IDS)
    mask[1, 4:] = 0
    attentions = extract_attentions(model, IDS, attention_mask=mask)
    assert full_state(model) == before
    with eager_attention(model), torch.no_grad():
        reference = model.get_encoder()(IDS, attention_mask=mask, output_attentions=True).attentions
    assert len(attentions) == 2
    for ours, expected in zip(attentions, reference):
        torch.testing.assert_close(ours, expected)
    with pytest.raises(ValueError, match="encoder-decoder model.*takes no additional_forward_args"):
        extract_attentions(model, IDS, additional_forward_args=(IDS,))


def test_wrapper_around_an_encoder_decoder_model_gives_the_encoders_attentions():
    class LastStateMean(nn.Module):
        def __init__(self):
            super().__init__()
            self.seq2seq = ENCODER_DECODERS["bart"]()  # called whole: decoder inputs made from the ids

        def forward(self, ids):
            return self.seq2seq(ids).last_hidden_state.mean(1)

    torch.manual_seed(0)
    wrapper = LastStateMean().eval()
    attentions = extract_attentions(wrapper, IDS)
    with eager_attention(wrapper), torch.no_grad():
        reference = wrapper.seq2seq.get_encoder()(IDS, output_attentions=True).attentions
    for ours, expected in zip(attentions, reference):
        torch.testing.assert_close(ours, expected)


def test_eager_attention_restores_every_config_of_a_composite_model():
    text = transformers.BertConfig(
        vocab_size=60, hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2
    )
    config = transformers.VisionTextDualEncoderConfig.from_vision_text_configs(tiny_vit_config(), text)
    model = transformers.VisionTextDualEncoderModel(config).eval()
    configs = [model.config, model.config.vision_config, model.config.text_config, model.vision_model.config]
    with eager_attention(model):
        assert {c._attn_implementation for c in configs} == {"eager"}
    assert {c._attn_implementation for c in configs} == {"sdpa"}


def test_nn_module_wrapper_captures_its_models_attentions(arch):
    wrapper = FirstTokenClassifier(arch)
    before = full_state(wrapper)
    mask = torch.ones_like(IDS)
    attentions = extract_attentions(wrapper, IDS, additional_forward_args=(mask,), attention_mask=mask)
    for ours, reference in zip(attentions, eager_attentions(arch, IDS, attention_mask=mask)):
        torch.testing.assert_close(ours, reference)
    assert full_state(wrapper) == before


def test_wrapper_taking_attention_mask_gets_it():
    wrapper = FirstTokenClassifier("bert")
    mask = torch.ones_like(IDS)
    mask[1, 4:] = 0
    expected = extract_attentions(wrapper.encoder, IDS, attention_mask=mask)
    for got, want in zip(extract_attentions(wrapper, IDS, attention_mask=mask), expected):
        torch.testing.assert_close(got, want)


def test_wrapper_that_drops_the_mask_of_a_padded_batch_is_an_error():
    class DropsMask(FirstTokenClassifier):
        def forward(self, input_ids):
            return super().forward(input_ids)

    wrapper = DropsMask("bert")
    mask = torch.ones_like(IDS)
    mask[1, 4:] = 0
    with pytest.raises(ValueError, match="calls its BertModel without an attention_mask"):
        extract_attentions(wrapper, IDS, attention_mask=mask)
    assert wrapper.encoder.config._attn_implementation == "sdpa"
    assert not wrapper.encoder._forward_pre_hooks and not wrapper.encoder._forward_hooks


def test_wrapper_that_never_calls_its_model_is_an_error():
    class Unused(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = make_tiny_model("bert")

        def forward(self, ids):
            return ids.float()

    with pytest.raises(ValueError, match="never called its Hugging Face model"):
        extract_attentions(Unused(), IDS)


@pytest.mark.parametrize("form", ["tuple", "list", "stacked", "object"])
def test_plain_callable_returning_attentions(form):
    attentions = torch.softmax(torch.randn(3, 2, 4, 6, 6), -1)

    class Output:
        pass

    def forward(ids, scale):
        assert scale == 2 and ids is IDS
        output = {"tuple": tuple(attentions), "list": list(attentions), "stacked": attentions}.get(form)
        if output is None:
            output = Output()
            output.attentions = tuple(attentions)
        return output

    extracted = extract_attentions(forward, IDS, additional_forward_args=2)
    assert len(extracted) == 3
    torch.testing.assert_close(torch.stack(extracted), attentions)


@pytest.mark.parametrize("returned", [None, (), torch.zeros(2, 6, 32), {"logits": torch.zeros(2)}])
def test_callable_returning_no_attentions_is_an_error(returned):
    with pytest.raises(ValueError, match="the model returned no attentions"):
        extract_attentions(lambda ids: returned, IDS)


def test_hf_model_that_cannot_return_attentions_is_an_error():
    model = make_tiny_model("bert")
    hidden = torch.zeros(2, 6, 32)
    # a model whose forward ignores output_attentions: no attentions come back
    model.forward = lambda *args, **kwargs: transformers.modeling_outputs.BaseModelOutput(last_hidden_state=hidden)
    with pytest.raises(ValueError, match="the model returned no attentions"):
        extract_attentions(model, IDS)
    assert model.config._attn_implementation == "sdpa"


def test_inputs_on_another_device_than_the_model_is_an_error():
    model = make_tiny_model("bert").to("meta")
    with pytest.raises(ValueError, match=r"inputs are on cpu but the model is on meta; move them with inputs.to\('meta'\)"):
        extract_attentions(model, IDS)


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama"])
def test_left_padding_gets_positions_counted_over_real_tokens(arch):
    model = make_tiny_model(arch)
    ids = torch.tensor([[0, 0, 5, 9, 13]])
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    padded = extract_attentions(model, ids, attention_mask=mask)
    alone = extract_attentions(model, ids[:, 2:])
    for ours, reference in zip(padded, alone):
        torch.testing.assert_close(ours[..., 2:, 2:], reference, atol=1e-6, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_model_with_cpu_inputs_is_an_error():
    model = make_tiny_model("bert").cuda()
    with pytest.raises(ValueError, match="inputs are on cpu but the model is on cuda:0"):
        extract_attentions(model, IDS)
    attentions = extract_attentions(model, IDS.cuda())
    assert attentions[0].device.type == "cuda"
