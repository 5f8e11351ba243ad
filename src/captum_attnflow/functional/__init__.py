"""Pure tensor functions: the maths of attention rollout and attention flow, no models, no Captum."""

from captum_attnflow.functional.flow import flow
from captum_attnflow.functional.graph import add_residual, attention_graph, fuse_heads
from captum_attnflow.functional.rollout import rollout, rollout_rows

__all__ = ["add_residual", "attention_graph", "flow", "fuse_heads", "rollout", "rollout_rows"]
