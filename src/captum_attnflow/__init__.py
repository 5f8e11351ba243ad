"""captum_attnflow: attention rollout and attention flow (Abnar & Zuidema, ACL 2020) as Captum attributions."""

from captum_attnflow.attr import AttentionFlow, AttentionRollout, LLMAttentionAttribution, RawAttention
from captum_attnflow.extraction import eager_attention, extract_attentions
from captum_attnflow.models import load_agreement_lm, load_agreement_model

__version__ = "0.1.0"

__all__ = [
    "AttentionFlow",
    "AttentionRollout",
    "LLMAttentionAttribution",
    "RawAttention",
    "eager_attention",
    "extract_attentions",
    "load_agreement_lm",
    "load_agreement_model",
]
