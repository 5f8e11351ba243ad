"""Captum attributions built on attention maps."""

from captum_attnflow.attr.raw_attention import RawAttention
from captum_attnflow.attr.rollout import AttentionRollout

__all__ = ["AttentionRollout", "RawAttention"]
