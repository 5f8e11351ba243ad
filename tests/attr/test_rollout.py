import copy

import pytest
import torch

from helpers import FirstTokenClassifier, model_state
from captum_attnflow import AttentionRollout
from captum_attnflow.functional import rollout
from helpers import CAUSAL, make_tiny_model

IDS = torch.tensor([[5, 9, 13, 22, 7, 30], [6, 8, 10, 11, 12, 14]])
PAD_ID = {"bert": 0, "distilbert": 0, "roberta": 1, "gpt2": 0, "llama": 0}


def explained_position(arch):
    """A position that sees the whole sentence: the first token, or the last one for causal GPT-2."""
    return -1 if arch in CAUSAL else 0


def eager_rollout(arch, ids, **kwargs):
    """Full rollout maps (L, B, n, n) of the eager-loaded model's attentions, straight from transformers."""
    model = make_tiny_model(arch, attn_implementation="eager")
    with torch.no_grad():
        return rollout(model(ids, output_attentions=True, **kwargs).attentions)


def full_state(model):
    configs = [getattr(m, "config", None) for m in model.modules()]
    return model_state(model), [c.output_attentions for c in configs if c is not None]


def test_rollout_of_sdpa_model_equals_eager_model_and_leaves_it_unchanged(arch):
    model = make_tiny_model(arch)
    before = full_state(model)
    maps = eager_rollout(arch, IDS)
    explainer = AttentionRollout(model)
    torch.testing.assert_close(explainer.attribute(IDS, position=3, layer=2), maps[1, :, 3])
    torch.testing.assert_close(explainer.attribute(IDS, position=torch.tensor([0, 5])), maps[-1, [0, 1], [0, 5]])
    all_layers = explainer.attribute(IDS, position=explained_position(arch), layer=None)
    assert all_layers.shape == (3, 2, 6) and all_layers.dtype == torch.float32
    torch.testing.assert_close(all_layers, maps[:, :, explained_position(arch)])
    torch.testing.assert_close(explainer.attribute(IDS, position=-1, layer=-3), maps[0, :, -1])
    assert full_state(model) == before and model.config._attn_implementation == "sdpa"


def test_rollout_of_eager_loaded_model(arch):
    model = make_tiny_model(arch, attn_implementation="eager")
    scores = AttentionRollout(model).attribute(IDS, position=explained_position(arch))
    torch.testing.assert_close(scores, eager_rollout(arch, IDS)[-1, :, explained_position(arch)])
    assert model.config._attn_implementation == "eager"


def padded(sentences, arch, side):
    """Token ids (B, n) and attention mask of ``sentences`` padded with the model's pad id on ``side``."""
    n = max(len(s) for s in sentences)
    ids = torch.full((len(sentences), n), PAD_ID[arch])
    mask = torch.zeros(len(sentences), n, dtype=torch.long)
    for row, sentence in enumerate(sentences):
        where = slice(0, len(sentence)) if side == "right" else slice(n - len(sentence), n)
        ids[row, where] = torch.tensor(sentence)
        mask[row, where] = 1
    return ids, mask


@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_invariance(arch, side):
    """Each sentence padded in a batch gets, on its real tokens, its attributions alone to 1e-6; padding gets 0."""
    if side == "left" and arch in ("distilbert", "roberta"):
        pytest.skip("left padding is checked on one absolute-position encoder (BERT) and on the decoders")
    sentences = [[5, 9, 13, 22, 7], [6, 8, 10, 11, 12, 14, 15, 16], [20, 21, 23]]
    ids, mask = padded(sentences, arch, side)
    n = ids.shape[1]
    explainer = AttentionRollout(make_tiny_model(arch))
    if arch in CAUSAL:  # the last real token
        positions = mask.sum(1) - 1 if side == "right" else torch.full((3,), n - 1)
    else:  # the first real token
        positions = torch.zeros(3, dtype=torch.long) if side == "right" else n - mask.sum(1)
    batch = explainer.attribute(ids, position=positions, layer=None, attention_mask=mask)
    for row, sentence in enumerate(sentences):
        alone = explainer.attribute(torch.tensor([sentence]), position=explained_position(arch), layer=None)
        real = mask[row].bool()
        torch.testing.assert_close(batch[:, row, real], alone[:, 0], atol=1e-6, rtol=0)
        assert (batch[:, row, ~real] == 0).all()


