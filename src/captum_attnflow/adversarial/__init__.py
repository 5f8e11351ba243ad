"""Is attention the only path? Distances between attentions and predictions (Jain & Wallace 2019,
Wiegreffe & Pinter 2019, Yang): the metrics, adversarial training, probing and what they mean
for rollout and flow."""

from captum_attnflow.adversarial.metrics import jsd, kl, tvd

__all__ = ["jsd", "kl", "tvd"]
