"""ImageTextSimilarity: a CLIP or SigLIP model's image-text logits as a module of one side, explained
by every method of the registry that reads its tower."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
import torch
import transformers
from captum.attr import Saliency

from captum_attnflow import (
    ALTI,
    AttentionFlow,
    AttentionRollout,
    AttnLRP,
    GradientWeightedRollout,
    ImageTextSimilarity,
    RawAttention,
)
from captum_attnflow.baselines import TokenSaliency
from captum_attnflow.methods import EXTRA_METHODS, METHODS, method_entry
from captum_attnflow.visualize import plot_patch_heatmap
from tests.helpers import model_state

_SMALL = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, initializer_range=0.2)
_TEXT = dict(_SMALL, vocab_size=50, max_position_embeddings=8, pad_token_id=1, bos_token_id=0, eos_token_id=49)
_VISION = dict(_SMALL, image_size=16, patch_size=8)
# Tokens of the explained side: [CLS] and 4 patches (CLIP), 4 patches (SigLIP, no class token), 6 text tokens.
_TOKENS = {("clip", "image"): 5, ("siglip", "image"): 4, ("clip", "text"): 6, ("siglip", "text"): 6}


def _model(family: str, implementation: str = "sdpa") -> transformers.PreTrainedModel:
    """A tiny CLIPModel or SiglipModel as transformers 5 loads one (sdpa, eval mode)."""
    torch.manual_seed(0)
    if family == "clip":
        config = transformers.CLIPConfig(text_config=_TEXT, vision_config=_VISION, projection_dim=8)
        config.logit_scale_init_value = 1.5
        model = transformers.CLIPModel(config)
    else:
        model = transformers.SiglipModel(transformers.SiglipConfig(text_config=_TEXT, vision_config=_VISION))
        with torch.no_grad():  # initialised at zero: a scale and bias that change the logits
            model.logit_scale.fill_(1.2)
            model.logit_bias.fill_(-0.7)
    model.set_attn_implementation(implementation)
    return model.eval()


def _texts(family: str, rows: int = 2) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(rows, 6) token ids ending in the end-of-text token 49 and their mask: CLIP padded on the
    right with a mask, SigLIP padded to the fixed length with no mask, as each model reads them."""
    ids = torch.tensor([[0, 5, 7, 49, 1, 1], [0, 9, 3, 4, 8, 49], [0, 12, 49, 1, 1, 1]])[:rows]
    if family == "siglip":
        return ids, None
    return ids, (ids != 1).long()