def test_batch_invariance(arch):
    ids = torch.randint(5, 60, (4, 7), generator=torch.Generator().manual_seed(1))
    explainer = AttentionRollout(make_tiny_model(arch))
    position = explained_position(arch)
    batch = explainer.attribute(ids, position=position, layer=None)
    for row in range(4):
        alone = explainer.attribute(ids[row : row + 1], position=position, layer=None)
        torch.testing.assert_close(batch[:, row : row + 1], alone, atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", ["bert", "distilbert"])
def test_nn_module_wrapper_path(arch):
    """A classifier head over a base model: the base model's attentions are captured, the mask goes through."""
    wrapper = FirstTokenClassifier(arch)
    wrapper.train()
    before = full_state(wrapper)
    ids, mask = padded([[5, 9, 13, 22, 7], [6, 8, 10, 11, 12, 14, 15, 16]], arch, "right")
    scores = AttentionRollout(wrapper).attribute(ids, additional_forward_args=(mask,), attention_mask=mask, layer=None)
    direct = AttentionRollout(wrapper.encoder).attribute(ids, attention_mask=mask, layer=None)
    torch.testing.assert_close(scores, direct)
    assert full_state(wrapper) == before and wrapper.training


def test_plain_callable_path():
    model = make_tiny_model("bert", attn_implementation="eager")

    def forward(ids, attention_mask):
        with torch.no_grad():
            return model(ids, attention_mask=attention_mask, output_attentions=True).attentions

    ids, mask = padded([[5, 9, 13], [6, 8, 10, 11, 12]], "bert", "right")
    scores = AttentionRollout(forward).attribute(ids, additional_forward_args=(mask,), attention_mask=mask)
    expected = AttentionRollout(make_tiny_model("bert")).attribute(ids, attention_mask=mask)
    torch.testing.assert_close(scores, expected)


@pytest.mark.parametrize(("dtype", "atol"), [(torch.float16, 5e-4), (torch.bfloat16, 3e-3)])
def test_half_precision_models_match_float32(arch, dtype, atol):
    """Maths in float32 on half-precision attentions: only the model's own rounding remains.

    bfloat16 keeps 8 significant bits (relative rounding 4e-3), float16 11 bits (5e-4); on
    attributions of about 1/n the measured differences are below 2e-4 (bf16) and 3e-5 (fp16).
    """
    ids = torch.randint(5, 60, (3, 12), generator=torch.Generator().manual_seed(0))
    position = explained_position(arch)
    reference = AttentionRollout(make_tiny_model(arch)).attribute(ids, position=position, layer=None)
    scores = AttentionRollout(make_tiny_model(arch).to(dtype)).attribute(ids, position=position, layer=None)
    assert scores.dtype == torch.float32
    torch.testing.assert_close(scores, reference, atol=atol, rtol=0)


def test_model_is_left_unchanged_when_the_forward_raises():
    model = make_tiny_model("gpt2")
    model.train()
    model.h[0].attn.c_attn.weight.requires_grad_(False)
    model.config.output_attentions = False
    handle = model.register_forward_pre_hook(lambda *args: None)

    def fail(*args):
        raise RuntimeError("inside the forward")

    failing = model.h[1].register_forward_pre_hook(fail)
    before = full_state(model)
    with pytest.raises(RuntimeError, match="inside the forward"):
        AttentionRollout(model).attribute(torch.tensor([[5, 6]]))
    assert full_state(model) == before and model.config._attn_implementation == "sdpa"
    failing.remove()
    handle.remove()


def test_is_a_class_agnostic_captum_attribution():
    explainer = AttentionRollout(make_tiny_model("bert"))
    assert not explainer.has_convergence_delta()
    torch.testing.assert_close(explainer.attribute(IDS, target=torch.tensor([1, 0])), explainer.attribute(IDS))


def softmax_attentions(*shape):
    return torch.softmax(torch.randn(*shape, generator=torch.Generator().manual_seed(0)), -1)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda e: e.attribute(IDS[0]), ValueError, r"token ids of shape \(B, n\), got shape \(6,\)"),
        (lambda e: e.attribute(IDS.float()), TypeError, "must be integer token ids"),
        (lambda e: e.attribute(IDS.tolist()), TypeError, "inputs must be a tensor of token ids"),
        (lambda e: e.attribute(IDS[:, :0]), ValueError, r"empty sequence"),
        (lambda e: e.attribute(IDS, layer=0), ValueError, "layer=0 is out of range for a model with L=3 layers"),
        (lambda e: e.attribute(IDS, layer=-4), ValueError, "layer=-4 is out of range"),
        (lambda e: e.attribute(IDS, position=6), ValueError, r"position \[6, 6\] is out of range for sequences of n=6"),
        (lambda e: e.attribute(IDS, position=torch.tensor([0])), ValueError, r"\(B,\) = \(2,\), one per example"),
        (
            lambda e: e.attribute(IDS, position=5, attention_mask=torch.tensor([[1] * 6, [1] * 4 + [0] * 2])),
            ValueError,
            r"padding token in examples \[1\]",
        ),
        (lambda e: e.attribute(IDS, attention_mask=torch.ones(2, 5)), ValueError, "attention_mask must have shape"),
        (lambda e: e.attribute(IDS, head_fusion="median"), ValueError, "head_fusion must be one of"),
        (lambda e: e.attribute(IDS, residual_alpha=1.5), ValueError, r"residual_alpha must lie in \[0, 1\]"),
    ],
)
def test_bad_arguments_get_clear_errors(call, error, match):
    with pytest.raises(error, match=match):
        call(AttentionRollout(make_tiny_model("bert")))


