"""Subject-verb number agreement data (paper, section 2): a seeded generator and a word-level tokenizer;
the same sentences with gold chunk tags for sequence tagging; a context split into sources, and the
prompt of a context and a question with those sources as its values; retrieval prompts (facts, then a
question one of them answers) and their tokenizer."""

from captum_attnflow.data.agreement import AgreementExample, generate_examples, is_held_out, vocabulary
from captum_attnflow.data.chunking import CHUNK_TAGS, ChunkedExample, chunk_f1, chunk_spans, encode_chunked, generate_chunked_examples
from captum_attnflow.data.retrieval import RetrievalExample, ask, build_retrieval_tokenizer, retrieval_examples
from captum_attnflow.data.sources import context_prompt, split_sources
from captum_attnflow.data.tokenizer import build_tokenizer, encode_examples

__all__ = ["AgreementExample", "build_tokenizer", "encode_examples", "generate_examples", "is_held_out", "vocabulary"]
__all__ += ["CHUNK_TAGS", "ChunkedExample", "chunk_f1", "chunk_spans", "encode_chunked", "generate_chunked_examples"]
__all__ += ["context_prompt", "split_sources"]
__all__ += ["RetrievalExample", "ask", "build_retrieval_tokenizer", "retrieval_examples"]
