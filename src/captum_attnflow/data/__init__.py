"""Subject-verb number agreement data (paper, section 2): a seeded generator and a word-level tokenizer."""

from captum_attnflow.data.agreement import AgreementExample, generate_examples, is_held_out, vocabulary
from captum_attnflow.data.tokenizer import build_tokenizer, encode_examples

__all__ = ["AgreementExample", "build_tokenizer", "encode_examples", "generate_examples", "is_held_out", "vocabulary"]
