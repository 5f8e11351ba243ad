"""Captum attributions built on attention maps."""

from captum_attnflow.attr.flow import AttentionFlow
from captum_attnflow.attr.raw_attention import RawAttention
from captum_attnflow.attr.rollout import AttentionRollout

__all__ = ["AttentionFlow", "AttentionRollout", "RawAttention"]
from captum_attnflow.attr.llm import LLMAttentionAttribution, LLMAttentionAttributionResult  # noqa: E402

__all__ += ["LLMAttentionAttribution", "LLMAttentionAttributionResult"]
