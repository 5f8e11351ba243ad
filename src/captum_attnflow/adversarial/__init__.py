"""Is attention the only path? Distances between attentions and predictions (Jain & Wallace 2019,
Wiegreffe & Pinter 2019, Yang): the metrics, global and per-instance adversaries, probing
classifiers and what they mean for rollout and flow; :func:`run_study` runs it all."""

from captum_attnflow.adversarial.attributions import attribution_table
from captum_attnflow.adversarial.global_adversarial import ModelComparison, adversarial_models, compare_models
from captum_attnflow.adversarial.metrics import jsd, kl, tvd
from captum_attnflow.adversarial.per_instance import PerInstanceResult, per_instance_adversary
from captum_attnflow.adversarial.probing import probe_score
from captum_attnflow.adversarial.study import StudyResult, run_study
from captum_attnflow.adversarial.tasks import Task, agreement_task, chunking_task
from captum_attnflow.adversarial.training import stored_attention, train, uniform_attention

__all__ = [
    "ModelComparison",
    "PerInstanceResult",
    "StudyResult",
    "Task",
    "adversarial_models",
    "agreement_task",
    "attribution_table",
    "chunking_task",
    "compare_models",
    "jsd",
    "kl",
    "per_instance_adversary",
    "probe_score",
    "run_study",
    "stored_attention",
    "train",
    "tvd",
    "uniform_attention",
]
