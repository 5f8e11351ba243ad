"""Captum attributions built on attention maps and on what the attention layers read and write."""

from captum_attnflow.attr.alti import ALTI
from captum_attnflow.attr.attention_norm import AttentionNorm
from captum_attnflow.attr.attnlrp import AttnLRP
from captum_attnflow.attr.flow import AttentionFlow
from captum_attnflow.attr.gradient_rollout import GradientWeightedRollout
from captum_attnflow.attr.raw_attention import RawAttention
from captum_attnflow.attr.rollout import AttentionRollout
from captum_attnflow.attr.value_zeroing import ValueZeroing

__all__ = ["ALTI", "AttnLRP", "AttentionFlow", "AttentionNorm", "AttentionRollout", "GradientWeightedRollout", "RawAttention", "ValueZeroing"]
from captum_attnflow.attr.llm import LLMAttentionAttribution, LLMAttentionAttributionResult  # noqa: E402

__all__ += ["LLMAttentionAttribution", "LLMAttentionAttributionResult"]
