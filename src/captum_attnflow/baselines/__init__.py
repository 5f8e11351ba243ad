"""Token-level baselines built on Captum: one score per input token, same call shape as the
attention methods (``inputs`` = token ids (B, n) -> (B, n))."""

from captum_attnflow.baselines.blank_out import BlankOut
from captum_attnflow.baselines.input_x_gradient import TokenInputXGradient
from captum_attnflow.baselines.integrated_gradients import TokenIntegratedGradients
from captum_attnflow.baselines.saliency import TokenSaliency

__all__ = ["BlankOut", "TokenInputXGradient", "TokenIntegratedGradients", "TokenSaliency"]
