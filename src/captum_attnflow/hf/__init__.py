"""The model boundary: what a Hugging Face model is and how it is called, whatever is explained.

The one table of architectures (where each family keeps its norms, projections and score
terms), the models inside a module, their devices and dtypes (placement, accelerate's
dispatch), token-id and padding checks, class and output scores, input embeddings, a CLIP or
SigLIP model's image-text similarity, and leaving the model exactly as it was (attention
implementation, mode, hooks; one call at a time per model). What a forward computes inside the
model is captured by :mod:`captum_attnflow.capture`, built on this package. The other packages
use the names exported here.
"""

from captum_attnflow.hf.inputs import (
    as_tuple,
    check_mask_not_in_args,
    check_token_ids,
    lift_mask,
    unpack_inputs,
    warn_unmasked_padding,
)
from captum_attnflow.hf.models import check_device, hf_models, input_device, main_model, outermost, owning_module
from captum_attnflow.hf.placement import DEVICE_MAPS, DTYPES, load_pretrained, resolve_device, resolve_dtype
from captum_attnflow.hf.scores import (
    ScoreForward,
    class_scores,
    input_embeddings,
    output_scores,
    target_indices,
    target_scores,
    token_id,
)
from captum_attnflow.hf.similarity import ImageTextSimilarity
from captum_attnflow.hf.state import eager_attention, exclusive, hooks_restored, implementation, model_call, unchanged

__all__ = [
    "DEVICE_MAPS",
    "DTYPES",
    "ImageTextSimilarity",
    "ScoreForward",
    "as_tuple",
    "check_device",
    "check_mask_not_in_args",
    "check_token_ids",
    "class_scores",
    "eager_attention",
    "exclusive",
    "hf_models",
    "hooks_restored",
    "implementation",
    "input_device",
    "input_embeddings",
    "lift_mask",
    "load_pretrained",
    "main_model",
    "model_call",
    "outermost",
    "output_scores",
    "owning_module",
    "resolve_device",
    "resolve_dtype",
    "target_indices",
    "target_scores",
    "token_id",
    "unchanged",
    "unpack_inputs",
    "warn_unmasked_padding",
]
