"""The image-text similarity of a CLIP or SigLIP model as a module of one side's inputs.

A ``CLIPModel`` or ``SiglipModel`` runs two separate transformers, a text tower and a vision
tower, and scores a pair by the cosine of their pooled, projected embeddings. The attribution
methods explain one transformer at a time, so :class:`ImageTextSimilarity` embeds one side
once (the fixed side) and is a function of the other side's inputs alone, running only that
side's tower: every method then explains that tower, for the score of each pair.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

from captum_attnflow.hf.inputs import real_tokens_first
from captum_attnflow.hf.models import check_device
from captum_attnflow.hf.state import held_in_lrp
from captum_attnflow.hf.state import unchanged

# model_type -> whether a logit bias is added (SigLIP's sigmoid loss has one, CLIP's softmax none).
_FAMILIES = {"clip": False, "siglip": True}


class ImageTextSimilarity(nn.Module):
    """The image-text logits of a CLIP or SigLIP model as a function of one side, the other fixed.

    .. math::
        s_{bk} = e^{\\tau} \\, \\frac{u_b^\\top v_k}{\\lVert u_b \\rVert \\, \\lVert v_k \\rVert} \\; (+\\, \\beta),

    with :math:`u_b` the pooled, projected embedding of explained example b (the tower's
    pooled output, CLIP's projection applied), :math:`v_k` that of fixed example k, computed once
    here, :math:`\\tau` the model's ``logit_scale`` and :math:`\\beta` SigLIP's ``logit_bias``:
    exactly the model's ``logits_per_image`` (images explained, texts fixed) or
    ``logits_per_text`` (texts explained, images fixed), (B, K) scores like a classifier's, so
    ``target`` picks the fixed example whose similarity is explained (Chefer et al., ICCV 2021,
    explain the image for its caption and the caption for its image: pass ``target`` one per
    example, ``list(range(B))``, when example b's pair is fixed example b).

    Only the explained side's tower runs (the fixed side is a buffer), so the attention methods
    read that tower's attention and its own internals, and gradient methods differentiate
    through it alone; the lean paths apply as on the tower itself. With ``position=None`` the
    per-position methods explain the position the tower pools (:meth:`pooled_position`): CLIP's
    end-of-text token and class token, SigLIP's last text position (padding included: SigLIP
    reads its text padded to a fixed length, no mask), and for SigLIP's vision tower, which has
    no class token and pools every patch with an attention head, each patch's row weighted by
    that head's attention (heads averaged). The model is left as it was.

    Args:
        model: a ``CLIPModel`` or ``SiglipModel`` (transformers 5, as loaded).
        text: the fixed texts, when the images are explained: token ids (K, m) or the
            tokenizer's output (its ``input_ids`` and ``attention_mask``).
        image: the fixed images, when the texts are explained: pixel values (K, C, H, W) or
            the processor's output (its ``pixel_values``).
        attention_mask: (K, m) the fixed texts' mask, when ``text`` is token ids.

    Attributes:
        side: ``"image"`` or ``"text"``, the side explained.
        tower: the explained side's Hugging Face model (``model.vision_model`` or ``model.text_model``).

    Raises:
        TypeError: not a CLIP or SigLIP model; inputs of the wrong kind.
        ValueError: both or neither of ``text`` and ``image``; a mapping without the inputs.

    Example::

        >>> import torch
        >>> from transformers import CLIPConfig, CLIPModel
        >>> from captum_attnflow import AttentionRollout, ImageTextSimilarity
        >>> small = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2)
        >>> model = CLIPModel(CLIPConfig(text_config=dict(small, vocab_size=50, eos_token_id=49, bos_token_id=0),
        ...     vision_config=dict(small, image_size=16, patch_size=8), projection_dim=8)).eval()
        >>> ids, pixels = torch.tensor([[0, 5, 7, 49]]), torch.rand(1, 3, 16, 16)
        >>> similarity = ImageTextSimilarity(model, text=ids)  # explains the image, the caption fixed
        >>> bool(torch.allclose(similarity(pixels), model(ids, pixels).logits_per_image))
        True
        >>> AttentionRollout(similarity).attribute(pixels).shape  # [CLS] and 4 patches
        torch.Size([1, 5])
    """

    def __init__(
        self, model: nn.Module, *, text: Any = None, image: Any = None, attention_mask: Tensor | None = None
    ) -> None:
        super().__init__()
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        if not isinstance(model, PreTrainedModel) or model_type not in _FAMILIES:
            raise TypeError(
                f"ImageTextSimilarity takes a CLIPModel or SiglipModel (model_type 'clip' or 'siglip'), got "
                f"{type(model).__name__}; a single tower (CLIPTextModel, CLIPVisionModel, ...) is explained directly."
            )
        if (text is None) == (image is None):
            raise ValueError(
                "give exactly one of text= (the fixed texts: the images are explained) and image= (the fixed images: "
                "the texts are explained)."
            )
        self.side = "image" if text is not None else "text"
        self.model_type = model_type
        self.tower = model.vision_model if self.side == "image" else model.text_model
        projection = getattr(model, "visual_projection" if self.side == "image" else "text_projection", None)
        self.projection = projection if projection is not None else nn.Identity()  # SigLIP projects in its towers
        self.logit_scale = model.logit_scale
        self.logit_bias = model.logit_bias if _FAMILIES[model_type] else None
        ids, mask = _text_inputs(text, attention_mask, "text") if text is not None else (None, None)
        pixels = _pixel_values(image, "image") if image is not None else None
        check_device(model.text_model if text is not None else model.vision_model, ids if text is not None else pixels)
        with torch.no_grad(), unchanged(model):
            if text is not None:
                fixed = model.get_text_features(input_ids=ids, attention_mask=mask).pooler_output
            else:
                fixed = model.get_image_features(pixel_values=pixels).pooler_output
        self.register_buffer("fixed", fixed / fixed.norm(dim=-1, keepdim=True), persistent=False)

    def forward(self, inputs: Any, attention_mask: Tensor | None = None) -> Tensor:
        """(B, K) the logits of each explained example against each fixed one.

        Args:
            inputs: pixel values (B, C, H, W) when the images are explained, token ids (B, n)
                (or the tokenizer's output) when the texts are.
            attention_mask: (B, n) the texts' mask (none for images; SigLIP: none, or no padding marked).

        Raises:
            TypeError: inputs of the other side's kind.
            ValueError: a mask with images, CLIP texts padded on the left, SigLIP texts with padding
                marked, or images with another number of channels than the tower's.
        """
        embeddings = self.projection(self._pooled(inputs, attention_mask))
        # AttnLRP holds the norm constant (its identity rule on a division), which makes the
        # cosine linear in the embedding; its plain gradient would be orthogonal to it.
        unit = embeddings / held_in_lrp(embeddings.norm(dim=-1, keepdim=True))
        # On the explained tower's device: a model spread over devices may hold the fixed side elsewhere.
        logits = unit @ self.fixed.to(unit).t() * self.logit_scale.exp().to(unit)
        return logits if self.logit_bias is None else logits + self.logit_bias.to(unit)

    def pooled_position(self, inputs: Any, attention_mask: Tensor | None = None) -> Tensor:
        """Where the explained tower pools its output: (B,) token indices, or (B, n) weights over the tokens.

        * CLIP's text tower: the end-of-text token, found as the model finds it (the first
          ``eos_token_id``; the largest id for the early configs whose ``eos_token_id`` is 2);
        * CLIP's vision tower: 0, the class token;
        * SigLIP's text tower: the last position, n - 1;
        * SigLIP's vision tower: float (B, n), the attention of its pooling head's probe over the
          patches, heads averaged (rows summing to 1): the pooled vector reads the patches
          through that attention alone, so a method's row for it is this mix of the patches' rows.

        Example::

            >>> import torch
            >>> from transformers import CLIPConfig, CLIPModel
            >>> small = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
            >>> model = CLIPModel(CLIPConfig(text_config=dict(small, vocab_size=50, eos_token_id=49, bos_token_id=0),
            ...     vision_config=dict(small, image_size=16, patch_size=8), projection_dim=8))
            >>> similarity = ImageTextSimilarity(model, image=torch.rand(1, 3, 16, 16))  # explains texts
            >>> similarity.pooled_position(torch.tensor([[0, 5, 49, 1], [0, 49, 1, 1]]))
            tensor([2, 1])
        """
        if self.side == "image":
            pixels = self._checked_pixels(inputs)
            if self.model_type == "clip":
                return torch.zeros(pixels.shape[0], dtype=torch.long, device=pixels.device)
            return self._probe_weights(pixels)
        ids, _ = self._checked_text(inputs, attention_mask)
        if self.model_type == "siglip":
            return torch.full((ids.shape[0],), ids.shape[1] - 1, dtype=torch.long, device=ids.device)
        eos = self.tower.config.eos_token_id
        return (ids.argmax(-1) if eos == 2 else (ids == eos).int().argmax(-1)).long()

    def _pooled(self, inputs: Any, attention_mask: Tensor | None) -> Tensor:
        """(B, D) the explained tower's pooled output."""
        if self.side == "image":
            if attention_mask is not None:
                raise ValueError("attention_mask was given with images: images have no padding, drop it.")
            return self.tower(pixel_values=self._checked_pixels(inputs)).pooler_output
        ids, mask = self._checked_text(inputs, attention_mask)
        return self.tower(input_ids=ids, attention_mask=mask).pooler_output

    def _checked_text(self, inputs: Any, attention_mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """``(token ids (B, n), mask)``, refusing a mask the tower cannot be explained with: padding
        marked for SigLIP, which reads it as text; left padding for CLIP, whose positions would then
        count the padding in the model's forward but not where the methods run the tower alone
        (real tokens first)."""
        ids, mask = _text_inputs(inputs, attention_mask, "inputs")
        if mask is None or bool(torch.as_tensor(mask).bool().all()):
            return ids, mask
        if self.model_type == "siglip":
            raise ValueError(
                "SigLIP reads its texts padded to a fixed length without a mask and pools the last position, padding "
                "included: pass no attention_mask (tokenize with padding='max_length', as the model was trained)."
            )
        if real_tokens_first(torch.as_tensor(mask)) is not None:
            raise ValueError(
                "the texts are padded on the left; pad them on the right (the CLIP tokenizer's default, "
                "tokenizer.padding_side = 'right')."
            )
        return ids, mask

    def _checked_pixels(self, inputs: Any) -> Tensor:
        pixels = _pixel_values(inputs, "inputs")
        channels = self.tower.config.num_channels
        if pixels.shape[1] != channels:
            raise ValueError(f"inputs have {pixels.shape[1]} channels but the vision tower takes {channels}: (B, {channels}, H, W).")
        return pixels

    def _probe_weights(self, pixels: Tensor) -> Tensor:
        """(B, n) SigLIP's pooling-head attention over the patches, heads averaged."""
        head = self.tower.head
        with torch.no_grad(), unchanged(self.tower):
            hidden = self.tower(pixel_values=pixels).last_hidden_state
            probe = head.probe.expand(hidden.shape[0], -1, -1)
            _, weights = head.attention(probe, hidden, hidden, need_weights=True, average_attn_weights=True)
        return weights[:, 0].float()


def _text_inputs(text: Any, attention_mask: Tensor | None, name: str) -> tuple[Tensor, Tensor | None]:
    """``(token ids (B, n), mask or None)`` from ids or a tokenizer's output."""
    if isinstance(text, Mapping):
        if "input_ids" not in text:
            raise ValueError(f"{name} is a mapping with keys {list(text)} but no 'input_ids'; pass the tokenizer's output.")
        if attention_mask is not None and text.get("attention_mask") is not None:
            raise ValueError(f"the attention mask of {name} was given twice, in the mapping and as attention_mask=; pass it once.")
        text, attention_mask = text["input_ids"], text.get("attention_mask", attention_mask)
    if not isinstance(text, Tensor) or text.dim() != 2 or text.dtype.is_floating_point or text.dtype == torch.bool:
        found = f"a {text.dtype} tensor of shape {tuple(text.shape)}" if isinstance(text, Tensor) else type(text).__name__
        raise TypeError(f"{name} must be texts as integer token ids (B, n) or the tokenizer's output, got {found}.")
    return text, attention_mask


def _pixel_values(image: Any, name: str) -> Tensor:
    """Pixel values (B, C, H, W) from a tensor or a processor's output."""
    if isinstance(image, Mapping):
        if "pixel_values" not in image:
            raise ValueError(
                f"{name} is a mapping with keys {list(image)} but no 'pixel_values'; pass the image processor's output "
                "(processor(images=..., return_tensors='pt')) or the pixel values themselves."
            )
        image = image["pixel_values"]
    if not isinstance(image, Tensor) or image.dim() != 4 or not image.dtype.is_floating_point:
        found = f"a {image.dtype} tensor of shape {tuple(image.shape)}" if isinstance(image, Tensor) else type(image).__name__
        raise TypeError(f"{name} must be images as float pixel values (B, C, H, W) or the processor's output, got {found}.")
    return image
