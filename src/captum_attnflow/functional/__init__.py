"""Pure tensor functions: the maths of raw attention, attention rollout, attention flow, gradient-weighted
rollout and the decompositions of the attention block (:mod:`~captum_attnflow.functional.decomposition`).

No models, no Captum, no plotting: importing this package loads torch and numpy only; numba comes
with the first call of a CPU kernel (:mod:`~captum_attnflow.functional.compiled`).
"""

from captum_attnflow.functional.flow import flow
from captum_attnflow.functional.gradient_rollout import gradient_weighted_rollout
from captum_attnflow.functional.graph import AttentionGraph, attention_graph
from captum_attnflow.functional.mixing import add_residual, fuse_heads
from captum_attnflow.functional.raw_attention import raw_attention
from captum_attnflow.functional.rollout import rollout, rollout_rows

__all__ = [
    "AttentionGraph",
    "add_residual",
    "attention_graph",
    "flow",
    "fuse_heads",
    "gradient_weighted_rollout",
    "raw_attention",
    "rollout",
    "rollout_rows",
]
