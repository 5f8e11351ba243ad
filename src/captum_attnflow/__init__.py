"""captum_attnflow: attention rollout and attention flow (Abnar & Zuidema, ACL 2020) as Captum attributions.

The names below load on first use (PEP 562): ``import captum_attnflow.functional`` stays free of
transformers, Captum and matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "ALTI": "captum_attnflow.attr",
    "AttentionFlow": "captum_attnflow.attr",
    "AttentionNorm": "captum_attnflow.attr",
    "AttnLRP": "captum_attnflow.attr",
    "ExplanationResult": "captum_attnflow.explanation",
    "aggregate_words": "captum_attnflow.words",
    "context_prompt": "captum_attnflow.data",
    "GradientWeightedRollout": "captum_attnflow.attr",
    "ImageTextSimilarity": "captum_attnflow.hf",
    "ValueZeroing": "captum_attnflow.attr",
    "AttentionRollout": "captum_attnflow.attr",
    "LLMAttentionAttribution": "captum_attnflow.attr",
    "RawAttention": "captum_attnflow.attr",
    "eager_attention": "captum_attnflow.hf",
    "extract_attentions": "captum_attnflow.capture",
    "load_agreement_lm": "captum_attnflow.models",
    "load_agreement_model": "captum_attnflow.models",
    "load_retrieval_model": "captum_attnflow.models",
    "split_sources": "captum_attnflow.data",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'captum_attnflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
