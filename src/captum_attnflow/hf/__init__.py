"""The model boundary: everything that touches a Hugging Face model (or a module wrapping one).

Attention capture and the eager switch, padding order, class scores, input embeddings, token-id
and device checks, and leaving the model exactly as it was (attention implementation, mode,
hooks; one call at a time per model). The other packages use the names exported here, never
this package's modules directly.
"""

from captum_attnflow.hf.attention_injection import inject_attention
from captum_attnflow.hf.capture import attentions_of, capture_graph, extract_attentions
from captum_attnflow.hf.inputs import (
    as_tuple,
    check_mask_not_in_args,
    check_token_ids,
    lift_mask,
    unpack_inputs,
    warn_unmasked_padding,
)
from captum_attnflow.hf.lrp import LRPRun, attnlrp_forward
from captum_attnflow.hf.models import check_device, hf_models, input_device, main_model, outermost, owning_module
from captum_attnflow.hf.placement import DEVICE_MAPS, DTYPES, load_pretrained, resolve_device, resolve_dtype
from captum_attnflow.hf.seq2seq import Seq2SeqAttentions, seq2seq_attentions, seq2seq_gradient_internals
from captum_attnflow.hf.scores import ScoreForward, class_scores, input_embeddings, output_scores, target_indices, target_scores, token_id
from captum_attnflow.hf.similarity import ImageTextSimilarity
from captum_attnflow.hf.state import eager_attention, exclusive, hooks_restored, implementation, model_call, unchanged

__all__ = [
    "DEVICE_MAPS",
    "DTYPES",
    "ImageTextSimilarity",
    "LRPRun",
    "ScoreForward",
    "Seq2SeqAttentions",
    "as_tuple",
    "attentions_of",
    "attnlrp_forward",
    "capture_graph",
    "check_device",
    "check_mask_not_in_args",
    "check_token_ids",
    "class_scores",
    "eager_attention",
    "exclusive",
    "extract_attentions",
    "hf_models",
    "hooks_restored",
    "implementation",
    "inject_attention",
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
    "seq2seq_attentions",
    "seq2seq_gradient_internals",
    "target_indices",
    "target_scores",
    "token_id",
    "unchanged",
    "unpack_inputs",
    "warn_unmasked_padding",
]
