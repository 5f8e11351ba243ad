"""The machinery that captures what a model's forward computes, built on the model boundary
(:mod:`captum_attnflow.hf`).

Attention maps stored from eager attention (:mod:`.maps`) or the lean per-layer capture of
queries and keys (:mod:`.lean`) and the head-fused blocks recomputed from them
(:mod:`.lean_blocks`, on a GPU in the Triton kernels of :mod:`.lean_triton`), per-head
probabilities in row blocks for the decompositions (:mod:`.lean_heads`), the internals the
gradient and decomposition methods read (:mod:`.internals`, :mod:`.attention_gradients`,
:mod:`.decomposition`, an encoder-decoder's :mod:`.seq2seq_decomposition`), AttnLRP's rules as
the model's backward pass (:mod:`.lrp`, :mod:`.lrp_rules`, on an encoder-decoder
:mod:`.seq2seq_lrp`), a given attention put into a model (:mod:`.attention_injection`),
encoder-decoder attentions (:mod:`.seq2seq`) and the families x methods table of the docs
(:mod:`.support`). The other packages use the names exported here.
"""

from captum_attnflow.capture.attention_injection import inject_attention
from captum_attnflow.capture.lrp import LRPRun, attnlrp_forward
from captum_attnflow.capture.maps import attentions_of, capture_graph, extract_attentions
from captum_attnflow.capture.seq2seq import Seq2SeqAttentions, seq2seq_attentions, seq2seq_gradient_internals
from captum_attnflow.capture.seq2seq_lrp import seq2seq_attnlrp_forward

__all__ = [
    "LRPRun",
    "Seq2SeqAttentions",
    "attentions_of",
    "attnlrp_forward",
    "capture_graph",
    "extract_attentions",
    "inject_attention",
    "seq2seq_attentions",
    "seq2seq_attnlrp_forward",
    "seq2seq_gradient_internals",
]
