"""Probing classifiers (Yang section 4.3): a fresh tagger trained with a stored attention in place of its own.

The probe has the original's architecture and a new initialisation; in every layer its
attention probabilities are replaced by the ones a source model computed on the same
sentence (the original's, an adversary's, or uniform ones), while all its weights (the
query, key and value projections included, as in Yang) train. If an attention carries the
information the task needs, the probe built on it tags well.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from captum_attnflow.adversarial.tasks import AttentionSource, Task
from captum_attnflow.adversarial.training import train


def probe_score(
    make_model: Callable[[], nn.Module], task: Task, attention: AttentionSource, steps: int, lr: float = 1e-3,
    seed: int = 0, progress: bool = True, desc: str = "probe",
) -> float:
    """Test score (chunk F1) of a probe trained ``steps`` steps with ``attention`` injected in every layer.

    Args:
        make_model: builds the untrained probe (same architecture as the source model).
        task: the task.
        attention: the stored attention, e.g.
            :func:`~captum_attnflow.adversarial.training.stored_attention` of a model, or
            :func:`~captum_attnflow.adversarial.training.uniform_attention`.
        steps, lr, seed, progress, desc: as :func:`~captum_attnflow.adversarial.training.train`.

    Returns:
        float: the probe's test score, with the same attention injected.

    Example::

        >>> from captum_attnflow.adversarial.tasks import chunking_task
        >>> from captum_attnflow.adversarial.training import uniform_attention
        >>> from captum_attnflow.models.tagger import TaggerModel, yang_tagger_config
        >>> task = chunking_task(train_examples=64, test_examples=32)
        >>> 0 <= probe_score(lambda: TaggerModel(yang_tagger_config()), task, uniform_attention, 5, progress=False) <= 1
        True
    """
    torch.manual_seed(seed)
    model = train(make_model(), task, steps, lr, seed, attention=attention, progress=progress, desc=desc)
    return task.score(model, attention)