@pytest.mark.parametrize(
    ("returned", "match"),
    [
        (None, "the model returned no attentions"),
        ((), "the model returned no attentions"),
        (tuple(softmax_attentions(2, 2, 3, 6, 6) - 0.5), "must be nonnegative"),
        (tuple(softmax_attentions(2, 2, 3, 6, 6) * 2), "must sum to 1"),
        (tuple(softmax_attentions(2, 2, 3, 6, 6).index_fill(-1, torch.tensor([1]), float("nan"))), "NaN"),
        (tuple(softmax_attentions(2, 2, 3, 5, 5)), r"attentions over 5 tokens for 2 examples but inputs have shape \(2, 6\)"),
        (tuple(softmax_attentions(2, 3, 3, 6, 6)), r"expected one \(B, H, n, n\) = \(2, H, 6, 6\)"),
        ((softmax_attentions(2, 3, 6, 6), softmax_attentions(2, 3, 5, 5)), "same shape"),
    ],
)
def test_bad_attentions_from_a_callable_get_clear_errors(returned, match):
    with pytest.raises(ValueError, match=match):
        AttentionRollout(lambda ids: returned).attribute(IDS)


def test_inputs_and_model_on_different_devices_is_an_error():
    with pytest.raises(ValueError, match=r"inputs are on cpu but the model is on meta"):
        AttentionRollout(make_tiny_model("bert").to("meta")).attribute(IDS)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_rollout_on_cuda_equals_cpu_and_stays_on_the_inputs_device(arch):
    model = make_tiny_model(arch)
    ids, mask = padded([[5, 9, 13, 22, 7], [6, 8, 10, 11, 12, 14, 15, 16]], arch, "right")
    position = explained_position(arch) if arch not in CAUSAL else mask.sum(1) - 1
    on_cpu = AttentionRollout(model).attribute(ids, position=position, layer=None, attention_mask=mask)
    cuda = copy.deepcopy(model).cuda()
    on_gpu = AttentionRollout(cuda).attribute(
        ids.cuda(), position=position, layer=None, attention_mask=mask.cuda()
    )
    assert on_gpu.device.type == "cuda" and cuda.config._attn_implementation == "sdpa"
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="inputs are on cpu but the model is on cuda"):
        AttentionRollout(cuda).attribute(ids)

@pytest.mark.parametrize("method", ["raw", "rollout", "flow"])
def test_vision_transformer_pixels_give_scores_over_its_tokens(method):
    from transformers import ViTConfig, ViTForImageClassification

    from captum_attnflow import AttentionFlow, RawAttention
    from captum_attnflow.functional import flow

    torch.manual_seed(0)
    config = ViTConfig(
        image_size=8, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=3,
    )
    model = ViTForImageClassification(config).eval()  # sdpa, as loaded
    pixels = torch.randn(2, 3, 8, 8)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attentions = model(pixels, output_attentions=True).attentions  # 4 patches + [CLS]: n = 5
    model.set_attn_implementation("sdpa")
    expected = {
        "raw": attentions[-1].mean(1)[:, 0],  # raw attention: no residual by default
        "rollout": rollout(attentions)[-1, :, 0],
        "flow": flow(attentions, sources=0),
    }[method]
    explainer = {"raw": RawAttention, "rollout": AttentionRollout, "flow": AttentionFlow}[method](model)
    scores = explainer.attribute(pixels, target=1)
    assert scores.shape == (2, 5)
    torch.testing.assert_close(scores, expected)
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="images have no padding"):
        explainer.attribute(pixels, attention_mask=torch.ones(2, 5))