def _images(rows: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


def _similarity(family: str, side: str, model=None) -> tuple[ImageTextSimilarity, torch.Tensor, dict]:
    """(the similarity of 2 explained examples against 3 fixed ones, the explained inputs, their keyword arguments)."""
    model = model if model is not None else _model(family)
    if side == "image":
        ids, mask = _texts(family, 3)
        return ImageTextSimilarity(model, text=ids, attention_mask=mask), _images(), {}
    ids, mask = _texts(family)
    return ImageTextSimilarity(model, image=_images(3, seed=1)), ids, {} if mask is None else {"attention_mask": mask}


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_scores_are_the_models_logits(family):
    model = _model(family)
    texts, text_mask = _texts(family, 3)
    images = _images()
    output = model(texts, images, attention_mask=text_mask)
    images_explained = ImageTextSimilarity(model, text=texts, attention_mask=text_mask)
    torch.testing.assert_close(images_explained(images), output.logits_per_image)  # (2 images, 3 texts)
    as_encoding = {"input_ids": texts} if text_mask is None else {"input_ids": texts, "attention_mask": text_mask}
    torch.testing.assert_close(ImageTextSimilarity(model, text=as_encoding)(images), output.logits_per_image)
    texts_explained = ImageTextSimilarity(model, image={"pixel_values": images})
    torch.testing.assert_close(texts_explained(texts, attention_mask=text_mask), output.logits_per_text)  # (3 texts, 2 images)
    assert images_explained.side == "image" and images_explained.tower is model.vision_model
    assert texts_explained.side == "text" and texts_explained.tower is model.text_model


_RUNS = [
    (family, side, name)
    for family in ("clip", "siglip")
    for side in ("image", "text")
    for name in [*METHODS, *EXTRA_METHODS]
    if side == "text" or method_entry(name).per_layer  # token methods; AttnLRP: below
]


@pytest.mark.parametrize("family, side, name", _RUNS)
def test_every_method_explains_each_side(family, side, name):
    similarity, inputs, kwargs = _similarity(family, side)
    method = method_entry(name)
    # The token a blank-out or integrated-gradients baseline puts in: no tokenizer here to name it.
    options = {"token": 0, "softmax": False} if name == "blankout" else {}
    if name == "integrated_gradients":
        kwargs = {**kwargs, "baselines": 1}
    target = {"target": [2, 0]} if method.class_specific else {}
    scores = method.build(similarity, None, **options).attribute(inputs, **target, **kwargs)
    assert scores.shape == (2, _TOKENS[family, side])
    assert bool(torch.isfinite(scores).all()) and bool(scores.abs().sum() > 0)


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_images_by_captum_saliency_and_attnlrp(family):
    """AttnLRP of the image side: the class token's and each patch embedding's relevance (the
    towers' rules are tested against the float64 reference in tests/attr/test_families_methods.py)."""
    similarity, images, _ = _similarity(family, "image")
    assert Saliency(similarity).attribute(images.requires_grad_(), target=1).shape == images.shape
    relevance = AttnLRP(similarity).attribute(images.detach(), target=1)
    assert relevance.shape == (2, _TOKENS[family, "image"])
    assert bool(torch.isfinite(relevance).all()) and bool(relevance.abs().sum() > 0)


def _pooled(family: str, side: str, inputs: torch.Tensor) -> torch.Tensor | int:
    """Where the model pools, read off the inputs by hand: CLIP's first end-of-text token (49) and
    class token, SigLIP's last text position."""
    if side == "image":
        return 0
    if family == "clip":
        return torch.tensor([3, 5])
    return inputs.shape[1] - 1


@pytest.mark.parametrize("family, side", [("clip", "image"), ("clip", "text"), ("siglip", "text")])
@pytest.mark.parametrize("method", [RawAttention, AttentionRollout, AttentionFlow, ALTI])
def test_default_position_is_where_the_tower_pools(family, side, method):
    similarity, inputs, kwargs = _similarity(family, side)
    ours = method(similarity).attribute(inputs, **kwargs)
    on_the_tower = method(similarity.tower).attribute(inputs, position=_pooled(family, side, inputs), **kwargs)
    torch.testing.assert_close(ours, on_the_tower)


@pytest.mark.parametrize("method", [RawAttention, AttentionRollout, ALTI])
def test_siglip_images_mix_the_patches_rows_by_the_pooling_heads_attention(method):
    similarity, images, _ = _similarity("siglip", "image")
    kept = []
    head = similarity.tower.head.attention  # the model's own forward calls it with need_weights=True
    handle = head.register_forward_hook(lambda module, args, output: kept.append(output[1]))
    with torch.no_grad():
        similarity.tower(images)
    handle.remove()
    weights = kept[0][:, 0]  # (B, n), heads averaged
    rows = method(similarity.tower).attribute(images, position=list(range(4)), layer=None)  # (L, B, n, n)
    expected = torch.einsum("bs,lbsn->lbn", weights, rows)
    torch.testing.assert_close(method(similarity).attribute(images, layer=None), expected)
    torch.testing.assert_close(expected.sum(-1), torch.ones(2, 2))  # rows summing to 1 mixed by weights summing to 1


def _chefer_reference(family: str, side: str, target: list[int]) -> torch.Tensor:
    """Chefer et al.'s R (equations 5-6) from the model's own eager attention and autograd on its own
    ``logits_per_image`` / ``logits_per_text``, the explained examples' row where the tower pools
    (SigLIP's images: the rows mixed by the pooling head's attention, kept from the model's forward)."""
    model = _model(family, "eager")
    kept = []
    if side == "image":
        ids, mask = _texts(family, 3)
        if family == "siglip":
            model.vision_model.head.attention.register_forward_hook(lambda module, args, output: kept.append(output[1]))
        output = model(ids, _images(), attention_mask=mask, output_attentions=True)
        attentions, logits = output.vision_model_output.attentions, output.logits_per_image
    else:
        ids, mask = _texts(family)
        output = model(ids, _images(3, seed=1), attention_mask=mask, output_attentions=True)
        attentions, logits = output.text_model_output.attentions, output.logits_per_text
    n = _TOKENS[family, side]
    score = logits[torch.arange(2), torch.tensor(target)].sum()
    gradients = torch.autograd.grad(score, attentions)
    relevance = torch.eye(n).expand(2, n, n)
    for attention, gradient in zip(attentions, gradients):
        weighted = (gradient * attention).clamp(min=0).mean(1)
        relevance = relevance + weighted @ relevance
    if kept:
        return torch.einsum("bs,bsn->bn", kept[0][:, 0], relevance).detach()
    rows = _pooled(family, side, ids)
    return relevance[torch.arange(2), rows].detach()


@pytest.mark.parametrize("family, side", [("clip", "image"), ("clip", "text"), ("siglip", "image"), ("siglip", "text")])
@pytest.mark.parametrize("lean", [None, False])
def test_gradient_rollout_is_chefers_on_the_models_own_logits(family, side, lean):
    similarity, inputs, kwargs = _similarity(family, side)
    ours = GradientWeightedRollout(similarity, lean=lean).attribute(inputs, target=[2, 0], **kwargs)
    torch.testing.assert_close(ours, _chefer_reference(family, side, [2, 0]), atol=1e-5, rtol=1e-4)


def _token_gradients(model, ids, mask, images, target):
    """Gradient of the model's own ``logits_per_text[b, target[b]]`` with respect to its token embeddings."""
    kept = []

    def leaf(module, args, output):
        kept.append(output.detach().requires_grad_())
        return kept[0]

    handle = model.text_model.embeddings.token_embedding.register_forward_hook(leaf)
    logits = model(ids, images, attention_mask=mask).logits_per_text
    handle.remove()
    (gradient,) = torch.autograd.grad(logits[torch.arange(2), torch.tensor(target)].sum(), kept[0])
    return gradient


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_saliency_is_the_gradient_of_the_models_own_logits(family):
    model = _model(family)
    ids, mask = _texts(family)
    images = _images(3, seed=1)
    texts = ImageTextSimilarity(model, image=images)
    ours = TokenSaliency(texts).attribute(ids, target=[1, 2], attention_mask=mask)
    expected = _token_gradients(model, ids, mask, images, [1, 2]).norm(dim=-1)
    torch.testing.assert_close(ours, expected if mask is None else expected * mask)
    fixed_texts, fixed_mask = _texts(family, 3)
    pixels = _images().requires_grad_()
    logits = model(fixed_texts, pixels, attention_mask=fixed_mask).logits_per_image
    (pixel_gradient,) = torch.autograd.grad(logits[:, 1].sum(), pixels)
    images_explained = ImageTextSimilarity(model, text=fixed_texts, attention_mask=fixed_mask)
    torch.testing.assert_close(Saliency(images_explained).attribute(_images().requires_grad_(), target=1), pixel_gradient.abs())


class _Cosine(torch.nn.Module):
    """The similarity written out, its norm detached by hand (``held``: the identity rule on the
    cosine's division) or not (its plain gradient)."""

    def __init__(self, similarity: ImageTextSimilarity, held: bool) -> None:
        super().__init__()
        self.similarity = similarity
        self.held = held

    def forward(self, ids, attention_mask=None):
        s = self.similarity
        embeddings = s.projection(s.tower(input_ids=ids, attention_mask=attention_mask).pooler_output)
        norm = embeddings.norm(dim=-1, keepdim=True)
        logits = embeddings / (norm.detach() if self.held else norm) @ s.fixed.t() * s.logit_scale.exp()
        return logits if s.logit_bias is None else logits + s.logit_bias


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_attnlrp_holds_the_cosines_norm(family):
    similarity, ids, kwargs = _similarity(family, "text")
    ours = AttnLRP(similarity).attribute(ids, target=[1, 2], **kwargs)
    torch.testing.assert_close(ours, AttnLRP(_Cosine(similarity, held=True)).attribute(ids, target=[1, 2], **kwargs))
    plain = AttnLRP(_Cosine(similarity, held=False)).attribute(ids, target=[1, 2], **kwargs)
    assert not torch.allclose(ours, plain, atol=1e-3)  # the rule changes the relevance: the test can tell them apart


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_lean_equals_stored_through_the_similarity(family):
    for side in ("image", "text"):
        similarity, inputs, kwargs = _similarity(family, side)
        for method in (RawAttention, AttentionRollout):
            lean = method(similarity, lean=True).attribute(inputs, layer=None, **kwargs)
            stored = method(similarity, lean=False).attribute(inputs, layer=None, **kwargs)
            torch.testing.assert_close(lean, stored, atol=1e-6, rtol=0)
        lean = GradientWeightedRollout(similarity, lean=True).attribute(inputs, target=[0, 1], layer=None, **kwargs)
        stored = GradientWeightedRollout(similarity, lean=False).attribute(inputs, target=[0, 1], layer=None, **kwargs)
        torch.testing.assert_close(lean, stored, atol=1e-5, rtol=0)


def test_the_model_is_left_as_it_was():
    model = _model("clip").train()
    model.text_model.register_forward_hook(lambda *args: None)
    before = model_state(model)
    texts = _similarity("clip", "text", model)
    for similarity, inputs, kwargs in (_similarity("clip", "image", model), texts):
        AttentionRollout(similarity).attribute(inputs, **kwargs)
        GradientWeightedRollout(similarity, lean=False).attribute(inputs, target=1, **kwargs)
        ALTI(similarity).attribute(inputs, **kwargs)
        with pytest.raises(ValueError, match="out of range"):
            RawAttention(similarity, lean=False).attribute(inputs, position=9, **kwargs)
    AttnLRP(texts[0]).attribute(texts[1], target=0, **texts[2])
    TokenSaliency(texts[0]).attribute(texts[1], target=0, **texts[2])
    assert model_state(model) == before
    assert model.config._attn_implementation == "sdpa" and model.vision_model.config._attn_implementation == "sdpa"


def test_clear_errors():
    model = _model("clip")
    ids, mask = _texts("clip")
    images = _images()
    bert = transformers.BertModel(transformers.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                                          intermediate_size=32))
    with pytest.raises(TypeError, match="takes a CLIPModel or SiglipModel"):
        ImageTextSimilarity(bert, text=ids)
    with pytest.raises(TypeError, match="a single tower"):
        ImageTextSimilarity(model.text_model, image=images)
    with pytest.raises(ValueError, match="exactly one of text= .* and image="):
        ImageTextSimilarity(model, text=ids, image=images)
    with pytest.raises(ValueError, match="exactly one of"):
        ImageTextSimilarity(model)
    with pytest.raises(ValueError, match="no 'pixel_values'"):
        ImageTextSimilarity(model, image={"input_ids": ids})
    with pytest.raises(TypeError, match="text must be texts as integer token ids"):
        ImageTextSimilarity(model, text=images)
    with pytest.raises(TypeError, match="inputs must be images as float pixel values"):
        ImageTextSimilarity(model, text=ids, attention_mask=mask)(ids)
    with pytest.raises(ValueError, match="have 4 channels but the vision tower takes 3"):
        ImageTextSimilarity(model, text=ids, attention_mask=mask)(torch.rand(1, 4, 16, 16))
    with pytest.raises(ValueError, match="target has 3 entries for B = 2 examples"):
        GradientWeightedRollout(ImageTextSimilarity(model, text=ids, attention_mask=mask)).attribute(images, target=[0, 1, 0])
    siglip_texts = ImageTextSimilarity(_model("siglip"), image=images)
    with pytest.raises(ValueError, match="pass no attention_mask"):
        siglip_texts(ids, attention_mask=mask)
    with pytest.raises(ValueError, match="pass no attention_mask"):  # the tower alone runs here; the rule holds
        AttentionRollout(siglip_texts).attribute(ids, attention_mask=mask)
    with pytest.raises(ValueError, match="images have no padding"):
        ImageTextSimilarity(model, text=ids, attention_mask=mask)(images, attention_mask=torch.ones(2, 5))
    clip_texts = ImageTextSimilarity(model, image=images)
    with pytest.raises(ValueError, match="padded on the left; pad them on the right"):
        GradientWeightedRollout(clip_texts).attribute(ids.flip(1), target=0, attention_mask=mask.flip(1))
    with pytest.raises(ValueError, match="padded on the left"):  # also where the tower runs alone
        AttentionRollout(clip_texts).attribute(ids.flip(1), attention_mask=mask.flip(1))


@pytest.mark.parametrize("family, special_tokens", [("clip", 1), ("siglip", 0)])
def test_image_scores_lie_on_the_patch_grid(family, special_tokens):
    similarity, images, _ = _similarity(family, "image")
    scores = GradientWeightedRollout(similarity).attribute(images, target=0)
    figure = plot_patch_heatmap(scores[0], image=images[0], special_tokens=special_tokens)
    assert figure.axes[0].images[1].get_array().shape == (2, 2)  # a 16 x 16 image in 8 x 8 patches
    plt.close(figure)
