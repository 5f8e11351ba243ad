"""Getting attention maps out of Hugging Face models or user callables (public home of
:func:`extract_attentions` and :func:`eager_attention`; they live in :mod:`captum_attnflow.hf`)."""

from captum_attnflow.hf import eager_attention, extract_attentions

__all__ = ["eager_attention", "extract_attentions"]
